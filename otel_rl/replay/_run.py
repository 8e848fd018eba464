"""Replay a training log through otel-rl telemetry, step by step, with each step's original time.

One file is one run: its run id is derived from the file's content and the resource it is sent
with (``replay-<16 hex>``), so replaying the same file again writes the same run id and series.
The run folder gets a ``replay.json`` marker once a replay completed, naming the destinations it
reached (the folder's files, an OTLP endpoint); a second replay of the same content to the same
destinations is skipped, one to a new destination is sent (``force=True`` replays it again; the
folder's signal files are replaced only when this replay writes files, and each one removed is
named). The marker is kept in the run folder path even when only OTLP is exported, so a
repeated push to a collector is caught as well.

Without ``start_time`` the clock is placed so that the replayed run ends now: a metrics store
keeps only its retention, and a fixed origin in the past would fall outside it.
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

from otel_rl._sdk.lifecycle.run_lock import RUN_INFO_FILE
from otel_rl._sdk.settings.config import resolve_config
from otel_rl._sdk.settings.redaction import redact_url
from otel_rl.integrations.verl_timers import step_stages
from otel_rl.replay._formats import FRAMEWORK_OF, parse_file, parse_timestamp
from otel_rl.replay._log import CLOCK_DURATIONS, CLOCK_ELAPSED, CLOCK_NONE, CLOCK_TIMESTAMP, ParsedLog
from otel_rl.replay.progress import Progress
from otel_rl.replay.target import ReplayNotStored, ReplayTarget, samples_of, window_problem
from otel_rl.runs.folder import LOGS_FILE, METRICS_FILE, TRACES_FILE, format_problems

__all__ = ["DEFAULT_START", "MARKER_FILE", "ReplayResult", "parse_summary", "replay_file", "replay_files", "run_id_for"]

MARKER_FILE = "replay.json"
DEFAULT_START = None  # no fixed origin: the replayed run ends now (--start-time gives a repeatable one)
READBACK_DEADLINE_S = 30.0  # a store makes new series searchable within seconds (VictoriaMetrics: up to ~10 s)
FILES = "files"  # the run folder's own signal files, as a destination in the marker
DEFAULT_STEP_SECONDS = 60.0
# Records logged between flushes. The SDK's batch log processor holds 2048 records and drops the
# rest, so the replay waits for the exporters well before that.
CHUNK = 500
_SIGNAL_FILES = (TRACES_FILE, METRICS_FILE, LOGS_FILE, RUN_INFO_FILE)


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
    samples: int = 0  # metric samples sent, as a Prometheus-style store counts them
    stored: int | None = None  # of those, read back from the target (None: not read back)
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


def _clock_text(parsed: ParsedLog, start_ns: int, step_seconds: float, fixed: bool = True) -> str:
    origin = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_ns / 1e9))
    origin = f"{origin} (--start-time)" if fixed else f"{origin}, so that the last step is now (--start-time fixes it)"
    if parsed.clock == CLOCK_TIMESTAMP:
        return "time: the timestamps in the log"
    if parsed.clock == CLOCK_ELAPSED:
        return f"time: the log's elapsed time, from {origin}"
    if parsed.clock == CLOCK_DURATIONS:
        return f"time: the sum of the log's step durations (timing_s/step), from {origin}"
    return f"time: synthetic, step x {step_seconds:g} s (--step-seconds) from {origin}: the log holds no times"


def _offsets(parsed: ParsedLog, step_seconds: float) -> list[int] | None:
    """Each record's time from the clock's origin (ns); None when the log's own timestamps are the times."""
    if parsed.clock == CLOCK_TIMESTAMP:
        return None
    if parsed.clock in (CLOCK_ELAPSED, CLOCK_DURATIONS):
        return [int(round((r.elapsed_s or 0.0) * 1e9)) for r in parsed.records]
    step_ns = int(round(step_seconds * 1e9))
    return [r.step * step_ns for r in parsed.records]


def _origin(parsed: ParsedLog, step_seconds: float, now_ns: int | None = None) -> int:
    """The clock's origin that puts the replayed run's last step at ``now_ns`` (default: now)."""
    offsets = _offsets(parsed, step_seconds)
    now = time.time_ns() if now_ns is None else now_ns
    return now - max(offsets, default=0) if offsets else now


