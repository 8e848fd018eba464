"""The tracker bridge: OTLP/HTTP in, experiment trackers out (``otel-rl bridge --config FILE``).

One collector feeds the trackers of a whole cluster, so no rank needs tracker credentials: the
collector's logs pipeline posts the ``rl.log`` step events here (``/v1/logs``), and each event
becomes one ``tracker.log(values, step)`` call through the same :class:`TrackerFanout` that
``otel_rl.init(track_with=...)`` uses in-process (``rl.hparams`` becomes ``log_hparams``).

Receives OTLP/HTTP protobuf (and OTLP/JSON) on ``POST /v1/logs`` and ``/v1/metrics``, gzip or
deflate compressed or not; ``/v1/traces`` is answered with an empty success so a collector that
points every signal here does not retry. ``GET /healthz`` says ``ok``; ``GET /stats`` gives the
counters as JSON. Answers are OTLP's: the ``Export*ServiceResponse`` message in the request's
encoding, 400 with a ``google.rpc.Status`` for a body that does not decode (counted, never
fatal), 503 with ``Retry-After`` when the queue of received requests is full (a slow tracker
slows the senders down instead of growing memory), 413 / 415 for oversized bodies and unknown
encodings.

Per-run splitting (``split_runs``, default on): every resource ``(service.name, rl.run.id)`` gets
its own trackers, opened at its first event: ``run_dir`` is ``<base_dir>/<run id>``, the run
name is ``<run_name or rl.experiment.name or service.name>-<run id>``, and in ``tracker_kwargs``
folder settings (``log_dir``, ``logdir``, ``dir``, ``save_dir``, ``output_dir``) get a
``/<run id>`` sub-folder, file settings (``path``, ``file``) a ``-<run id>`` before the suffix,
and run-name settings (wandb ``name``, swanlab ``experiment_name``, mlflow ``run_name``) a
``-<run id>``. Two runs never write into the same TensorBoard folder or jsonl file. With
``ranks`` other than rank 0 accepted, each further rank is a run of its own (``<run id>-rank<N>``).

Metrics where events are absent: a run whose metrics arrive here but none of its ``rl.log``
events (a metrics-only pipeline) still reaches its trackers. Each metrics export of such a run
becomes one step: every gauge and sum data point keyed by registry name and attributes, as
``tracker_keys: registry`` names them (``rl.loss{rl.loss.type="kl",rl.model.role="actor"}``),
at the step of the latest ``rl.progress.step`` value the run sent, else at the run's export
count (1, 2, ...). Histograms are left out. The first ``metrics_fallback_after`` exports (3) are
held back: a run whose first event arrives in that window is an events run, and its metrics are
ignored from then on; what is held back is written at shutdown if no event ever came.

Lifecycle: one worker thread drives all trackers (a tracker is used by one thread at a time);
a run that sends nothing for ``run_idle_timeout_s`` (ten minutes) has its trackers finished (so W&B
shows it finished), and reopened if it sends again; at most ``max_open_runs`` (32) runs have open
trackers, the least recently used is finished first (and reopened if it sends again, no step lost); SIGTERM, SIGINT and
:meth:`TrackerBridge.close` stop accepting, deliver what was accepted, and flush and finish every
tracker. Secrets in ``tracker_kwargs`` are redacted in every line printed.

Limits: see :mod:`otel_rl.bridge.server`. Senders that reset their connection or stall mid-body
are counted (``client_disconnects``) and summed up in one log line at most once a minute.

The parts: ``config`` (the YAML settings), ``server`` (the bridge and its worker), ``handler``
(HTTP), ``admission`` (request slots shared by address), ``intake`` (counters and the request
queue), ``request_decode`` / ``limits`` / ``json_scan`` (bodies counted, then decoded),
``disconnects`` (senders that leave), ``runs`` (each run's trackers and the delivery to them),
``decode`` (values out of OTLP messages) and ``tracker_settings`` (per-run tracker settings,
secrets masked); this module holds the command.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path

from otel_rl.bridge.allocator import give_large_buffers_back
from otel_rl.bridge.config import DEFAULT_BASE_DIR, DEFAULT_LISTEN, BridgeConfig, load_bridge_config, parse_listen
from otel_rl.bridge.server import TrackerBridge
from otel_rl.bridge.tracker_settings import per_run_tracker_kwargs

__all__ = [
    "CLI_DESCRIPTION",
    "CLI_EPILOG",
    "DEFAULT_BASE_DIR",
    "DEFAULT_LISTEN",
    "BridgeConfig",
    "TrackerBridge",
    "load_bridge_config",
    "parse_listen",
    "per_run_tracker_kwargs",
    "run_bridge",
]


# ---- the command -------------------------------------------------------------------------------

CLI_DESCRIPTION = """\
The tracker bridge: receive OTLP/HTTP from a collector and feed experiment trackers, so one
collector feeds the trackers of a whole cluster without tracker credentials on any rank.

