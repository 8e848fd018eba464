"""Spans: the step, stage and phase scopes (``scopes``), spans recorded on the caller's thread and
built by the worker (``light_spans``), W3C trace-context propagation across processes
(``propagation``), and agent trajectories: recorded on the caller (``trajectories``), decided at
the step's end (``trajectory_sampling``), built as spans (``trajectory_spans``). May import
``settings``, ``sources``, ``pipeline`` and ``export``.
"""
