"""The tracker bridge: OTLP/HTTP in, experiment trackers out (``otel-rl bridge --config FILE``).

One collector feeds the trackers of a whole cluster, so no rank needs tracker credentials: the
collector's logs pipeline posts the ``rl.log`` step events here (``/v1/logs``), and each event
becomes one ``tracker.log(step, values)`` call through the same :class:`TrackerFanout` that
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
a run that sends nothing for ``run_idle_timeout_s`` (an hour) has its trackers finished (so W&B
shows it finished), and reopened if it sends again; SIGTERM, SIGINT and
:meth:`TrackerBridge.close` stop accepting, deliver what was accepted, and flush and finish every
tracker. Secrets in ``tracker_kwargs`` are redacted in every line printed.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import json
import logging
import math
import re
import signal
import socket
import sys
import threading
import time
import weakref
import zlib
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO


from otel_rl._sdk.config import read_yaml_file
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N
from otel_rl.trackers.base import create_trackers
from otel_rl.trackers.fanout import KEY_STYLES, TrackerFanout, deliver, redact_tracker_kwargs, registry_key_namer

__all__ = [
    "DEFAULT_LISTEN",
    "BridgeConfig",
    "TrackerBridge",
    "load_bridge_config",
    "run_bridge",
]

logger = logging.getLogger("otel_rl.bridge")

DEFAULT_LISTEN = "127.0.0.1:4319"
DEFAULT_BASE_DIR = "otel-rl-bridge"
_STDOUT = object()  # "print to whatever sys.stdout is at the time"

# tracker_kwargs settings that split_runs makes per-run (see the module doc).
_DIR_KEYS = ("log_dir", "logdir", "dir", "save_dir", "output_dir")
_FILE_KEYS = ("path", "file")
_NAME_KEYS: dict[str, tuple[str, ...]] = {"wandb": ("name",), "swanlab": ("experiment_name",), "mlflow": ("run_name",)}
_DEFAULT_NAME_KEYS = ("name", "run_name")

_EVENTS = (N.RL_LOG_EVENT, N.RL_HPARAMS_EVENT)
_MAX_BODY = 64 << 20  # bytes on the wire and after decompression
_RETRY_AFTER_S = 1
_GRPC_INVALID_ARGUMENT, _GRPC_UNAVAILABLE = 3, 14


# ---- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BridgeConfig:
    """The bridge's settings: the YAML file's keys (see ``otel-rl bridge --help``)."""

    track_with: str | tuple[str, ...]
    tracker_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)  # holds credentials
    listen: str = DEFAULT_LISTEN
    tracker_keys: str = "original"
    ranks: tuple[int, ...] | None = (0,)  # None: every rank
    split_runs: bool = True
    base_dir: str = DEFAULT_BASE_DIR
    run_name: str | None = None
    max_queue_mb: float = 64.0
    metrics_fallback: bool = True
    metrics_fallback_after: int = 3
    imports: tuple[str, ...] = ()  # modules that register third-party trackers (register_tracker)
    run_idle_timeout_s: float = 3600.0  # finish a run's trackers after this long without data; 0: never

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "bridge config") -> "BridgeConfig":
        """Validate a mapping of settings; a ValueError names the file and the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")

        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{source}: {key}: {why}")

        track_with = data.get("track_with")
        if isinstance(track_with, str) and track_with.strip() and "," not in track_with:
            track_with = track_with.strip()
        elif isinstance(track_with, (str, list, tuple)) and all(isinstance(n, str) for n in track_with):
            items = track_with.split(",") if isinstance(track_with, str) else track_with
            track_with = tuple(dict.fromkeys(n.strip() for n in items if n.strip()))
            if len(track_with) == 1:
                track_with = track_with[0]
        else:
            track_with = None
        if not track_with:
            raise bad("track_with", "name the tracker(s) to feed, e.g. `track_with: tensorboard` or `[tensorboard, wandb]`")
        kwargs = data.get("tracker_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise bad("tracker_kwargs", "expected a mapping (one tracker's settings, or tracker name -> settings)")
        listen = str(data.get("listen", DEFAULT_LISTEN))
        parse_listen(listen, source)
        keys = data.get("tracker_keys", "original")
        if keys not in KEY_STYLES:
            raise bad("tracker_keys", f"expected one of {', '.join(KEY_STYLES)}, got {keys!r}")
        ranks = _parse_ranks(data.get("ranks", 0), source)
        split = data.get("split_runs", True)
        fallback = data.get("metrics_fallback", True)
        for key, value in (("split_runs", split), ("metrics_fallback", fallback)):
            if not isinstance(value, bool):
                raise bad(key, f"expected true or false, got {value!r}")
        base_dir = data.get("base_dir", DEFAULT_BASE_DIR)
        if not isinstance(base_dir, str) or not base_dir:
            raise bad("base_dir", "expected a folder")
        run_name = data.get("run_name")
        if run_name is not None and (not isinstance(run_name, str) or not run_name):
            raise bad("run_name", "expected a non-empty string")
        queue_mb = data.get("max_queue_mb", 64.0)
        if isinstance(queue_mb, bool) or not isinstance(queue_mb, (int, float)) or not queue_mb > 0:
            raise bad("max_queue_mb", f"expected a positive number, got {queue_mb!r}")
        after = data.get("metrics_fallback_after", 3)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise bad("metrics_fallback_after", f"expected a non-negative integer, got {after!r}")
        idle = data.get("run_idle_timeout_s", 3600.0)
        if isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle < 0:
            raise bad("run_idle_timeout_s", f"expected seconds (0: never), got {idle!r}")
        imports = data.get("imports") or ()
        imports = [imports] if isinstance(imports, str) else imports
        if not isinstance(imports, (list, tuple)) or not all(isinstance(m, str) and m for m in imports):
            raise bad("imports", f"expected module names (e.g. [my_pkg.trackers]), got {imports!r}")
        return cls(track_with=track_with, tracker_kwargs=dict(kwargs), listen=listen, tracker_keys=keys, ranks=ranks,
                   split_runs=split, base_dir=base_dir, run_name=run_name, max_queue_mb=float(queue_mb),
                   metrics_fallback=fallback, metrics_fallback_after=after, imports=tuple(imports),
                   run_idle_timeout_s=float(idle))

    def public_dict(self) -> dict[str, Any]:
        """The settings, safe to print: tracker secrets masked."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tracker_kwargs"}
        out["tracker_kwargs"] = redact_tracker_kwargs(self.track_with, self.tracker_kwargs)
        return out


def _parse_ranks(raw: Any, source: str) -> tuple[int, ...] | None:
    if isinstance(raw, str) and raw.strip().lower() == "all":
        return None
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    if not items or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in items):
        raise ValueError(f"{source}: ranks: expected `all`, a rank (0) or a list of ranks ([0, 8]), got {raw!r}")
    return tuple(sorted(set(items)))


def parse_listen(listen: str, source: str = "listen") -> tuple[str, int]:
    """``host:port`` (``[::1]:4319`` for IPv6) as (host, port)."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", listen.strip())
    if not match:
        raise ValueError(f"{source}: listen: expected HOST:PORT (e.g. {DEFAULT_LISTEN}), got {listen!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ValueError(f"{source}: listen: port {port} is not in 0..65535")
    return host, port


def load_bridge_config(path: str | Path) -> BridgeConfig:
    """Read the bridge's YAML file; errors name the file and the setting."""
    p = Path(path)
    data = read_yaml_file(p, "bridge config")
    return BridgeConfig.from_mapping(data if data is not None else {}, f"bridge config {p}")


# ---- per-run settings ------------------------------------------------------------------------


def _safe_label(text: str) -> str:
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return label[:120] or "run"


def _suffixed_file(path: str, label: str) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{label}{p.suffix}"))


def _per_run(name: str, kwargs: Mapping[str, Any], label: str) -> dict[str, Any]:
    out = dict(kwargs)
    for key in _DIR_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = str(Path(out[key]) / label)
    for key in _FILE_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = _suffixed_file(out[key], label)
    for key in _NAME_KEYS.get(name, _DEFAULT_NAME_KEYS):
        if isinstance(out.get(key), str) and out[key]:
            out[key] = f"{out[key]}-{label}"
    return out


def per_run_tracker_kwargs(track_with: str | Sequence[str], tracker_kwargs: Mapping[str, Any], label: str) -> dict[str, Any]:
    """``tracker_kwargs`` with folders, files and run names made unique to the run ``label``."""
    if isinstance(track_with, str):
        return _per_run(track_with, tracker_kwargs, label)
    return {name: _per_run(name, kw, label) if isinstance(kw, Mapping) else kw for name, kw in tracker_kwargs.items()}


def _secret_strings(track_with: str | Sequence[str], tracker_kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """Every string that redaction masks (the trackers' secrets), longest first."""
    found: set[str] = set()

    def walk(original: Any, masked: Any) -> None:
        if isinstance(original, Mapping) and isinstance(masked, Mapping):
            for key, value in original.items():
                walk(value, masked.get(key))
        elif isinstance(original, (list, tuple)) and isinstance(masked, (list, tuple)):
            for a, b in zip(original, masked):
                walk(a, b)
        elif masked == "***" and original != "***":
            stack = [original]
            while stack:
                item = stack.pop()
                if isinstance(item, str):
                    found.add(item)
                    found.add(item.strip())
                elif isinstance(item, Mapping):
                    stack.extend(item.values())
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)

    walk(tracker_kwargs, redact_tracker_kwargs(track_with, tracker_kwargs))
    return tuple(sorted((s for s in found if len(s) >= 4), key=len, reverse=True))


def _format_kwargs(track_with: str | Sequence[str], kwargs: Mapping[str, Any]) -> str:
    shown = redact_tracker_kwargs(track_with, kwargs)
    names = [track_with] if isinstance(track_with, str) else list(track_with)
    if isinstance(track_with, str):
        return f"{track_with} {json.dumps(shown, default=str)}" if shown else track_with
    return ", ".join(f"{n} {json.dumps(shown[n], default=str)}" if shown.get(n) else n for n in names)


# ---- OTLP decoding ---------------------------------------------------------------------------


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return value.double_value
    if kind == "int_value":
        return value.int_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "bytes_value":
        return value.bytes_value
    return None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _attr_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _metric_key(name: str, attributes: Mapping[str, Any]) -> str:
    """``name{k="v",...}``: the format of ``registry_key_namer`` (attributes sorted by name)."""
    if not attributes:
        return name
    return name + "{" + ",".join(f'{k}="{_attr_text(attributes[k])}"' for k in sorted(attributes)) + "}"


def _as_rank(raw: Any) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


# ---- the bridge ------------------------------------------------------------------------------


@dataclass
class _Run:
    """One tracker set's state: a (service.name, rl.run.id[, rank]) resource, or everything."""

    key: tuple
    service: str
    run_id: str
    rank: int
    experiment: str | None
    framework: str | None
    label: str = ""
    fanout: TrackerFanout | None = None
    failed: bool = False
    events: int = 0
    metric_steps: int = 0
    metric_exports: int = 0
    progress_step: int | None = None
    held: list = field(default_factory=list)  # metrics-derived steps held back (see module doc)
    metrics_mode: bool = False
    dirty: bool = False
    last_seen: float = 0.0  # time.monotonic() of its last event or metrics export
    opened: int = 0  # times its trackers were opened (more than once after an idle finish)


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class TrackerBridge:
    """The bridge server. ``start()`` binds and serves in background threads; ``close()`` finishes.

    Relative paths in the config (``base_dir``, tracker folders) are relative to the working
    directory; ``otel-rl stack`` runs the bridge in its config file's folder.
    """

    def __init__(self, config: BridgeConfig, *, out: TextIO | None | object = _STDOUT) -> None:
        self.config = config
        self._out = out
        self._host, self._port = parse_listen(config.listen)
        for module in config.imports:  # third-party trackers register themselves on import
            importlib.import_module(module)
        self._secrets = _secret_strings(config.track_with, config.tracker_kwargs)  # (their secret_keys known now)
        self._resolver: Any = None
        self._runs: dict[tuple, _Run] = {}
        self._labels: dict[str, tuple] = {}
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._max_bytes = int(config.max_queue_mb * (1 << 20))
        self._stopping = False
        self._closed = False
        self._busy = False
        self._stats_lock = threading.Lock()
        self._stats: dict[str, int] = dict.fromkeys((
            "requests", "bad_requests", "busy_responses", "log_records", "events_delivered", "hparams_delivered",
            "records_ignored", "records_other_ranks", "metric_exports", "metric_steps_written", "metric_exports_ignored",
            "runs", "runs_failed", "worker_errors"), 0)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        # Checked now, opened per run: an unknown tracker, a missing library or a bad setting fails
        # here, before anything listens (no I/O: trackers open their backends in start()).
        create_trackers(config.track_with, self._run_kwargs("check"), run_name="check",
                        run_dir=Path(config.base_dir) / "check")

    # -- public --------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on (the real port when the config said port 0)."""
        if self._server is not None:
            return self._host, self._server.server_address[1]
        return self._host, self._port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> "TrackerBridge":
        bridge = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in self._host else socket.AF_INET

        class Handler(_Handler):
            pass

        Handler.bridge = bridge
        self._server = Server((self._host, self._port), Handler)
        worker = threading.Thread(target=self._work, name="otel-rl-bridge-worker", daemon=True)
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                 name="otel-rl-bridge-http", daemon=True)
        self._threads = [worker, serve]
        worker.start()
        serve.start()
        ref = weakref.WeakMethod(self.close)
        atexit.register(lambda: (m := ref()) is not None and m())
        cfg = self.config
        ranks = "all" if cfg.ranks is None else ",".join(map(str, cfg.ranks))
        split = f"one tracker set per run under {Path(cfg.base_dir).absolute()}" if cfg.split_runs else \
            f"all runs into one tracker set (run_dir {Path(cfg.base_dir).absolute()})"
        self._say(f"otel-rl bridge: listening on {self.url} (OTLP/HTTP /v1/logs, /v1/metrics); trackers: "
                  f"{_format_kwargs(cfg.track_with, cfg.tracker_kwargs)}; keys {cfg.tracker_keys}; ranks {ranks}; {split}")
        return self

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            out: dict[str, Any] = dict(self._stats)
        with self._cond:
            out["queued_requests"], out["queued_bytes"] = len(self._queue), self._queued_bytes
        out["run_labels"] = sorted(r.label for r in list(self._runs.values()) if r.label)
        return out

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Until every accepted request is delivered to the trackers and flushed (for tests and tools)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, deliver what was accepted, flush and finish every tracker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.name == "otel-rl-bridge-worker":
                thread.join(timeout_s)
                if thread.is_alive():
                    logger.warning("otel-rl bridge: trackers still busy after %.0f s; exiting without waiting", timeout_s)
        if self._server is None:  # never started: nothing to finish but what a test fed directly
            self._finish_all()
        stats = self.stats()
        self._say(f"otel-rl bridge: stopped; {stats['runs']} run(s), {stats['events_delivered']} step event(s), "
                  f"{stats['metric_steps_written']} metrics step(s) delivered; {stats['bad_requests']} bad request(s)")

    def __enter__(self) -> "TrackerBridge":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receiving (HTTP threads) --------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    def _submit(self, kind: str, message: Any, size: int) -> bool:
        """Queue a decoded request; False when full (or closing): the sender retries later."""
        with self._cond:
            if self._stopping or (self._queue and self._queued_bytes + size > self._max_bytes):
                return False
            self._queue.append((kind, message, size))
            self._queued_bytes += size
            self._cond.notify_all()
            return True

    # -- delivering (the worker thread) --------------------------------------------------------

    def _work(self) -> None:
        idle_s = self.config.run_idle_timeout_s
        tick = min(idle_s / 4, 60.0) if idle_s else None
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(tick)
                if self._queue:
                    kind, message, size = self._queue.popleft()
                    self._busy = True
                elif self._stopping:
                    break
                else:
                    kind = None
            if kind is None:  # woken without work: time to finish runs gone quiet (outside the lock)
                if idle_s:
                    self._finish_idle_runs()
                continue
            try:
                if kind == "logs":
                    self._deliver_logs(message)
                else:
                    self._deliver_metrics(message)
            except Exception as exc:  # never let one request stop the worker
                self._count("worker_errors")
                logger.warning("otel-rl bridge: a %s request could not be delivered: %s", kind,
                               self._scrub(f"{type(exc).__name__}: {exc}"))
            with self._cond:
                self._queued_bytes -= size
                idle = not self._queue
            if idle:
                self._flush_dirty()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        self._finish_all()

    def _finish_idle_runs(self) -> None:
        """Finish the trackers of runs silent for run_idle_timeout_s (a W&B run then shows as finished)."""
        now = time.monotonic()
        for run in list(self._runs.values()):
            if now - run.last_seen <= self.config.run_idle_timeout_s:
                continue
            run.failed = False  # trackers that could not start are tried again when the run sends again
            if run.held and run.events == 0:  # a short metrics-only run: what was held back is all it sent
                self._write_held(run)
            if run.fanout is not None:
                run.fanout.flush()
                run.fanout.finish()
                run.fanout = None
                self._say(f"otel-rl bridge: run {run.label} idle for {now - run.last_seen:.0f} s: its trackers are "
                          "finished (reopened if it sends again)")

    def _flush_dirty(self) -> None:
        for run in list(self._runs.values()):
            if run.dirty and run.fanout is not None:
                run.dirty = False
                run.fanout.flush()

    def _finish_all(self) -> None:
        for run in list(self._runs.values()):
            if run.held and run.events == 0:  # a short metrics-only run: what was held back is all it sent
                self._write_held(run)
            if run.fanout is not None:
                run.fanout.flush()
                run.fanout.finish()
                run.fanout = None

    def _accepts(self, rank: int) -> bool:
        return self.config.ranks is None or rank in self.config.ranks

    def _run_for(self, resource: Mapping[str, Any]) -> _Run:
        service = str(resource.get(A.SERVICE_NAME) or "unknown_service")
        run_id = str(resource.get(A.RL_RUN_ID) or "")
        rank = _as_rank(resource.get(A.RL_RANK, 0))
        multi_rank = self.config.ranks is None or len(self.config.ranks) > 1
        key = (service, run_id, rank if multi_rank else 0) if self.config.split_runs else ("*",)
        run = self._runs.get(key)
        if run is not None:
            run.last_seen = time.monotonic()
        else:
            experiment = resource.get(A.RL_EXPERIMENT_NAME)
            framework = resource.get(A.RL_FRAMEWORK)
            run = self._runs[key] = _Run(key, service, run_id, rank, str(experiment) if experiment else None,
                                         str(framework) if framework else None, last_seen=time.monotonic())
        return run

    def _label(self, run: _Run) -> str:
        base = _safe_label(run.run_id or run.service)
        if run.rank and (self.config.ranks is None or len(self.config.ranks) > 1):
            base = f"{base}-rank{run.rank}"
        label, n = base, 1
        while label in self._labels and self._labels[label] != run.key:  # same run id from another service
            n += 1
            label = f"{_safe_label(run.service)}-{base}" if n == 2 else f"{base}-{n}"
        self._labels[label] = run.key
        return label

    def _run_kwargs(self, label: str | None) -> dict[str, Any]:
        cfg = self.config
        if not cfg.split_runs or label is None:
            return dict(cfg.tracker_kwargs)
        return per_run_tracker_kwargs(cfg.track_with, cfg.tracker_kwargs, label)

    def _open(self, run: _Run) -> TrackerFanout | None:
        """The run's started trackers (opened at first use); None when they could not start."""
        if run.fanout is not None or run.failed:
            return run.fanout
        cfg = self.config
        if cfg.split_runs:
            run.label = self._label(run)
            run_dir = Path(cfg.base_dir) / run.label
            base = cfg.run_name or run.experiment or run.service
            run_name = f"{base}-{run.label}" if run.run_id else base
        else:
            run.label = "all-runs"
            run_dir = Path(cfg.base_dir)
            run_name = cfg.run_name or "otel-rl-bridge"
        kwargs = self._run_kwargs(run.label if cfg.split_runs else None)
        namer = None
        if cfg.tracker_keys == "registry":
            if self._resolver is None:
                from otel_rl._sdk.keys import KeyResolver

                self._resolver = KeyResolver.default()
            resolver, framework = self._resolver, run.framework
            namer = registry_key_namer(lambda key: resolver.resolve(key, framework))
        fanout = None
        try:
            fanout = TrackerFanout(create_trackers(cfg.track_with, kwargs, run_name=run_name, run_dir=run_dir), namer)
            fanout.start()
        except Exception as exc:  # one run's trackers failing must not stop the others
            run.failed = True
            self._count("runs_failed")
            if fanout is not None:
                fanout.finish()
            logger.error("otel-rl bridge: the trackers of run %s (service %s, rank %d) could not start: %s; its steps are "
                         "dropped", run.run_id or "?", run.service, run.rank, self._scrub(f"{type(exc).__name__}: {exc}"))
            return None
        run.fanout = fanout
        run.opened += 1
        if run.opened > 1:
            self._say(f"otel-rl bridge: run {run.label} sends again: its trackers are reopened")
            return fanout
        self._count("runs")
        self._say(f"otel-rl bridge: new run {run.run_id or '(no rl.run.id)'} (service {run.service}, rank {run.rank}) -> "
                  f"run name {run_name}, run_dir {run_dir}; {_format_kwargs(cfg.track_with, kwargs)}")
        return fanout

    def _deliver_logs(self, request: Any) -> None:
        for resource_logs in request.resource_logs:
            resource = _attributes(resource_logs.resource.attributes)
            rank = _as_rank(resource.get(A.RL_RANK, 0))
            records = [r for s in resource_logs.scope_logs for r in s.log_records]
            self._count("log_records", len(records))
            if not self._accepts(rank):
                self._count("records_other_ranks", len(records))
                continue
            run = None
            for record in records:
                name = record.event_name
                if not name:  # older senders put the event name into an attribute
                    name = next((_any_value(kv.value) for kv in record.attributes if kv.key == "event.name"), "")
                if name not in _EVENTS or record.body.WhichOneof("value") != "kvlist_value":
                    self._count("records_ignored")
                    continue
                if run is None:
                    run = self._run_for(resource)
                if run.events == 0:
                    run.held.clear()  # an events run: its metrics are not needed
                run.events += 1
                fanout = self._open(run)
                if fanout is None:
                    self._count("records_ignored")
                    continue
                if deliver(fanout, name, _attributes(record.attributes), _any_value(record.body)):
                    run.dirty = True
                    self._count("events_delivered" if name == N.RL_LOG_EVENT else "hparams_delivered")

    def _deliver_metrics(self, request: Any) -> None:
        for resource_metrics in request.resource_metrics:
            self._count("metric_exports")
            resource = _attributes(resource_metrics.resource.attributes)
            if not self.config.metrics_fallback or not resource.get(A.RL_RUN_ID) \
                    or not self._accepts(_as_rank(resource.get(A.RL_RANK, 0))):
                self._count("metric_exports_ignored")
                continue
            run = self._run_for(resource)
            if run.events:
                self._count("metric_exports_ignored")
                continue
            values: dict[str, Any] = {}
            progress: float | None = None
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("gauge", "sum"):
                        continue
                    for point in getattr(metric, kind).data_points:
                        which = point.WhichOneof("value")
                        if which is None:
                            continue
                        number = point.as_double if which == "as_double" else point.as_int
                        values[_metric_key(metric.name, _attributes(point.attributes))] = number
                        if metric.name == M.RL_PROGRESS_STEP and (progress is None or number > progress):
                            progress = number
            if not values:
                continue
            run.metric_exports += 1
            if progress is not None and math.isfinite(progress):
                run.progress_step = int(progress)
            step = run.progress_step if run.progress_step is not None else run.metric_exports
            run.held.append((step, values))
            if run.metrics_mode or len(run.held) >= self.config.metrics_fallback_after:
                run.metrics_mode = True
                self._write_held(run)

    def _write_held(self, run: _Run) -> None:
        held, run.held, run.metrics_mode = run.held, [], True
        fanout = self._open(run)
        if fanout is None:
            return
        for step, values in held:
            fanout.log(step, values)
            self._count("metric_steps_written")
        run.dirty = True

    # -- output ----------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _say(self, text: str) -> None:
        out = sys.stdout if self._out is _STDOUT else self._out
        if out is not None:
            out.write(self._scrub(text) + "\n")  # type: ignore[union-attr]
            out.flush()  # type: ignore[union-attr]


# ---- HTTP ------------------------------------------------------------------------------------


def _message_types() -> dict[str, tuple[Any, Any]]:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return {
        "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
        "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
        "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    }


class _Handler(BaseHTTPRequestHandler):
    bridge: TrackerBridge
    protocol_version = "HTTP/1.1"  # keep-alive: collectors reuse their connections
    server_version = "otel-rl-bridge"
    sys_version = ""
    timeout = 60  # a sender that stalls mid-request frees its thread
    _types = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("otel-rl bridge: %s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_status(self, status: int, code: int, message: str, as_json: bool,
                     headers: Mapping[str, str] | None = None) -> None:
        from google.rpc import status_pb2

        payload = status_pb2.Status(code=code, message=message)
        if as_json:
            self._send(status, json.dumps({"code": code, "message": message}).encode(), "application/json", headers)
        else:
            self._send(status, payload.SerializeToString(), "application/x-protobuf", headers)

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/stats":
            self._send(200, json.dumps(self.bridge.stats()).encode(), "application/json")
        else:
            self._send(404, b"not found: GET /healthz, GET /stats, POST /v1/logs, /v1/metrics, /v1/traces\n",
                       "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        bridge = self.bridge
        path = self.path.split("?", 1)[0].rstrip("/")
        content_type = (self.headers.get("Content-Type") or "application/x-protobuf").split(";", 1)[0].strip().lower()
        as_json = content_type == "application/json"
        types = _Handler._types or _message_types()
        _Handler._types = types
        if path not in types:
            self.close_connection = True
            self._send(404, b"not found: POST /v1/logs, /v1/metrics or /v1/traces\n", "text/plain; charset=utf-8")
            return
        bridge._count("requests")
        try:
            body = self._read_body()
            body = _decompress(body, (self.headers.get("Content-Encoding") or "identity").strip().lower())
            if content_type not in ("application/x-protobuf", "application/protobuf", "application/json"):
                raise _BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                                  f"unsupported Content-Type {content_type!r}: send application/x-protobuf or application/json")
            request_type, response_type = types[path]
            if path == "/v1/traces":  # accepted and dropped: trackers take no spans
                self._reply(response_type(), as_json)
                return
            message = _decode(request_type, body, as_json)
        except _BadRequest as exc:
            bridge._count("bad_requests")
            logger.info("otel-rl bridge: %s %s: %s", path, int(exc.status), exc)
            self._send_status(int(exc.status), _GRPC_INVALID_ARGUMENT, str(exc), as_json)
            return
        if not bridge._submit("logs" if path == "/v1/logs" else "metrics", message, len(body)):
            bridge._count("busy_responses")
            self._send_status(503, _GRPC_UNAVAILABLE, "the bridge's trackers are behind; retry later", as_json,
                              {"Retry-After": str(_RETRY_AFTER_S)})
            return
        self._reply(response_type(), as_json)

    def _reply(self, response: Any, as_json: bool) -> None:
        if as_json:
            self._send(200, b"{}", "application/json")
        else:
            self._send(200, response.SerializeToString(), "application/x-protobuf")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self.close_connection = True
                    raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > _MAX_BODY:
                    self.close_connection = True
                    raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {_MAX_BODY} bytes")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {_MAX_BODY} bytes")
        return self.rfile.read(length) if length else b""


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    else:
        raise _BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none")
    try:
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(body, _MAX_BODY + 1)
    except zlib.error as exc:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body is not valid {encoding}: {exc}") from None
    if len(out) > _MAX_BODY or inflater.unconsumed_tail:
        raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"decompressed body over {_MAX_BODY} bytes")
    return out