def _times(parsed: ParsedLog, start_ns: int, step_seconds: float) -> list[int]:
    offsets = _offsets(parsed, step_seconds)
    if offsets is None:
        return [int(r.time_ns or 0) for r in parsed.records]
    return [start_ns + offset for offset in offsets]


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


def _destinations(config: Any) -> list[str]:
    """Where this replay's data goes, as the marker records it: the folder's files, each OTLP endpoint."""
    found = [FILES] if config.file_enabled else []
    if config.otlp_enabled:
        found.append(f"otlp {config.protocol} {redact_url(config.endpoint) or '(the OTLP default endpoint)'}")
    return found


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
    start_time: str | None = DEFAULT_START,
    step_seconds: float = DEFAULT_STEP_SECONDS,
    force: bool = False,
    progress: bool | None = None,
    out: IO[str] | None = None,
    parsed: ParsedLog | None = None,
    segment: int | None = None,
    target_for: Callable[[str | None], ReplayTarget | None] | None = None,
) -> ReplayResult:
    """Send every step of one log through ``otel_rl.init(...)`` telemetry with its original time.

    ``start_time``: the origin of elapsed and synthetic clocks (default: the replayed run ends
    now). ``progress``: a progress bar on stderr (None: only on a terminal). ``out``: where the
    summary lines go (default stdout). ``segment``: which run of a file that holds several
    (1-based; default: the last RL run). ``target_for(endpoint)``: the store behind an OTLP
    endpoint (None when unknown); with one, points outside its retention are refused before
    anything is sent, and what it stored is read back after (ReplayNotStored when short). Returns a
    :class:`ReplayResult`; ``skipped`` when the run folder's marker shows this content reached
    the same destinations already (``force=True`` replays it again).
    """
    import otel_rl

    out = out if out is not None else cast(IO[str], sys.stdout)  # typeshed: TextIO | MaybeNone
    p = Path(path)
    fixed_clock = start_time is not None
    if not step_seconds > 0:
        raise ValueError(f"--step-seconds must be positive, got {step_seconds}")
    start_ns = parse_start(start_time) if start_time is not None else 0
    t0 = time.perf_counter()
    parsed = parsed if parsed is not None else parse_file(p, format, segment=segment)
    parse_seconds = time.perf_counter() - t0
    if not fixed_clock:
        start_ns = _origin(parsed, step_seconds)
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
        clock_text=_clock_text(parsed, start_ns, step_seconds, fixed_clock),
        parse_seconds=parse_seconds,
        parsed=parsed,
    )

    source_dir = p if p.is_dir() else p.parent
    if parsed.format == "otel-rl" and folder.resolve() == source_dir.resolve():
        raise ValueError(
            f"{p} is the run folder being written: replaying it into itself would replace it; "
            "pass another --run-dir (or an OTLP --endpoint)"
        )
    destinations = _destinations(config)
    marker = _read_marker(folder)
    reached = _reached(marker, content_hash)
    if marker is not None and not force and destinations and set(destinations) <= reached:
        result.skipped = True
        out.write(
            f"otel-rl replay: {p}: already replayed to {', '.join(_destination_text(d, folder) for d in destinations)} "
            f"({folder / MARKER_FILE}, {marker.get('records')} records, {marker.get('replayed_at')}); nothing sent. "
            "--force replays it again.\n"
        )
        return result

    times = _times(parsed, start_ns, step_seconds)
    target = target_for(config.endpoint) if target_for is not None and config.otlp_enabled else None
    if config.otlp_enabled and target is None:
        _warn_unknown_retention(out)
    if target is not None and times:
        problem = window_problem(target, min(times), max(times), fixed_clock=fixed_clock and parsed.clock != CLOCK_TIMESTAMP)
        if problem is not None:
            raise ValueError(problem)

    if FILES in destinations and folder.is_dir() and (marker is not None or force):
        # This replay writes the folder's signal files: an earlier replay's are replaced, each named.
        removed = _clear_run_folder(folder)
        why = "--force" if force else ("an unfinished replay" if not marker.get("completed") else "a new destination or content")  # type: ignore[union-attr]
        if removed:
            out.write(f"otel-rl replay: {p}: replacing {', '.join(removed)} in {folder} ({why})\n")
    folder.mkdir(parents=True, exist_ok=True)
    keep = sorted(reached - {FILES}) if FILES in destinations else sorted(reached)  # files just replaced no longer count
    _write_marker(folder, p, parsed, content_hash, rid, completed=False, destinations=keep)

    with _instance_id(rid):
        tel = otel_rl.init(**options)
    result.destinations = list(getattr(tel._providers, "destinations", []))
    # A consumer of the points stamped at log time of its own: what was sent, counted as a store
    # counts it, to read back from the target. Without a target none is registered: building every
    # point again for it halved replay's throughput.
    stamped = getattr(tel, "_stamped", None) if target is not None else None
    consumer = stamped.register() if stamped is not None else None
    sent_ms: set[int] = set()

    def count_sent() -> None:
        if stamped is not None and consumer is not None:
            n, ms = samples_of(stamped.take(consumer))
            result.samples += n
            sent_ms.update(ms)

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
                count_sent()
                bar.update(pending, points - bar.points)
                pending = 0
        tel.flush()
        count_sent()
        bar.update(pending, points - bar.points)
    finally:
        tel.shutdown()
        count_sent()
        bar.close()
    result.seconds = time.perf_counter() - t1
    result.records = len(parsed.records)
    result.points = points
    verified = destinations
    if target is not None:
        result.stored = target.count_stored(rid, sorted(sent_ms), result.samples, READBACK_DEADLINE_S)
        if result.stored < result.samples:
            verified = [d for d in destinations if not d.startswith("otlp ")]
    _write_marker(folder, p, parsed, content_hash, rid, completed=True, destinations=sorted(set(keep) | set(verified)))
    _summary(result, out)
    if target is not None:
        assert result.stored is not None
        if result.stored < result.samples:
            raise ReplayNotStored(
                f"{target.description} holds {result.stored:,} of the {result.samples:,} metric samples sent "
                f"(run id {rid}, read back for {READBACK_DEADLINE_S:.0f} s); the rest was dropped. Its log says why "
                "(for example samples outside its retention)"
            )
        out.write(f"  stored: {result.stored:,} of {result.samples:,} metric samples, read back from {target.description}\n")
    return result


