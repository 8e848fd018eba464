"""Where the local stack keeps its installs, configs, data and PID files: one folder per user.

``OTEL_RL_STACK_DIR`` when set, else ``otel-rl/stack`` in the user's data folder (``$XDG_DATA_HOME``,
default ``~/.local/share``). Not the working directory: ``otel-rl stack status``, ``stack down`` and
``otel-rl replay`` find the stack that ``otel-rl stack up`` started, wherever each is run from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from otel_rl import environment_variables as ENV

__all__ = ["stack_data_dir"]


def stack_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The stack's data folder, resolved (see the module doc)."""
    env = os.environ if environ is None else environ
    explicit = env.get(ENV.OTEL_RL_STACK_DIR)
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = env.get("XDG_DATA_HOME") or str(Path("~/.local/share").expanduser())
    return (Path(base).expanduser() / "otel-rl" / "stack").resolve()
