"""The bridge's runs: one tracker set per run (a ``(service.name, rl.run.id[, rank])`` resource,
or one for everything without ``split_runs``), opened at the run's first data, and the delivery
of decoded OTLP requests to them: ``rl.log`` / ``rl.hparams`` events, or a metrics-only run's
gauges and sums (see :mod:`otel_rl.bridge` for the rules).

:class:`RunTrackers` is driven by the bridge's one worker thread (a tracker is used by one thread
at a time); the HTTP threads only read its run labels for ``/stats``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.bridge.config import BridgeConfig
from otel_rl.bridge.decode import as_rank, decode_any_value, decode_attributes, metric_key
from otel_rl.bridge.tracker_settings import format_tracker_kwargs, run_tracker_kwargs, safe_label
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N
from otel_rl.trackers.base import create_trackers
from otel_rl.trackers.fanout import TrackerFanout, deliver, registry_key_namer

__all__ = ["RunState", "RunTrackers"]

logger = logging.getLogger("otel_rl")

_EVENTS = (N.RL_LOG_EVENT, N.RL_HPARAMS_EVENT, N.RL_SAMPLE_EVENT)
_MAX_RUN_STATES = 10_000  # runs remembered (label, counts); the closed ones past it are forgotten
_STEP_RANGE = 1 << 63  # a step or rank past int64 (1e308, inf) is not a step: the record is skipped


def shown(text: object) -> str:
    """A sender-chosen string (run id, service) safe for one log line: repr-escaped when it holds a
    non-printable character, so a newline cannot start a forged line and an escape cannot recolour one."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def _step_of(attributes: Mapping[str, Any]) -> bool:
    """True when the record's ``rl.step`` is absent or a whole number within int64."""
    step = attributes.get(A.RL_STEP)
    if step is None or isinstance(step, bool) or not isinstance(step, (int, float)):
        return True
    return (isinstance(step, int) or math.isfinite(step)) and -_STEP_RANGE < step < _STEP_RANGE


def _rank_of(raw: Any) -> int | None:
    """The resource's ``rl.rank`` as an int; None when it is not a number within int64 (nan, inf, 1e308)."""
    if isinstance(raw, float) and not (math.isfinite(raw) and -_STEP_RANGE < raw < _STEP_RANGE):
        return None
    if isinstance(raw, int) and not -_STEP_RANGE < raw < _STEP_RANGE:
        return None
    return as_rank(raw)


_DELIVERED = {N.RL_LOG_EVENT: "events_delivered", N.RL_HPARAMS_EVENT: "hparams_delivered", N.RL_SAMPLE_EVENT: "samples_delivered"}


@dataclass
class RunState:
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
    held: list = field(default_factory=list)  # metrics-derived steps held back (see otel_rl.bridge's doc)
    metrics_mode: bool = False
    dirty: bool = False
    last_seen: float = 0.0  # time.monotonic() of its last event or metrics export
    opened: int = 0  # times its trackers were opened (more than once after an idle finish)
    handed: int = 0  # bytes (OTLP's encoded size) of the records and exports handed to its trackers, against max_run_mb