def _decode(request_type: Any, body: bytes, as_json: bool) -> Any:
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    try:
        if as_json:
            return json_format.Parse(body.decode("utf-8"), request_type(), ignore_unknown_fields=True)
        return request_type.FromString(body)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError, TypeError) as exc:
        kind = "OTLP/JSON" if as_json else "OTLP protobuf"
        raise _BadRequest(HTTPStatus.BAD_REQUEST,
                          f"body is not an {kind} {request_type.DESCRIPTOR.name}: {str(exc)[:200]}") from None


# ---- the command -------------------------------------------------------------------------------

CLI_DESCRIPTION = """\
The tracker bridge: receive OTLP/HTTP from a collector and feed experiment trackers, so one
collector feeds the trackers of a whole cluster without tracker credentials on any rank.

Every rl.log event (one per training step, with the exact key -> value map) becomes one
tracker.log(step, values) call; rl.hparams becomes the tracker's config. Listens for OTLP/HTTP
protobuf or JSON on POST /v1/logs and /v1/metrics (/v1/traces is accepted and dropped), health
on GET /healthz, counters on GET /stats. SIGTERM or Ctrl-C flushes and finishes every tracker.

The config file (YAML) takes track_with and tracker_kwargs exactly as otel_rl.init and ROLL's
YAML do, and:
  listen                  HOST:PORT to listen on (default 127.0.0.1:4319; 0.0.0.0:4319 for a
                          collector on another host: plain HTTP, no authentication, so on a
                          network only the collector reaches)
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
                          3600; 0: only at exit), so a finished run shows as finished in W&B;
                          reopened (same folders and names) if it sends again
  imports                 modules to import first, e.g. [my_pkg.trackers]: third-party trackers
                          registered there with otel_rl.register_tracker can be named in track_with
  max_queue_mb            received requests held for the trackers (default 64); beyond it the
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
  otel-rl stack up --bridge-config bridge.yaml    the local stack: rotel's logs go to the bridge

Collector route: otelcol-contrib with collector-config/otelcol/gateway-bridge.yaml
(OTEL_RL_BRIDGE_ENDPOINT=http://HOST:4319; it posts to /v1/logs). Relative paths are relative
to the working directory (under otel-rl stack: the config file's folder).
"""


def run_bridge(config_path: str | Path, *, listen: str | None = None, base_dir: str | None = None,
               verbose: bool = False) -> int:
    """``otel-rl bridge``: serve until SIGTERM or SIGINT, then flush and finish every tracker."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if verbose else logging.WARNING,
                        format="otel-rl bridge: %(levelname)s: %(message)s")
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