Every rl.log event (one per training step, with the exact key -> value map) becomes one
tracker.log(values, step) call; rl.hparams becomes the tracker's config. Listens for OTLP/HTTP
protobuf or JSON on POST /v1/logs and /v1/metrics (/v1/traces is accepted and dropped), health
on GET /healthz, counters on GET /stats. SIGTERM or Ctrl-C flushes and finishes every tracker.

The config file (YAML) takes track_with and tracker_kwargs exactly as otel_rl.init and ROLL's
YAML do, and:
  listen                  HOST:PORT to listen on (default 127.0.0.1:4319; 0.0.0.0:4319 for a
                          collector on another host: plain HTTP, so on a network only the
                          collector reaches, and with a token)
                          OTEL_RL_BRIDGE_TOKEN (environment variable, not a key): when set, every
                          POST and GET /stats need "Authorization: Bearer <token>" (else 401; compared in
                          constant time, never printed); the collector's otlphttp exporter sends
                          it with headers: {Authorization: "Bearer ${env:OTEL_RL_BRIDGE_TOKEN}"};
                          a bridge listening beyond loopback without it warns at start
  tracker_keys            original (keys as logged, default) or registry (registry metric names,
                          rl.loss{rl.loss.type="kl",...})
  ranks                   0 (default: rank 0's events only, as the frameworks log), a list of
                          ranks, or all (with split_runs, each further rank is a run of its own:
                          <run id>-rank<N>)
  split_runs              true (default): one tracker set per (service.name, rl.run.id), opened at
                          the run's first event, run_dir <base_dir>/<run id>, the run id appended
                          to the run name, to folder settings (log_dir, logdir, dir, save_dir,
                          output_dir: <dir>/<run id>) and to file settings (path, file:
                          name-<run id>.ext), so two runs never share a TensorBoard folder;
                          false: every run into one tracker set
  base_dir                where per-run folders go (default otel-rl-bridge, relative to the
                          working directory)
  run_name                run name prefix (default: rl.experiment.name, else service.name)
  run_idle_timeout_s      finish a run's trackers after this many seconds without data (default
                          600; 0: only at exit), so a finished run shows as finished in W&B;
                          reopened (same folders and names) if it sends again
  max_open_runs           runs with open trackers at once (default 32; each holds threads and
                          files): the least recently used is finished first, reopened if it sends
  max_requests_in_flight  requests read and decoded at once (default 4); beyond it 429 with
                          Retry-After. Bodies are counted before they are decoded: over 2,000,000
                          messages, 10,000 resources, 200,000 log records or 500,000 data points
                          (or 20 MiB on the wire or inflated, as the collector's own receiver; 8 MiB
                          for JSON; for JSON also over 1,000,000 values
                          of any kind or nested over 128 deep) is 413: the sender splits its batch
  max_requests_per_client requests one address may have in progress, waiting for a slot included
                          (default half of max_requests_in_flight); beyond it 429. A freed slot goes
                          to the address holding the fewest, so one flooding host cannot starve others;
                          when a request waits 0.5 s, the slowest body in progress (under 1 MiB/s)
                          of an address holding more slots is cut off for it (408)
  body_timeout_s          a request body that stops arriving for this many seconds (default 5), or
                          arrives slower than that plus 1 s per 64 KiB, is answered 408 and its
                          connection closed
  max_runs                runs the bridge takes on, each with its own tracker folders (default 256);
                          a request of a further new run id is answered 507 with the reason
                          (requests_over_max_runs in /stats); a run idle for run_idle_timeout_s
                          gives its place back (runs_given_back); nothing is deleted
  max_run_mb              what one run may hand its trackers, in MiB of OTLP-encoded events (default
                          1024); a request that would take it past is answered 507 with the reason.
                          The disk the bridge fills is bounded by max_runs x max_run_mb
  max_record_kb           one event's size (default 1024): a larger one is skipped and counted
                          (records_bad); a step's values or a sample is never megabytes
  max_connections         open connections, each holding a thread (default 256); when all are
                          taken, the longest idle connection of the address holding the most
                          gives way to a new one from an address holding fewer
  max_connections_per_client  of those, from one address (default 64); beyond, closed at once
  imports                 modules to import first, e.g. [my_pkg.trackers]: third-party trackers
                          registered there with otel_rl.register_tracker can be named in track_with
  max_queue_mb            received requests held for the trackers (default 32); beyond it the
                          bridge answers 503 with Retry-After and the collector retries
  metrics_fallback        true (default): a run that sends metrics but no rl.log events (a
                          metrics-only pipeline) gets each export's gauge and sum values, named
                          rl.loss{rl.loss.type="kl",...}, at the step of its latest rl.progress.step
                          value, else at its export count (1, 2, ...); the first
                          metrics_fallback_after (3) exports wait in case events follow
