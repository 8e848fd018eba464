"""The in-process runtime behind the public API, one sub-package per concern. Lowest first (a
sub-package imports only those before it; ``tests/test_layout.py`` holds it):

- ``settings/``: what ``init()`` resolves (arguments, ``OTEL_*`` / ``OTEL_RL_*``, config file), the
  option groups, and the redaction of secrets from URLs and headers;
- ``keys/``: how a logged key becomes a registry metric (framework mappings, rules, unit transforms);
- ``sources/``: what samples the machine or other processes (GPU / process probes, inference
  engines' ``/metrics``, the Prometheus text reader, torch.profiler windows);
- ``otlp/``: OTLP settings as the SDK's variables define them, the SDK exporters built from
  them, and every use of the SDK's private names;
- ``spool/``: the disk spool in front of OTLP (files, delivery, transports, spooling exporters);
- ``pipeline/``: the telemetry worker and what it does to each step (step plans, values,
  aggregation, samples, goodput, refusals, the exit summary);
- ``export/``: the SDK providers every signal leaves through (run folder, OTLP, spool), their
  bounded shutdown, and the run folder's queued exports;
- ``spans/``: step, stage and phase scopes, spans recorded on the caller and built by the worker,
  W3C propagation, and agent trajectories as traces;
- ``lifecycle/``: the process around the run: fork and exit hooks, the run folder's lock, ranks;
- ``telemetry.py``: the ``Telemetry`` facade that wires them together.

Data path: ``init()`` (settings) -> ``Telemetry.log()`` / ``step()`` / ``stage()`` (telemetry,
spans) -> the worker (pipeline, keys) -> the SDK providers (export, spool, otlp) ->
``otel_rl.exporters`` and ``otel_rl.trackers``. Nothing here is public API: ``otel_rl/__init__.py``
re-exports what is.
"""
