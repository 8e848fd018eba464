"""``otel-rl recover RUN_DIR``: the metric points a killed run had not exported, rebuilt from its step events.

A run folder gets each step's ``rl.log`` event within ``file_flush_interval_s`` of ``log()``, but
its metric points only every ``metric_export_interval_s`` (a whole metric collection is too costly
to run per step). A process that is SIGKILLed, OOM-killed or preempted in between leaves events
with no metric points after the last export: up to a minute of steps.

Each ``rl.log`` event holds its step's key -> value map and time, so those points can be rebuilt
as the run would have made them: keys go through the same mapping rules, for the run's framework
(``rl.framework`` of the event's resource), values through the same conversions, and each point
is stamped with its step's time (as ``metrics_at_log_time`` stamps them). They are appended to
the same metrics file, under the run's own resource, so every reader (show, analyze, a collector
reading the folder) finds them; a second ``recover`` finds nothing left to do. The next process
that takes the killed one's rank starts this itself (``--before`` its start time: it may write the
folder meanwhile; see ``otel_rl._sdk.lifecycle.run_lock``).

Gauges and counters are rebuilt (a counter continues from the start time of its last exported
point). Histograms are not: their cumulative state also holds what stage spans measured, which no
event carries; their values stay in the events and the spans.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.exporters.files import LOGS_FILE, METRICS_FILE, rank_file_name
from otel_rl.runs.folder import _rank_of, _resolve, read_log_records, read_metrics
from otel_rl.runs.records import Problem

logger = logging.getLogger("otel_rl")

DEFAULT_RESOLUTION_S = 1.0
LARGE_BYTES = 64 * 2**20  # files this large get a line saying they are being read
POINTS_PER_LINE = 2_000  # one OTLP request per line; ~0.5 MB, well under the readers' line limit

DESCRIPTION = """\
Rebuild the metric points a run had not exported when its process died, from its step events.