"""

CLI_EPILOG = """\
example (bridge.yaml):
  listen: 127.0.0.1:4319
  track_with: [tensorboard, wandb]
  tracker_kwargs:
    tensorboard: {log_dir: /data/tb}          # runs land in /data/tb/<run id>
    wandb: {project: grpo-7b, api_key: ...}   # the key lives here only; never printed
  tracker_keys: original
  ranks: 0
  split_runs: true

  otel-rl bridge --config bridge.yaml
  otel-rl stack up --bridge-config bridge.yaml    the local stack: the gateway's rl.* events go to the bridge

Collector route: otelcol-contrib with collector-config/otelcol/gateway-bridge.yaml
(OTEL_RL_BRIDGE_ENDPOINT=http://HOST:4319; it posts to /v1/logs). Relative paths are relative
to the working directory (under otel-rl stack: the config file's folder).
"""


def run_bridge(config_path: str | Path, *, listen: str | None = None, base_dir: str | None = None, verbose: bool = False) -> int:
    """``otel-rl bridge``: serve until SIGTERM or SIGINT, then flush and finish every tracker."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO if verbose else logging.WARNING, format="otel-rl bridge: %(levelname)s: %(message)s"
    )
    give_large_buffers_back()  # before any thread: the server's threads share two arenas
    try:
        config = load_bridge_config(config_path)
        if listen:
            parse_listen(listen, "--listen")
            config = dataclasses.replace(config, listen=listen)
        if base_dir:
            config = dataclasses.replace(config, base_dir=base_dir)
        bridge = TrackerBridge(config)
    except (OSError, ValueError, TypeError, ImportError) as exc:  # messages name keys, never values
        print(f"otel-rl bridge: {exc}", file=sys.stderr)
        return 2
    return _serve(bridge)


def _serve(bridge: TrackerBridge) -> int:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            bridge.start()
        except OSError as exc:  # e.g. the port is taken
            print(f"otel-rl bridge: cannot listen on {bridge.config.listen}: {exc}", file=sys.stderr)
            return 1
        try:
            while not stop.wait(0.5):
                pass
        finally:
            bridge.close()  # flushes and finishes every tracker
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