_UNKNOWN_RETENTION_SAID: list[bool] = []


def _warn_unknown_retention(out: IO[str]) -> None:
    """Once per process: a store past an unknown endpoint may drop old points without an error reaching the replay."""
    if not _UNKNOWN_RETENTION_SAID:
        _UNKNOWN_RETENTION_SAID.append(True)
        out.write(
            "otel-rl replay: WARNING: the OTLP endpoint's retention is unknown here: a metrics store drops points older than "
            "what it keeps, and the replay is not told. Points are not read back (they are, into the local stack's endpoint)\n"
        )


def _reached(marker: Mapping[str, Any] | None, content_hash: str) -> set[str]:
    """The destinations a completed replay of this content reached (none for other content)."""
    if marker is None or marker.get("sha256") != content_hash or not marker.get("completed"):
        return set()  # other content, or a replay that did not finish: nothing is known to have arrived
    found = marker.get("destinations")
    if not isinstance(found, list):  # a marker written before destinations were recorded: the folder's files
        return {FILES} if marker.get("completed") else set()
    return {str(d) for d in found}


def _destination_text(destination: str, folder: Path) -> str:
    return str(folder) if destination == FILES else destination.removeprefix("otlp ")


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


def _write_marker(
    folder: Path, path: Path, parsed: ParsedLog, content_hash: str, run_id: str, *, completed: bool, destinations: Sequence[str] = ()
) -> None:
    steps = [r.step for r in parsed.records]
    marker = {
        "source": str(path.resolve()),
        "sha256": content_hash,
        "format": parsed.format,
        "run_id": run_id,
        "records": len(parsed.records),
        "points": parsed.points,
        "completed": completed,
        "destinations": list(destinations),  # where a completed replay of this content arrived (OTLP: read back when possible)
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
    for line in parse_summary(parsed)[len(parsed.doubts) :]:  # its doubts were printed first, before anything was sent
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