A run folder gets every step's rl.log event within file_flush_interval_s, but metric points only
every metric_export_interval_s. A process killed in between (SIGKILL, the OOM killer, preemption)
leaves up to that long of steps with events and no metric points. This command maps each of those
events' keys to metrics with the same rules and conversions the run used, stamps each point with
its step's time, and appends the points to the run's metrics file(s). Gauges and counters are
rebuilt; histograms (timers, stage durations) are not: their values stay in the events and spans.
A process that resumes into the same folder runs it by itself, for the rank it takes (with
--before its start). Running it twice adds nothing the second time.
"""


@dataclass
class Recovery:
    """What ``recover`` did for one metrics file."""

    metrics_file: Path
    steps: int = 0  # rl.log events after the last exported point
    first_step: int | None = None
    last_step: int | None = None
    points: int = 0  # points written
    series: int = 0
    histogram_series: int = 0  # histogram series left to the events and spans
    not_numeric: int = 0  # values that map to no point (text, NaN, infinity, a failed conversion)
    skipped: str = ""  # why the file was left alone
    problems: list[Problem] = field(default_factory=list)  # lines the readers skipped

    def summary(self) -> str:
        name = self.metrics_file.name
        if self.skipped:
            return f"{name}: left alone: {self.skipped}"
        if not self.steps:
            return f"{name}: nothing to recover (no step event after the last metric export)"
        steps = f"steps {self.first_step}-{self.last_step}" if self.first_step is not None else "events without a step"
        points, events = _count(self.points, "point"), _count(self.steps, "event")
        text = f"{name}: wrote {points} of {self.series:,} series for {events} after the last metric export ({steps})"
        if self.histogram_series:
            text += f"; {self.histogram_series} histogram series left to the events and spans"
        if self.not_numeric:
            text += f"; {self.not_numeric:,} values were not numbers"
        if self.problems:
            text += f"; skipped {len(self.problems)} unreadable lines (first: {self.problems[0]})"
        return text


RECOVER_LOCK_PREFIX = ".recover.rank"  # held (flock) while a recover rebuilds that rank's points


@contextlib.contextmanager
def _one_recovery(folder: Path, rank: int) -> Iterator[bool]:
    """Whether this is the only ``recover`` of the rank now (a second process that resumes the
    folder while the first one's recovery still runs starts another); the kernel frees the lock
    however the process ends."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        yield True
        return
    with open(folder / f"{RECOVER_LOCK_PREFIX}{rank}", "a") as lock:  # closing it unlocks
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _count(number: int, word: str) -> str:
    return f"{number:,} {word}" if number == 1 else f"{number:,} {word}s"


def _resource_key(resource: dict[str, Any]) -> str:
    return repr(sorted(resource.items()))


def _live_holder(run_dir: Path, rank: int) -> str | None:
    """The PID holding the rank's run-folder lock, or None when no live process does."""
    from otel_rl._sdk.lifecycle.run_lock import RunFolderBusy, lock_path, take

    if not lock_path(run_dir, rank).exists():
        return None
    try:
        take(run_dir, rank).release()
    except RunFolderBusy as busy:
        return busy.holder
    except OSError:
        return None
    return None


class _Rebuilder:
    """Maps events' key -> value maps to (metric, attributes, value) as a run's pipeline does."""

    def __init__(self) -> None:
        from otel_rl._sdk.keys.resolver import KeyResolver
        from otel_rl.semconv import METRICS

        self._resolver = KeyResolver.default()
        self._metrics = METRICS
        self.histograms: set[tuple[str, tuple[Any, ...]]] = set()
        self.not_numeric = 0

    def resolve(self, framework: str | None, body: dict[str, Any]) -> Iterable[tuple[str, str, tuple[Any, ...], float]]:
        """(instrument, metric, attributes, value) of each key of ``body`` that a run exports."""
        from otel_rl._sdk.pipeline.values import Rejected, resolved_number

        for key, raw in body.items():
            res = self._resolver.resolve(key, framework)
            if res.counted_only:
                continue  # past the unmapped-key limit: only a count, as in the run
            mdef = self._metrics.get(res.metric)
            if mdef is None:
                continue
            attrs = tuple(res.attributes)
            if mdef.instrument == "histogram":
                self.histograms.add((res.metric, attrs))
                continue
            try:
                value = resolved_number(res.transform, raw)
            except (Rejected, ArithmeticError):  # ArithmeticError: a conversion overflowed
                self.not_numeric += 1
                continue
            yield mdef.instrument, res.metric, attrs, value


def _thin(times_values: list[tuple[int, float]], time_ns: int, value: float, window_ns: int, origin_ns: int) -> None:
    """Append a point, or replace the last one when both fall in the same ``window_ns``."""
    if times_values and window_ns and (times_values[-1][0] - origin_ns) // window_ns == (time_ns - origin_ns) // window_ns:
        times_values[-1] = (time_ns, value)
    else:
        times_values.append((time_ns, value))


def _recover_file(logs_path: Path, metrics_path: Path, resolution_s: float, before_ns: int | None = None) -> Recovery:
    from otel_rl.semconv import attributes as A
    from otel_rl.semconv import names as N

    report = Recovery(metrics_path)
    points = read_metrics(metrics_path) if metrics_path.exists() else []
    events = read_log_records(logs_path)
    report.problems = list(getattr(points, "problems", [])) + list(events.problems)
    newest: dict[str, int] = {}  # resource -> newest exported point time
    starts: dict[tuple[str, str, tuple[Any, ...]], int] = {}  # a sum series' start time, to continue it
    scopes: dict[str, str] = {}
    for point in points:
        if before_ns is not None and point.time_ns >= before_ns:
            continue  # exported by a process that started after the one being recovered
        key = _resource_key(point.resource)
        newest[key] = max(newest.get(key, 0), point.time_ns)
        scopes.setdefault(key, point.scope)
        if point.kind == "sum":
            starts[(key, point.name, tuple(sorted(point.attributes.items())))] = point.start_time_ns
    rebuilder = _Rebuilder()
    window_ns = int(max(resolution_s, 0.0) * 1e9)
    # resource -> (resource attributes, {(instrument, metric, attributes): [(time, value)]}, first event time)
    rebuilt: dict[str, tuple[dict[str, Any], dict[tuple[str, str, tuple[Any, ...]], list[tuple[int, float]]], int]] = {}
    for record in events:
        if record["event_name"] != N.RL_LOG_EVENT or not isinstance(record["body"], dict):
            continue
        key = _resource_key(record["resource"])
        time_ns = record["timestamp"]
        if time_ns <= newest.get(key, 0) or (before_ns is not None and time_ns >= before_ns):
            continue
        report.steps += 1
        step = record["attributes"].get(A.RL_STEP)
        if isinstance(step, int):
            report.first_step = step if report.first_step is None else min(report.first_step, step)
            report.last_step = step if report.last_step is None else max(report.last_step, step)
        resource, series, origin = rebuilt.setdefault(key, (record["resource"], {}, time_ns))
        for instrument, metric, attrs, value in rebuilder.resolve(record["resource"].get(A.RL_FRAMEWORK), record["body"]):
            _thin(series.setdefault((instrument, metric, attrs), []), time_ns, value, window_ns, origin)
    report.histogram_series = len(rebuilder.histograms)
    report.not_numeric = rebuilder.not_numeric
    if rebuilt:
        report.series = sum(len(series) for _, series, _ in rebuilt.values())
        report.points = _write(metrics_path, rebuilt, starts, scopes)
    return report


def _write(
    metrics_path: Path,
    rebuilt: dict[str, tuple[dict[str, Any], dict[tuple[str, str, tuple[Any, ...]], list[tuple[int, float]]], int]],
    starts: dict[tuple[str, str, tuple[Any, ...]], int],
    scopes: dict[str, str],
) -> int:
    """Append the points (a few thousand per line) to ``metrics_path``; the number written."""
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_rl._sdk.export.providers import SCOPE_NAME
    from otel_rl.exporters.otlp_json import OtlpJsonMetricExporter
    from otel_rl.semconv import METRICS

    exporter = OtlpJsonMetricExporter(metrics_path)
    written = 0
    try:
        for key, (resource_attrs, series, origin) in rebuilt.items():
            resource = Resource(resource_attrs)
            scope = InstrumentationScope(scopes.get(key) or SCOPE_NAME)
            batch: list[Metric] = []
            in_batch = 0
            for (instrument, metric, attrs), times_values in series.items():
                mdef = METRICS[metric]
                start = starts.get((key, metric, tuple(sorted(attrs))), origin)
                for first in range(0, len(times_values), POINTS_PER_LINE):
                    chunk = times_values[first : first + POINTS_PER_LINE]
                    data_points = [
                        NumberDataPoint(
                            attributes=dict(attrs),
                            start_time_unix_nano=None if instrument == "gauge" else start,  # pyright: ignore[reportArgumentType]
                            time_unix_nano=time_ns,
                            value=value,
                        )
                        for time_ns, value in chunk
                    ]
                    if instrument == "gauge":
                        data: Any = Gauge(data_points=data_points)
                    else:
                        data = Sum(
                            data_points=data_points,
                            aggregation_temporality=AggregationTemporality.CUMULATIVE,
                            is_monotonic=instrument == "counter",
                        )
                    batch.append(Metric(name=metric, description=mdef.brief, unit=mdef.unit, data=data))
                    in_batch += len(chunk)
                    if in_batch >= POINTS_PER_LINE:
                        written += _export(exporter, resource, scope, batch, in_batch)
                        batch, in_batch = [], 0
            if batch:
                written += _export(exporter, resource, scope, batch, in_batch)
    finally:
        exporter.shutdown()
    return written


def _export(exporter: Any, resource: Any, scope: Any, batch: list[Any], count: int) -> int:
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData, ResourceMetrics, ScopeMetrics

    data = MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[ScopeMetrics(scope=scope, metrics=batch, schema_url="")], schema_url="")
        ]
    )
    if exporter.export(data) is not MetricExportResult.SUCCESS:
        raise OSError(f"cannot write to {exporter.path} (see the warning above)")
    return count


