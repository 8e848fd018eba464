"""Replay a training log through otel-rl telemetry, step by step, with each step's original time.

One file is one run: its run id is derived from the file's content and the resource it is sent
with (``replay-<16 hex>``), so replaying the same file again writes the same run id and series.
The run folder gets a ``replay.json`` marker once a replay completed; a second replay of the same
content into the same run folder is skipped (``force=True`` replays again, replacing that
folder's signal files). The marker is kept in the run folder path even when only OTLP is
exported, so a repeated push to a collector is caught as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID

from otel_rl._sdk.config import resolve_config
from otel_rl.integrations.verl_timers import step_stages
from otel_rl.replay._formats import FRAMEWORK_OF, parse_file, parse_timestamp
from otel_rl.replay._log import CLOCK_DURATIONS, CLOCK_ELAPSED, CLOCK_NONE, CLOCK_TIMESTAMP, ParsedLog
from otel_rl.replay.progress import Progress
from otel_rl.runs.folder import LOGS_FILE, METRICS_FILE, TRACES_FILE, format_problems

__all__ = ["DEFAULT_START", "MARKER_FILE", "ReplayResult", "parse_summary", "replay_file", "replay_files", "run_id_for"]

MARKER_FILE = "replay.json"
DEFAULT_START = "2025-01-01T00:00:00Z"  # the synthetic clock's origin: fixed, so replays are repeatable
DEFAULT_STEP_SECONDS = 60.0
# Records logged between flushes. The SDK's batch log processor holds 2048 records and drops the
# rest, so the replay waits for the exporters well before that.
CHUNK = 500
_SIGNAL_FILES = (TRACES_FILE, METRICS_FILE, LOGS_FILE, "run.json")


@dataclass
class ReplayResult:
    """What one file's replay did."""

    path: Path
    format: str
    framework: str | None
    run_id: str
    run_dir: Path | None  # where the marker (and, with the file exporter, the signals) live
    records: int = 0
    points: int = 0
    traces: int = 0  # steps rebuilt as traces from their stage timers (verl's timing_s/*)
    skipped: bool = False  # already replayed: nothing was sent
    seconds: float = 0.0  # wall time of the logging phase, flushes included
    parse_seconds: float = 0.0
    clock: str = CLOCK_NONE
    clock_text: str = ""
    destinations: list[str] = field(default_factory=list)
    parsed: ParsedLog | None = None

    @property
    def points_per_second(self) -> float:
        return self.points / self.seconds if self.seconds > 0 else 0.0


def parse_start(text: str) -> int:
    """``2025-01-01T00:00:00Z`` (or ``...+08:00``, or a date) as Unix nanoseconds."""
    raw = text.strip()
    if len(raw) == 10:  # a bare date
        raw += "T00:00:00Z"
    ns = parse_timestamp(raw)
    if ns is None:
        raise ValueError(f"--start-time {text!r} is not a time like 2025-01-01T00:00:00Z")
    return ns


def run_id_for(content_hash: str, *, format: str, framework: str | None, service_name: str, experiment: str | None) -> str:
    """The run id of a replay: the same file sent with the same resource always gets the same id."""
    digest = hashlib.sha256()
    for part in (content_hash, format, framework or "", service_name, experiment or ""):
        digest.update(part.encode("utf-8") + b"\0")
    return f"replay-{digest.hexdigest()[:16]}"


def _content_hash(path: Path) -> str:
    digest = hashlib.sha256()
    source = path / LOGS_FILE if path.is_dir() else path
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _clock_text(parsed: ParsedLog, start_ns: int, step_seconds: float) -> str:
    origin = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_ns / 1e9))
    if parsed.clock == CLOCK_TIMESTAMP:
        return "time: the timestamps in the log"
    if parsed.clock == CLOCK_ELAPSED:
        return f"time: the log's elapsed time, from {origin} (--start-time)"
    if parsed.clock == CLOCK_DURATIONS:
        return f"time: the sum of the log's step durations (timing_s/step), from {origin} (--start-time)"
    return f"time: synthetic, {origin} + step x {step_seconds:g} s (--start-time, --step-seconds): the log holds no times"


def _times(parsed: ParsedLog, start_ns: int, step_seconds: float) -> list[int]:
    if parsed.clock == CLOCK_TIMESTAMP:
        return [int(r.time_ns or 0) for r in parsed.records]
    if parsed.clock in (CLOCK_ELAPSED, CLOCK_DURATIONS):
        return [start_ns + int(round((r.elapsed_s or 0.0) * 1e9)) for r in parsed.records]
    step_ns = int(round(step_seconds * 1e9))
    return [start_ns + r.step * step_ns for r in parsed.records]


