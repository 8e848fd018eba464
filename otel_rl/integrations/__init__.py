"""Framework adapters, one framework per module (ROLL, verl, TRL, ms-swift, OpenRLHF, Ray), one protocol.

Each module has an instrumentor on the model of OpenTelemetry's ``BaseInstrumentor``
(:mod:`otel_rl.integrations.base`)::

    from otel_rl.integrations import TrlInstrumentor

    TrlInstrumentor().instrument()    # checks the installed TRL's version, hooks otel-rl in
    TrlInstrumentor().uninstrument()  # and takes it out again

Each module imports its framework at first use and fails with the pip extra to install; the
names below are imported from their module on first access, so this package imports none.
Importing ``verl``, ``roll`` or ``swift`` instruments that framework (its plugin loader relies on it).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
INSTRUMENTORS = {
    "RayInstrumentor": "ray",
    "RollInstrumentor": "roll",
    "SwiftInstrumentor": "swift",
    "TrlInstrumentor": "trl",
    "VerlInstrumentor": "verl",
    "VerlAgentLoopInstrumentor": "verl_agent_loop",
    "OpenRLHFInstrumentor": "openrlhf",
    "OpenRLHFAgentInstrumentor": "openrlhf_agent",
    "AReaLInstrumentor": "areal",
}


def __getattr__(name: str) -> Any:
    module = INSTRUMENTORS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *INSTRUMENTORS])
