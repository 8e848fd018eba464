"""The bridge server: :class:`TrackerBridge` receives OTLP/HTTP on its own threads
(:mod:`otel_rl.bridge.handler`), queues each decoded request (:mod:`otel_rl.bridge.intake`), and
hands it to one worker thread that feeds the runs' trackers (:mod:`otel_rl.bridge.runs`).

Request handling follows OTLP/HTTP: protobuf or JSON bodies, gzip / deflate or none, at most
20 MiB on the wire and after decompression (the collector's own receiver default) (8 MiB for JSON; 413), unknown encodings 415, bodies
that do not decode 400 with a ``google.rpc.Status`` (counted, never fatal), and 503 with
``Retry-After`` when the queue of received requests is full, so a slow tracker slows the senders
down instead of growing memory.

Hostile input costs bounded memory and time: at most ``max_requests_in_flight`` requests are read
at once and ``max_requests_per_client`` of them from one address (beyond it 429 with
``Retry-After``, before the body is read); a body that stops arriving for ``body_timeout_s`` is
answered 408; a body is counted before it is decoded (:mod:`otel_rl.bridge.limits` for protobuf:
messages, resources, log records, data points; :mod:`otel_rl.bridge.json_scan` for JSON: every
value and the nesting depth; 413 past a limit), one body is inflated and decoded at a time, and
its estimated decoded size is reserved in the queue first (503 when it does not fit). At most
``max_runs`` runs get tracker folders. With ``OTEL_RL_BRIDGE_TOKEN`` set, POSTs need
``Authorization: Bearer <token>`` (401 otherwise); without it, a bridge listening beyond this
machine warns at start.
"""

from __future__ import annotations

import atexit
import importlib
import ipaddress
import logging
import os
import sys
import threading
import time
import weakref
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from otel_rl import environment_variables as ENV
from otel_rl.bridge.config import BridgeConfig, parse_listen
from otel_rl.bridge.decode import decode_attributes
from otel_rl.bridge.handler import make_http_server
from otel_rl.bridge.intake import Intake
from otel_rl.bridge.limits import Counts, RequestLimits
from otel_rl.bridge.runs import RunTrackers
from otel_rl.bridge.tracker_settings import format_tracker_kwargs, run_tracker_kwargs, secret_strings
from otel_rl.semconv import attributes as A
from otel_rl.trackers.base import create_trackers

__all__ = ["TrackerBridge", "listens_beyond_this_machine"]

logger = logging.getLogger("otel_rl")

_STDOUT = object()  # "print to whatever sys.stdout is at the time"