def _read_marker(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _clear_run_folder(run_dir: Path) -> list[str]:
    removed = []
    for name in _SIGNAL_FILES:
        stem, _, ext = name.rpartition(".")
        for path in [run_dir / name, *run_dir.glob(f"{stem}.rank*.{ext}")]:
            if path.is_file():
                path.unlink()
                removed.append(path.name)
    return removed


def replay_file(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    service_name: str | None = None,
    experiment: str | None = None,
    run_id: str | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    exporters: str | None = None,
    start_time: str = DEFAULT_START,
    step_seconds: float = DEFAULT_STEP_SECONDS,
    force: bool = False,
    progress: bool | None = None,
    out: IO[str] | None = None,
    parsed: ParsedLog | None = None,
    segment: int | None = None,
) -> ReplayResult:
    """Send every step of one log through ``otel_rl.init(...)`` telemetry with its original time.

    ``progress``: a progress bar on stderr (None: only on a terminal). ``out``: where the summary
    lines go (default stdout). ``segment``: which run of a file that holds several (1-based;
    default: the last RL run). Returns a :class:`ReplayResult`; ``skipped`` when the run folder's
    marker shows this content was replayed already (``force=True`` replays it again).
    """
    import otel_rl

    out = out if out is not None else cast(IO[str], sys.stdout)  # typeshed: TextIO | MaybeNone
    p = Path(path)
    start_ns = parse_start(start_time)
    if not step_seconds > 0:
        raise ValueError(f"--step-seconds must be positive, got {step_seconds}")
    t0 = time.perf_counter()
    parsed = parsed if parsed is not None else parse_file(p, format, segment=segment)
    parse_seconds = time.perf_counter() - t0
    for doubt in parsed.doubts:  # first, before anything is sent: the steps below may be wrong
        out.write(f"otel-rl replay: WARNING: {p}: {doubt}\n")
    framework = parsed.framework if parsed.framework else FRAMEWORK_OF.get(parsed.format)
    service = service_name or os.environ.get("OTEL_SERVICE_NAME") or f"otel-rl-replay-{parsed.format}"
    content_hash = _content_hash(p)
    rid = run_id or run_id_for(content_hash, format=parsed.format, framework=framework, service_name=service, experiment=experiment)
    # metrics_at_log_time: every step's values land at the step's own time in the metrics store
    options: dict[str, Any] = {"service_name": service, "run_id": rid, "console": False, "metrics_at_log_time": True}
    for name, value in (
        ("experiment", experiment),
        ("framework", framework),
        ("run_dir", run_dir),
        ("endpoint", endpoint),
        ("protocol", protocol),
        ("exporters", exporters),
    ):
        if value is not None:
            options[name] = str(value) if isinstance(value, os.PathLike) else value
    config = resolve_config(options)
    folder = Path(str(config.run_dir))
    result = ReplayResult(
        path=p,
        format=parsed.format,
        framework=framework,
        run_id=rid,
        run_dir=folder,
        clock=parsed.clock,
        clock_text=_clock_text(parsed, start_ns, step_seconds),
        parse_seconds=parse_seconds,
        parsed=parsed,
    )

    source_dir = p if p.is_dir() else p.parent
    if parsed.format == "otel-rl" and folder.resolve() == source_dir.resolve():
        raise ValueError(
            f"{p} is the run folder being written: replaying it into itself would replace it; "
            "pass another --run-dir (or an OTLP --endpoint)"
        )
    marker = _read_marker(folder)
    if marker is not None and marker.get("sha256") == content_hash and marker.get("completed") and not force:
        result.skipped = True
        out.write(
            f"otel-rl replay: {p}: already replayed into {folder} ({MARKER_FILE}, {marker.get('records')} records, "
            f"{marker.get('replayed_at')}); nothing sent. --force replays it again, replacing that folder's files.\n"
        )
        return result
    if marker is not None or force:
        removed = _clear_run_folder(folder) if folder.is_dir() else []
        why = "--force" if force else ("an unfinished replay" if not marker.get("completed") else "different content")  # type: ignore[union-attr]
        if removed:
            out.write(f"otel-rl replay: {p}: replacing {', '.join(removed)} in {folder} ({why})\n")
    folder.mkdir(parents=True, exist_ok=True)
    _write_marker(folder, p, parsed, content_hash, rid, completed=False)

    times = _times(parsed, start_ns, step_seconds)
    with _instance_id(rid):
        tel = otel_rl.init(**options)
    result.destinations = list(getattr(tel._providers, "destinations", []))
    bar = Progress(len(parsed.records), f"replay {p.name}", enabled=progress)
    t1 = time.perf_counter()
    points = 0
    try:
        log = tel.log
        stage_timers = _STAGE_TIMERS.get(framework or "")
        pending = 0
        for record, when in zip(parsed.records, times):
            log(record.values, record.step, time_ns=when)
            if stage_timers is not None and record.step is not None:
                stages, step_s = stage_timers(record.values)
                if stages:  # the step's trace, ending at the step's own time
                    tel.trace_finished_step(record.step, stages, step_seconds=step_s, end_time_ns=when)
                    result.traces += 1
            n = len(record.values)
            points += n
            pending += 1
            if pending >= CHUNK:
                tel.flush()
                bar.update(pending, points - bar.points)
                pending = 0
        tel.flush()
        bar.update(pending, points - bar.points)
    finally:
        tel.shutdown()
        bar.close()
    result.seconds = time.perf_counter() - t1
    result.records = len(parsed.records)
    result.points = points
    _write_marker(folder, p, parsed, content_hash, rid, completed=True)
    _summary(result, out)
    return result


@contextlib.contextmanager
def _instance_id(run_id: str) -> Iterator[None]:
    """The SDK gives every process a random ``service.instance.id``; a replay uses its run id
    instead (through OTEL_RESOURCE_ATTRIBUTES, which the SDK reads once, at resource creation), so
    a second replay of the same file carries the same resource."""
    name = "OTEL_RESOURCE_ATTRIBUTES"
    previous = os.environ.get(name)
    entry = f"{SERVICE_INSTANCE_ID}={run_id}"
    os.environ[name] = f"{previous},{entry}" if previous else entry
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _write_marker(folder: Path, path: Path, parsed: ParsedLog, content_hash: str, run_id: str, *, completed: bool) -> None:
    steps = [r.step for r in parsed.records]
    marker = {
        "source": str(path.resolve()),
        "sha256": content_hash,
        "format": parsed.format,
        "run_id": run_id,
        "records": len(parsed.records),
        "points": parsed.points,
        "completed": completed,
        "steps": {"first": steps[0], "last": steps[-1], "count": len(steps)} if steps else None,
        "segment": next((r.segment for r in parsed.records), None),
        "segments": len(parsed.segments) or 1,
        "step_source": parsed.step_source or None,
        "doubts": parsed.doubts,
        "replayed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


# Frameworks whose logs time each step's stages: their steps are replayed as traces too.
_STAGE_TIMERS: dict[str, Callable[[Mapping[str, Any]], tuple[list[Any], Any]]] = {"verl": step_stages}


def parse_summary(parsed: ParsedLog) -> list[str]:
    """What was read and how sure it is, doubts first: the lines replay and analyze print before anything else."""
    lines = [f"WARNING: {doubt}" for doubt in parsed.doubts]
    check = parsed.check
    if check is not None and check.steps:
        per_step = (
            "one record per step" if check.max_records_per_step <= 1 else f"up to {check.max_records_per_step} records per step (merged)"
        )
        order = "steps in order" if check.monotonic else f"the step went back {check.steps_went_back} time(s)"
        planned = parsed.settings.get("max_steps")
        against = f"; the log plans {planned} steps" if isinstance(planned, int) else ""
        lines.append(
            f"read: steps {check.first_step}-{check.last_step} ({check.steps:,} steps, {per_step}, {order}{against}); {check.lines_text()}"
        )
    if parsed.step_source:
        lines.append(f"steps from {parsed.step_source}")
    return lines


def _summary(result: ReplayResult, out: IO[str]) -> None:
    parsed = result.parsed
    assert parsed is not None
    bad = len(parsed.problems)
    check = parsed.check
    span = f" ({check.first_step}-{check.last_step})" if check is not None and check.steps else ""
    out.write(
        f"otel-rl replay: {result.path} ({result.format}, keys mapped as {result.framework or 'any framework'}): "
        f"{result.records:,} steps{span}, {result.points:,} values, {bad} malformed line{'s' if bad != 1 else ''} skipped\n"
    )
    for line in parse_summary(parsed):
        out.write(f"  {line}\n")
    if parsed.problems:
        out.write(f"  {format_problems(parsed.problems, limit=5)}\n")
        for problem in parsed.problems[:5]:
            out.write(f"    {problem}\n")
    for note in parsed.notes[:5]:
        out.write(f"  note: {note}\n")
    out.write(f"  {result.clock_text}\n")
    if result.traces:
        out.write(f"  {result.traces:,} steps traced from their stage timers (spans marked rl.span.reconstructed)\n")
    where = ", ".join(result.destinations) if result.destinations else "nowhere"
    out.write(f"  run id {result.run_id} -> {where}\n")
    out.write(f"  {result.points_per_second:,.0f} values/s ({result.seconds:.2f} s sending, {result.parse_seconds:.2f} s reading)\n")


def replay_files(paths: Sequence[str | os.PathLike[str]], **options: Any) -> list[ReplayResult]:
    """:func:`replay_file` for each path (each file is its own run)."""
    if options.get("run_id") and len(paths) > 1:
        raise ValueError("--run-id names one run: give one FILE, or leave --run-id out so each file gets its own")
    if options.get("run_dir") and len(paths) > 1:
        raise ValueError("--run-dir names one run folder: give one FILE, or leave --run-dir out")
    return [replay_file(path, **options) for path in paths]
