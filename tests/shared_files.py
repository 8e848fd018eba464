"""The real public training logs and design documents beside the project (``../shared``).

A user's clone has no ``../shared``: tests that read it skip there, saying why. CI sets
``OTEL_RL_REQUIRE_SHARED=1`` so that they run (and fail loudly if the folder is missing).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LOGS = SHARED / "logs"
REQUIRED = os.environ.get("OTEL_RL_REQUIRE_SHARED", "") not in ("", "0")

needs_shared_logs = pytest.mark.skipif(
    not LOGS.is_dir() and not REQUIRED, reason=f"the real training logs are not here ({LOGS} is absent: it sits beside the project in CI)"
)

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir() and not REQUIRED,
    reason=f"the design documents and real training logs are not here ({SHARED} is absent: it sits beside the project in CI)",
)

REFERENCE = SHARED / "reference"

needs_shared_reference = pytest.mark.skipif(
    not REFERENCE.is_dir() and not REQUIRED,
    reason=f"the upstream reference files (weaver's JSON schema) are not here ({REFERENCE} is absent: it sits beside the project in CI)",
)