class RunTrackers:
    """Every run the bridge has seen, its trackers, and the delivery of requests to them.

    ``count(name, amount=1)`` bumps one of the bridge's counters, ``say(text)`` prints a line,
    ``scrub(text)`` masks the trackers' secrets in a message: the bridge owns all three.
    """

    def __init__(
        self, config: BridgeConfig, *, count: Callable[..., None], say: Callable[[str], None], scrub: Callable[[str], str]
    ) -> None:
        self.config = config
        self._count, self._say, self._scrub = count, say, scrub
        self._resolver: Any = None
        self._runs: dict[tuple, RunState] = {}
        self._labels: dict[str, tuple] = {}
        self._bad_logged = 0
        self._runs_accepted = 0  # distinct runs taken on (each gets its tracker folders): at most max_runs
        self._over_max_runs_said = False
        self._budget = int(config.max_run_mb * (1 << 20))
        self._places = threading.Lock()  # guards _runs_accepted and _claims (the HTTP threads claim, the worker takes on)
        self._claims: set[tuple] = set()  # new runs of acknowledged requests, not yet delivered: their places are taken

    def open_count(self) -> int:
        """How many runs have open trackers (safe from any thread)."""
        return sum(1 for r in list(self._runs.values()) if r.fanout is not None)

    def _bad(self, records: int, why: str, resource: Mapping[str, Any]) -> None:
        """Count skipped records; the first few are logged with the run named (escaped)."""
        self._count("records_bad", records)
        self._bad_logged += 1
        if self._bad_logged <= 10:
            logger.warning(
                "otel-rl bridge: skipped %d record(s) of run %s (service %s): %s%s",
                records,
                shown(resource.get(A.RL_RUN_ID) or "?"),
                shown(resource.get(A.SERVICE_NAME) or "?"),
                shown(why[:200]),
                "; further bad records are only counted (records_bad in /stats)" if self._bad_logged == 10 else "",
            )

    def labels(self) -> list[str]:
        """The labels of the runs whose trackers were opened, sorted (safe from any thread)."""
        return sorted(r.label for r in list(self._runs.values()) if r.label)

    # -- delivering ------------------------------------------------------------------------------

    def deliver_logs(self, request: Any, record_bytes: Sequence[int]) -> None:
        """Each ``rl.log`` / ``rl.hparams`` / ``rl.sample`` event of an ``ExportLogsServiceRequest`` to its run's trackers.

        ``record_bytes``: each log record's encoded size, in order, as the body's scan counted them
        (upb's ``ByteSize()`` would encode the message again)."""
        sizes = iter(record_bytes)
        for resource_logs in request.resource_logs:
            resource = decode_attributes(resource_logs.resource.attributes)
            rank = _rank_of(resource.get(A.RL_RANK, 0))
            records = [r for s in resource_logs.scope_logs for r in s.log_records]
            record_sizes = [next(sizes, 0) for _ in records]
            self._count("log_records", len(records))
            if rank is None:
                self._bad(len(records), f"{A.RL_RANK} {resource.get(A.RL_RANK)!r} is not a rank", resource)
                continue
            if not self._accepts(rank):
                self._count("records_other_ranks", len(records))
                continue
            run = None
            for record, size in zip(records, record_sizes):
                name = record.event_name
                if not name:  # older senders put the event name into an attribute
                    name = next((decode_any_value(kv.value) for kv in record.attributes if kv.key == "event.name"), "")
                if name not in _EVENTS or record.body.WhichOneof("value") != "kvlist_value":
                    self._count("records_ignored")
                    continue
                if run is None:
                    run = self._run_for(resource)
                    if run is None:  # a new run id past max_runs: dropped, counted
                        self._count("records_over_max_runs", len(records))
                        break
                if run.events == 0:
                    run.held.clear()  # an events run: its metrics are not needed
                if size > self.config.max_record_kb << 10:  # a step's values or a sample: never megabytes
                    self._bad(1, f"an event of {size} bytes, over max_record_kb ({self.config.max_record_kb})", resource)
                    continue
                if not self._spend(run, size):
                    continue
                run.events += 1
                fanout = self._open(run)
                if fanout is None:
                    self._count("records_ignored")
                    continue
                try:  # one bad record is skipped and counted; the rest of the request is still delivered
                    attributes = decode_attributes(record.attributes)
                    if not _step_of(attributes):
                        self._bad(1, f"{A.RL_STEP} {attributes.get(A.RL_STEP)!r} is not a step", resource)
                        continue
                    if deliver(fanout, name, attributes, decode_any_value(record.body)):
                        run.dirty = True
                        self._count(_DELIVERED[name])
                except Exception as exc:
                    self._bad(1, f"{type(exc).__name__}: {exc}", resource)

    def deliver_metrics(self, request: Any, resource_bytes: Sequence[int]) -> None:
        """An ``ExportMetricsServiceRequest``: one step per export of a run that sends no events
        (``resource_bytes``: each resource's encoded size, in order, as the body's scan counted them)."""
        sizes = iter(resource_bytes)
        for resource_metrics in request.resource_metrics:
            self._count("metric_exports")
            size = next(sizes, 0)
            try:  # one bad resource is counted and skipped; the others are still delivered
                self._deliver_metrics_resource(resource_metrics, size)
            except Exception as exc:
                self._bad(0, f"{type(exc).__name__}: {exc}", decode_attributes(resource_metrics.resource.attributes))

    def _deliver_metrics_resource(self, resource_metrics: Any, size: int) -> None:
        resource = decode_attributes(resource_metrics.resource.attributes)
        rank = _rank_of(resource.get(A.RL_RANK, 0))
        if not self.config.metrics_fallback or not resource.get(A.RL_RUN_ID) or rank is None or not self._accepts(rank):
            self._count("metric_exports_ignored")
            return
        run = self._run_for(resource)
        if run is None:  # a new run id past max_runs
            self._count("metric_exports_ignored")
            return
        if run.events:
            self._count("metric_exports_ignored")
            return
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
                    values[metric_key(metric.name, decode_attributes(point.attributes))] = number
                    if metric.name == M.RL_PROGRESS_STEP and (progress is None or number > progress):
                        progress = number
        if not values or not self._spend(run, size):
            return
        run.metric_exports += 1
        if progress is not None and math.isfinite(progress) and abs(progress) < _STEP_RANGE:
            run.progress_step = int(progress)
        step = run.progress_step if run.progress_step is not None else run.metric_exports
        run.held.append((step, values))
        if run.metrics_mode or len(run.held) >= self.config.metrics_fallback_after:
            run.metrics_mode = True
            self._write_held(run)

    def _spend(self, run: RunState, size: int) -> bool:
        """Count ``size`` bytes against the run's max_run_mb; False (counted, said once) past it."""
        if run.handed + size > self._budget:
            self._count("records_over_run_budget")
            if run.handed < self._budget:  # the first refusal: said once
                run.handed = self._budget
                logger.warning("otel-rl bridge: %s", self._over_budget(run))
            return False
        run.handed += size
        return True

    def _over_budget(self, run: RunState) -> str:
        return self._over_budget_label(run.label or shown(run.run_id))

    def _over_budget_label(self, label: str) -> str:
        return (
            f"run {label} would hand its trackers more than max_run_mb ({self.config.max_run_mb:g} MiB): "
            "its further records are refused (507); raise max_run_mb in the bridge's config"
        )

    # -- finishing -------------------------------------------------------------------------------

    def finish_idle_runs(self) -> None:
        """Finish the trackers of runs silent for run_idle_timeout_s (a W&B run then shows as finished)."""
        now = time.monotonic()
        for run in list(self._runs.values()):
            if now - run.last_seen <= self.config.run_idle_timeout_s:
                continue
            run.failed = False  # trackers that could not start are tried again when the run sends again
            if run.held and run.events == 0:  # a short metrics-only run: what was held back is all it sent
                self._write_held(run)
            if run.fanout is not None:
                self._close(run)
                self._say(
                    f"otel-rl bridge: run {run.label} idle for {now - run.last_seen:.0f} s: its trackers are "
                    "finished (reopened if it sends again)"
                )

    def _close(self, run: RunState) -> None:
        if run.fanout is not None:
            fanout, run.fanout = run.fanout, None
            fanout.flush()
            fanout.finish()

    def _make_room(self, opening: RunState) -> None:
        """Finish the least recently used runs' trackers so that at most max_open_runs are open
        (each holds threads and files); such a run is reopened if it sends again, nothing is lost."""
        open_runs = [r for r in self._runs.values() if r.fanout is not None and r is not opening]
        excess = len(open_runs) + 1 - self.config.max_open_runs
        if excess <= 0:
            return
        for run in sorted(open_runs, key=lambda r: r.last_seen)[:excess]:
            if run.held and run.events == 0:
                self._write_held(run)
            self._close(run)
            self._count("runs_closed_for_room")
        # forget the states of long-closed runs past a bound (a flood of run ids must not grow memory)
        if len(self._runs) > _MAX_RUN_STATES:
            closed = sorted((r for r in self._runs.values() if r.fanout is None and not r.held), key=lambda r: r.last_seen)
            for run in closed[: len(self._runs) - _MAX_RUN_STATES]:
                del self._runs[run.key]

    def flush_dirty(self) -> None:
        """Flush the trackers of every run that was written since its last flush."""
        for run in list(self._runs.values()):
            if run.dirty and run.fanout is not None:
                run.dirty = False
                run.fanout.flush()

    def finish_all(self) -> None:
        """Write what is held back, then flush and finish every run's trackers."""
        for run in list(self._runs.values()):
            if run.held and run.events == 0:  # a short metrics-only run: what was held back is all it sent
                self._write_held(run)
            if run.fanout is not None:
                run.fanout.flush()
                run.fanout.finish()
                run.fanout = None

    # -- runs and their trackers -----------------------------------------------------------------

    def _accepts(self, rank: int) -> bool:
        return self.config.ranks is None or rank in self.config.ranks

    def _key(self, resource: Mapping[str, Any]) -> tuple:
        service = str(resource.get(A.SERVICE_NAME) or "unknown_service")
        run_id = str(resource.get(A.RL_RUN_ID) or "")
        multi_rank = self.config.ranks is None or len(self.config.ranks) > 1
        return (service, run_id, as_rank(resource.get(A.RL_RANK, 0)) if multi_rank else 0) if self.config.split_runs else ("*",)

    def _idle(self) -> list[RunState]:
        """Runs that can give their place back: trackers finished, nothing held, no data for run_idle_timeout_s."""
        timeout = self.config.run_idle_timeout_s
        if timeout <= 0:
            return []
        before = time.monotonic() - timeout
        return [r for r in list(self._runs.values()) if r.fanout is None and not r.held and r.last_seen < before]

    def refusal(self, resources: list[tuple[Mapping[str, Any], int]]) -> str | None:
        """Why a request of these (resource attributes, bytes) would be dropped, for the handler to
        answer instead of acknowledging it: a run it would take past max_run_mb, or a new run past
        ``max_runs`` with no idle run to give its place back; None when it is taken (any thread: a
        read of the states, the worker decides again when it delivers)."""
        sizes: dict[tuple, int] = {}
        for resource, size in resources:  # (the sizes are an upper estimate of what the worker counts)
            rank = _rank_of(resource.get(A.RL_RANK, 0))
            if rank is not None and self._accepts(rank):
                key = self._key(resource)
                sizes[key] = sizes.get(key, 0) + size
        for key, size in sizes.items():
            run = self._runs.get(key)
            if (run.handed if run is not None else 0) + size > self._budget:
                return self._over_budget(run) if run is not None else self._over_budget_label(shown(key[1] if len(key) > 1 else "*"))
        with self._places:  # a new run's place is claimed now, so that no request acknowledged since takes it
            new = set(sizes) - set(self._runs) - set(self._claims)
            over = self._runs_accepted + len(self._claims) + len(new) - self.config.max_runs
            if new and over > 0 and len(self._idle()) < over:
                return (
                    f"max_runs ({self.config.max_runs}) runs are taken on and none has been idle for run_idle_timeout_s "
                    f"({self.config.run_idle_timeout_s:g} s): a new run is not taken; retry when one has ended, or raise max_runs"
                )
            self._claims |= new
        return None

    def _run_for(self, resource: Mapping[str, Any]) -> RunState | None:
        """The resource's run, taken on at its first data; None for a new run past ``max_runs``
        (after a run idle for run_idle_timeout_s gave its place back, if one has)."""
        key = self._key(resource)
        with self._places:
            run = self._runs.get(key)
            claimed = run is None and key in self._claims  # acknowledged already: taken on
            self._claims.discard(key)
            if run is None and self._runs_accepted + len(self._claims) >= self.config.max_runs:
                idle = sorted(self._idle(), key=lambda r: r.last_seen)
                if idle:  # the longest idle run gives its place back (its folder stays; it is taken on again if it returns)
                    del self._runs[idle[0].key]
                    self._runs_accepted -= 1
                    self._count("runs_given_back")
            if run is None and not claimed and self._runs_accepted + len(self._claims) >= self.config.max_runs:
                self._refuse_past_max_runs()
                return None
            if run is None:
                self._runs_accepted += 1
                run = self._new_run(key, resource)
        run.last_seen = time.monotonic()
        return run

    def _new_run(self, key: tuple, resource: Mapping[str, Any]) -> RunState:
        service = str(resource.get(A.SERVICE_NAME) or "unknown_service")
        run_id = str(resource.get(A.RL_RUN_ID) or "")
        rank = as_rank(resource.get(A.RL_RANK, 0))
        experiment = resource.get(A.RL_EXPERIMENT_NAME)
        framework = resource.get(A.RL_FRAMEWORK)
        run = self._runs[key] = RunState(
            key,
            service,
            run_id,
            rank,
            str(experiment) if experiment else None,
            str(framework) if framework else None,
            last_seen=time.monotonic(),
        )
        return run

    def _refuse_past_max_runs(self) -> None:
        """Say once that new run ids are dropped from now on (nothing on disk is removed)."""
        if self._over_max_runs_said:
            return
        self._over_max_runs_said = True
        self._say(
            f"otel-rl bridge: max_runs ({self.config.max_runs}) reached: that many runs have their own trackers and "
            f"folders (run_dir under {Path(self.config.base_dir).absolute()}); records of further new run ids are dropped and counted "
            "(records_over_max_runs in /stats). The runs already taken on go on as before; raise max_runs in the "
            "bridge's config, or restart the bridge after moving finished runs' folders away"
        )

    def _label(self, run: RunState) -> str:
        base = safe_label(run.run_id or run.service)
        if run.rank and (self.config.ranks is None or len(self.config.ranks) > 1):
            base = f"{base}-rank{run.rank}"
        label, n = base, 1
        while label in self._labels and self._labels[label] != run.key:  # same run id from another service
            n += 1
            label = f"{safe_label(run.service)}-{base}" if n == 2 else f"{base}-{n}"
        self._labels[label] = run.key
        return label

    def _open(self, run: RunState) -> TrackerFanout | None:
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
        kwargs = run_tracker_kwargs(cfg, run.label if cfg.split_runs else None)
        namer = None
        if cfg.tracker_keys == "registry":
            if self._resolver is None:
                from otel_rl._sdk.keys.resolver import KeyResolver

                self._resolver = KeyResolver.default()
            resolver, framework = self._resolver, run.framework
            namer = registry_key_namer(lambda key: resolver.resolve(key, framework))
        self._make_room(run)
        fanout = None
        try:
            fanout = TrackerFanout(create_trackers(cfg.track_with, kwargs, run_name=run_name, run_dir=run_dir), namer)
            fanout.start()
        except Exception as exc:  # one run's trackers failing must not stop the others
            run.failed = True
            self._count("runs_failed")
            if fanout is not None:
                fanout.finish()
            logger.error(
                "otel-rl bridge: the trackers of run %s (service %s, rank %d) could not start: %s; its steps are dropped",
                shown(run.run_id or "?"),
                shown(run.service),
                run.rank,
                self._scrub(f"{type(exc).__name__}: {exc}"),
            )
            return None
        run.fanout = fanout
        run.opened += 1
        if run.opened > 1:
            self._say(f"otel-rl bridge: run {run.label} sends again: its trackers are reopened")
            return fanout
        self._count("runs")
        self._say(
            f"otel-rl bridge: new run {shown(run.run_id) if run.run_id else '(no rl.run.id)'} (service {shown(run.service)}, rank {run.rank}) -> "
            f"run name {shown(run_name)}, run_dir {run_dir}; {format_tracker_kwargs(cfg.track_with, kwargs)}"
        )
        return fanout

    def _write_held(self, run: RunState) -> None:
        held, run.held, run.metrics_mode = run.held, [], True
        fanout = self._open(run)
        if fanout is None:
            return
        for step, values in held:
            fanout.log(values, step)
            self._count("metric_steps_written")
        run.dirty = True
