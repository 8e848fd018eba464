"""Unknown ``OTEL_RL_*`` names in the environment.

A misspelt variable (an ``S`` missing, a word swapped) would otherwise be ignored without a word
and the run would use the default; ``resolve_config`` warns once per unknown name, with the closest
known one. The value is never printed: a variable may hold a secret.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping

import otel_rl.environment_variables as ENV
from otel_rl.reporting import ReportOnce

PREFIX = "OTEL_RL" + "_"
KNOWN: frozenset[str] = frozenset(v for k, v in vars(ENV).items() if k.startswith(PREFIX) and isinstance(v, str))
_report = ReportOnce(logging.getLogger("otel_rl"))


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """The ``OTEL_RL_*`` names in ``environ`` that otel-rl does not read, sorted."""
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in KNOWN)


def closest_known(name: str) -> str | None:
    """The known variable ``name`` most likely misspells, or None when none is close."""
    matches = difflib.get_close_matches(name, sorted(KNOWN), n=1, cutoff=0.6)
    return matches[0] if matches else None


def warn_unknown_names(environ: Mapping[str, str]) -> None:
    """Warn once per process about each unknown ``OTEL_RL_*`` name; never raises."""
    try:
        for name in unknown_names(environ):
            close = closest_known(name)
            hint = f"; did you mean {close}?" if close else ""
            _report(name, "otel-rl: the environment variable %s is not one otel-rl reads and is ignored%s", name, hint)
    except Exception:  # a strange environ mapping must not stop init()
        pass