def listens_beyond_this_machine(host: str) -> bool:
    """True unless ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host.lower() in ("localhost", "localhost."):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return True


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
        self._secrets = secret_strings(config.track_with, config.tracker_kwargs)  # (their secret_keys known now)
        token = os.environ.get(ENV.OTEL_RL_BRIDGE_TOKEN, "")
        if token:
            self._secrets = (*self._secrets, token)
        self._has_token = bool(token)
        self._intake = Intake(config, token.encode() if token else None, self._warn)
        self._count = self._intake.count
        self._runs = RunTrackers(config, count=self._count, say=self._say, scrub=self._scrub)
        self._intake.refusal = self._refusal
        self._closed = False
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        # Checked now, opened per run: an unknown tracker, a missing library or a bad setting fails
        # here, before anything listens (no I/O: trackers open their backends in start()).
        create_trackers(config.track_with, run_tracker_kwargs(config, "check"), run_name="check", run_dir=Path(config.base_dir) / "check")

    def _refusal(self, path: str, message: Any, counts: Counts) -> str | None:
        """Why the runs would drop a decoded request (see RunTrackers.refusal); None when they take it."""
        sizes = counts.resource_bytes
        if path == "/v1/logs":
            resources = [(decode_attributes(r.resource.attributes), size) for r, size in zip(message.resource_logs, sizes)]
        elif self.config.metrics_fallback:
            resources = [(decode_attributes(r.resource.attributes), size) for r, size in zip(message.resource_metrics, sizes)]
            resources = [(r, size) for r, size in resources if r.get(A.RL_RUN_ID)]
        else:
            return None
        return self._runs.refusal(resources)

    # -- public --------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on (the real port when the config said port 0)."""
        if self._server is not None:
            return self._host, self._server.server_address[1]
        return self._host, self._port

    @property
    def limits(self) -> RequestLimits:
        """The per-request bounds (settable: tests and tools tighten them on a running bridge)."""
        return self._intake.limits

    @limits.setter
    def limits(self, limits: RequestLimits) -> None:
        self._intake.limits = limits

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> TrackerBridge:
        self._server = make_http_server(self._host, self._port, self._intake, self.stats)
        worker = threading.Thread(target=self._work, name="otel-rl-bridge-worker", daemon=True)
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="otel-rl-bridge-http", daemon=True)
        self._threads = [worker, serve]
        worker.start()
        serve.start()
        ref = weakref.WeakMethod(self.close)
        atexit.register(lambda: (m := ref()) is not None and m())
        cfg = self.config
        ranks = "all" if cfg.ranks is None else ",".join(map(str, cfg.ranks))
        split = (
            f"one tracker set per run under {Path(cfg.base_dir).absolute()}"
            if cfg.split_runs
            else f"all runs into one tracker set (run_dir {Path(cfg.base_dir).absolute()})"
        )
        self._say(
            f"otel-rl bridge: listening on {self.url} (OTLP/HTTP /v1/logs, /v1/metrics); trackers: "
            f"{format_tracker_kwargs(cfg.track_with, cfg.tracker_kwargs)}; keys {cfg.tracker_keys}; ranks {ranks}; {split}"
        )
        if not self._has_token and listens_beyond_this_machine(self._host):
            logger.warning(
                "otel-rl bridge: listening on %s, beyond this machine, without a token: anyone who reaches the port can "
                "post steps into the trackers. Set %s (the collector then sends Authorization: Bearer <token>), "
                "or listen on 127.0.0.1",
                self.url,
                ENV.OTEL_RL_BRIDGE_TOKEN,
            )
        return self

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._intake.counters())
        intake = self._intake
        with intake.cond:
            out["queued_requests"], out["queued_bytes"] = len(intake.queue), intake.queued_bytes
        out["requests_in_flight"] = intake.slots.in_use()
        out["run_labels"] = self._runs.labels()
        out["runs_open"] = self._runs.open_count()
        return out

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Until every accepted request is delivered to the trackers and flushed (for tests and tools)."""
        end = time.monotonic() + timeout_s
        intake = self._intake
        with intake.cond:
            while intake.queue or intake.busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                intake.cond.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, deliver what was accepted, flush and finish every tracker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._intake.cond:
            self._intake.stopping = True
            self._intake.cond.notify_all()
        for thread in self._threads:
            if thread.name == "otel-rl-bridge-worker":
                thread.join(timeout_s)
                if thread.is_alive():
                    logger.warning("otel-rl bridge: trackers still busy after %.0f s; exiting without waiting", timeout_s)
        if self._server is None:  # never started: nothing to finish but what a test fed directly
            self._runs.finish_all()
        self._intake.disconnects.flush()
        stats = self.stats()
        self._say(
            f"otel-rl bridge: stopped; {stats['runs']} run(s), {stats['events_delivered']} step event(s), "
            f"{stats['metric_steps_written']} metrics step(s) delivered; {stats['bad_requests']} bad request(s)"
        )

    def __enter__(self) -> TrackerBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- delivering (the worker thread) --------------------------------------------------------

    def _work(self) -> None:
        idle_s = self.config.run_idle_timeout_s
        tick = min(idle_s / 4, 60.0) if idle_s else None
        intake = self._intake
        while True:
            with intake.cond:
                if not intake.queue and not intake.stopping:
                    intake.cond.wait(tick)
                if intake.queue:
                    kind, message, size, counts = intake.queue.popleft()
                    intake.busy = True
                elif intake.stopping:
                    break
                else:
                    kind = None
            if kind is None:  # woken without work: time to finish runs gone quiet (outside the lock)
                if idle_s:
                    self._runs.finish_idle_runs()
                continue
            try:
                if kind == "logs":
                    self._runs.deliver_logs(message, counts.record_bytes)
                else:
                    self._runs.deliver_metrics(message, counts.resource_bytes)
            except Exception as exc:  # never let one request stop the worker
                self._count("worker_errors")
                logger.warning("otel-rl bridge: a %s request could not be delivered: %s", kind, self._scrub(f"{type(exc).__name__}: {exc}"))
            del message, counts  # freed before its queue space is: the next request may need it
            with intake.cond:
                intake.queued_bytes -= size
                idle = not intake.queue
            if idle:
                self._runs.flush_dirty()
            with intake.cond:
                intake.busy = False
                intake.cond.notify_all()
        self._runs.finish_all()

    # -- output ----------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _warn(self, text: str) -> None:
        logger.warning("%s", self._scrub(text))

    def _say(self, text: str) -> None:
        out = sys.stdout if self._out is _STDOUT else self._out
        if out is not None:
            out.write(self._scrub(text) + "\n")  # type: ignore[union-attr]
            out.flush()  # type: ignore[union-attr]
