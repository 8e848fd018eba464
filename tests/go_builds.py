"""The collector and Jaeger that the stack builds from Go modules, for the tests that run them.

A user's machine may have no Go: those tests skip there, saying why, unless a build is already
cached (``~/.cache/otel-rl/stack/go``). CI sets ``OTEL_RL_REQUIRE_GO=1``: there they run, and fail
loudly if Go is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from otel_rl.stack import default_cache_dir
from otel_rl.stack._go_build import COLLECTOR_MANIFEST, GO_MISSING, CollectorManifest, GoBuilder, find_go

REPO = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("OTEL_RL_REQUIRE_GO", "") not in ("", "0")


def _builder() -> GoBuilder:
    return GoBuilder(default_cache_dir(), default_cache_dir() / "logs", lambda: sys.stderr)


def require_go_built() -> None:
    """Skip the calling test unless Go is here (or both builds are cached); never skip when REQUIRED."""
    if REQUIRED or find_go() is not None:
        return
    builder = _builder()
    if builder.collector_path(CollectorManifest.load(REPO / COLLECTOR_MANIFEST)).exists() and builder.jaeger_path().exists():
        return
    pytest.skip(f"the collector and Jaeger are built from Go modules, and {GO_MISSING}")


def collector_binary() -> Path:
    """The collector built from collector-config/builder-config.yaml (built now if not cached; skips without Go)."""
    require_go_built()
    return _builder().collector(CollectorManifest.load(REPO / COLLECTOR_MANIFEST))


def jaeger_binary() -> Path:
    """Jaeger v2 built from its Go module (built now if not cached; skips without Go)."""
    require_go_built()
    return _builder().jaeger()
