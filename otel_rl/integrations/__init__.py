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

from otel_rl._lazy import lazy_attributes

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
    "AReaLWorkflowInstrumentor": "areal_workflow",
}


__getattr__, __dir__ = lazy_attributes(__name__, {name: f"{__name__}.{module}" for name, module in INSTRUMENTORS.items()})
