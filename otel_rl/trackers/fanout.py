"""Feed experiment trackers from the per-step events: every ``rl.log`` record becomes one
``tracker.log(values, step)`` call, ``rl.hparams`` becomes ``log_hparams``, and a step's
``rl.sample`` records become one ``tracker.log_samples(rows, step)`` call.

In a training process this is a LogRecordExporter behind the SDK's batch processor, so tracker
writes happen on the processor's thread, never the training thread. The bridge feeds the same
``TrackerFanout`` from OTLP it receives. A tracker that fails is reported once and skipped for
that call; it never stops the run or the other trackers.

Samples are held until that step's ``rl.log`` arrives (or a flush, after each export batch), so a
tracker gets a step's samples in one call and before that step's values (W&B drops rows logged at
a step it has passed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N
from otel_rl.trackers.base import NAME_CACHE_LIMIT, Tracker, _resolve, create_trackers, redact

logger = logging.getLogger("otel_rl")

KEY_STYLES = ("original", "registry")


class TrackerFanout:
    """Delivers steps to several trackers; one failing tracker never affects the others."""

    def __init__(self, trackers: Sequence[Tracker], key_namer: Callable[[str], str] | None = None) -> None:
        self.trackers = list(trackers)
        self._key_namer = key_namer
        self._names: dict[str, str] = {}
        self._failed: set[tuple[str, str]] = set()
        self._samples: dict[int | None, list[Mapping[str, Any]]] = {}  # rl.sample bodies per step, not yet delivered

    def _call(self, tracker: Tracker, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a tracker's failure must not reach training or the other trackers
            if (tracker.name, what) not in self._failed:
                self._failed.add((tracker.name, what))
                logger.warning(
                    "otel-rl: tracker %r failed in %s (%s); it keeps receiving later steps (reported once)",
                    tracker.name,
                    what,
                    tracker.scrub(f"{type(exc).__name__}: {exc}"),
                )

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        for tracker in self.trackers:
            tracker.start(hparams)  # a tracker that cannot start is a configuration error: raise it

    def _renamed(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        if self._key_namer is None:
            return values
        out = {}
        for key, value in values.items():
            name = self._names.get(key)
            if name is None:
                name = self._key_namer(key)
                if len(self._names) < NAME_CACHE_LIMIT:
                    self._names[key] = name
            out[name] = value
        return out

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        if self._samples:
            self.deliver_samples(step)
        values = self._renamed(values)
        for tracker in self.trackers:
            self._call(tracker, "log", tracker.log, values, step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            self._call(tracker, "log_hparams", tracker.log_hparams, hparams)

    def add_sample(self, row: Mapping[str, Any], step: int | None) -> None:
        """Hold one ``rl.sample`` body until its step is delivered."""
        self._samples.setdefault(step, []).append(row)

    def deliver_samples(self, up_to: int | None = None) -> None:
        """Hand the held samples to the trackers, one call per step in step order: those of steps up
        to ``up_to`` (and those without a step), or all when ``up_to`` is None."""
        ready = sorted((s for s in self._samples if up_to is None or s is None or s <= up_to), key=lambda s: -1 if s is None else s)
        for step in ready:
            rows = self._samples.pop(step)
            for tracker in self.trackers:
                self._call(tracker, "log_samples", tracker.log_samples, rows, step)

    def flush(self) -> None:
        if self._samples:
            self.deliver_samples()
        for tracker in self.trackers:
            self._call(tracker, "flush", tracker.flush)

    def finish(self) -> None:
        if self._samples:
            self.deliver_samples()
        for tracker in self.trackers:
            self._call(tracker, "finish", tracker.finish)


def registry_key_namer(resolve: Callable[[str], Any]) -> Callable[[str], str]:
    """Name values by registry metric and attributes (``rl.loss{rl.loss.type="kl",...}``)."""

    def name(key: str) -> str:
        res = resolve(key)
        if res.fallback:
            return key
        attrs = ",".join(f'{k}="{v}"' for k, v in res.attributes)
        return f"{res.metric}{{{attrs}}}" if attrs else res.metric

    return name


def deliver(fanout: TrackerFanout, event_name: str | None, attributes: Mapping[str, Any] | None, body: Any) -> bool:
    """Hand one decoded log record to the trackers; False when it is not an otel-rl event."""
    if event_name == N.RL_LOG_EVENT and isinstance(body, Mapping):
        step = (attributes or {}).get(A.RL_STEP)
        fanout.log(body, int(step) if isinstance(step, (int, float)) else None)
        return True
    if event_name == N.RL_HPARAMS_EVENT and isinstance(body, Mapping):
        fanout.log_hparams(body)
        return True
    if event_name == N.RL_SAMPLE_EVENT and isinstance(body, Mapping):
        step = (attributes or {}).get(A.RL_STEP)
        fanout.add_sample(body, int(step) if isinstance(step, (int, float)) else None)
        return True
    return False


class TrackerLogExporter(LogRecordExporter):
    """The in-process route: rl.log / rl.hparams / rl.sample records from the SDK's batch processor."""

    def __init__(self, fanout: TrackerFanout) -> None:
        self.fanout = fanout
        self._shutdown = False

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        if self._shutdown:
            return LogRecordExportResult.FAILURE
        for readable in batch:
            record = readable.log_record
            deliver(self.fanout, getattr(record, "event_name", None), record.attributes, record.body)
        self.fanout.flush()
        return LogRecordExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.fanout.flush()
        return True

    def shutdown(self) -> None:
        if not self._shutdown:
            self._shutdown = True
            self.fanout.finish()


def redact_tracker_kwargs(track_with: str | Sequence[str] | None, tracker_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """tracker_kwargs with every tracker's secrets masked, for config dumps."""
    try:
        if isinstance(track_with, str):
            return redact(tracker_kwargs, _resolve(track_with).secret_keys)
        return {name: redact(kw, _resolve(name).secret_keys) if isinstance(kw, Mapping) else "***" for name, kw in tracker_kwargs.items()}
    except Exception:  # unknown tracker: we cannot tell its secrets apart, so mask everything
        return {name: "***" for name in tracker_kwargs}


def build_fanout(config: Any, run_name: str, run_dir: Any, resolve: Callable[[str], Any]) -> TrackerFanout | None:
    """The configured trackers, started, or None when the run has none (or this rank does not track)."""
    if not config.track_with:
        return None
    if (config.rank or 0) != 0 and not config.tracker_all_ranks:
        return None  # rank 0 only by default, as the frameworks do
    trackers = create_trackers(config.track_with, config.tracker_kwargs, run_name=run_name, run_dir=run_dir)
    fanout = TrackerFanout(trackers, registry_key_namer(resolve) if config.tracker_keys == "registry" else None)
    fanout.start()
    return fanout