def recover(
    run_dir: str | os.PathLike[str],
    *,
    resolution_s: float = DEFAULT_RESOLUTION_S,
    say: Callable[[str], None] = print,
    before_ns: int | None = None,
    rank: int | None = None,
) -> list[Recovery]:
    """Rebuild, for every rank of ``run_dir`` (or only ``rank``), the metric points of the step
    events after its last metric export; one :class:`Recovery` per metrics file. ``resolution_s``:
    keep the latest value of each series per this many seconds of step time (0: every step).
    ``before_ns`` (Unix ns): only what was written before then, by a process that has ended since;
    a process that took the folder later may be writing it meanwhile (the one that found its
    predecessor killed starts this). Raises FileNotFoundError when ``run_dir`` is not a run folder."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a run folder")
    reports = []
    for logs in _resolve(folder, LOGS_FILE):
        logs_path = Path(logs)
        if not logs_path.exists():
            continue
        file_rank = _rank_of(logs_path.name)
        if rank is not None and file_rank != rank:
            continue
        metrics_path = folder / rank_file_name(METRICS_FILE, file_rank)
        holder = None if before_ns is not None else _live_holder(folder, file_rank)
        if holder is not None:
            report = Recovery(metrics_path, skipped=f"process {holder} is still writing rank {file_rank} of this run folder")
        else:
            with _one_recovery(folder, file_rank) as alone:
                if not alone:  # two at once would both append the same points
                    report = Recovery(metrics_path, skipped=f"another otel-rl recover is rebuilding rank {file_rank} of this run folder")
                else:
                    size = sum(p.stat().st_size for p in (logs_path, metrics_path) if p.exists())
                    if size > LARGE_BYTES:  # reading takes a while: say what is being read
                        say(f"reading {logs_path.name} and {metrics_path.name} ({size / 2**20:,.0f} MiB)...")
                    report = _recover_file(logs_path, metrics_path, resolution_s, before_ns)
        say(report.summary())
        reports.append(report)
    if not reports:
        say(f"{folder}: no {LOGS_FILE} here: nothing to recover from")
    return reports


def _cmd_recover(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        reports = recover(args.run_dir, resolution_s=args.resolution, before_ns=args.before, rank=args.rank)
    except (FileNotFoundError, OSError) as exc:
        print(f"otel-rl recover: {exc}", file=sys.stderr)
        return 1
    return 1 if not reports or any(r.skipped for r in reports) else 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``otel-rl recover`` to the ``otel-rl`` command's subparsers."""
    parser = subparsers.add_parser(
        "recover",
        help="rebuild the metric points a killed run had not exported, from its step events",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (every rank's files in it are recovered)")
    parser.add_argument(
        "--resolution",
        type=float,
        default=DEFAULT_RESOLUTION_S,
        metavar="S",
        help=f"keep each series' latest value per S seconds of step time; 0 keeps every step (default {DEFAULT_RESOLUTION_S:g})",
    )
    parser.add_argument("--rank", type=int, metavar="N", help="only rank N's files (default: every rank's)")
    parser.add_argument(
        "--before",
        type=int,
        metavar="UNIX_NS",
        help="only the events and metric points written before this time (Unix epoch ns), when a later process took "
        "the folder: that process may be writing it meanwhile (an otel-rl process that finds its predecessor killed "
        "runs this itself)",
    )
    parser.set_defaults(func=_cmd_recover)
    return parser
