"""Steps' traces as Chrome Trace Event JSON (what ui.perfetto.dev and chrome://tracing open), with
memory snapshots as counter tracks and torch.profiler traces merged on tracks of their own.

The layout (``otel-rl trace RUN_DIR --steps 3-7 --format chrome --out steps.json``):

- one process per rank: ``pid`` = the span's ``rl.rank`` (``process_name`` metadata ``"rank N"``);
- one thread per ``rl.cluster`` in that rank (``thread_name`` = the cluster; spans with no cluster,
  the ``rl.step`` root among them, sit on a ``"step"`` thread). A span without the attribute (a
  user's span inside a stage) sits on its parent's thread so it nests under it. Spans of one thread
  that overlap without nesting (two concurrent stages of one cluster) go to extra threads
  ``"<cluster> (2)"``, because a viewer draws one thread as a strict stack;
- each span a complete event (``"ph": "X"``, ``ts``/``dur`` in microseconds, ``args`` = its
  attributes plus its ids), each span event an instant on the span's thread, and each
  ``rl.memory.snapshot`` also counter samples (``"ph": "C"``) on the rank's process:
  ``"process memory"`` (``rss``, ``vms``) and ``"gpu <hw.id> memory"`` (``allocated``,
  ``reserved``, ``max_allocated``, ``max_reserved``), all in bytes.

Thread ids are unique across the file (Perfetto keys a thread by its tid), so a cluster's tid
differs between ranks; the names carry the meaning.

Agent trajectories (traces of their own, ``rl.trajectory`` roots with ``rl.turn`` / ``rl.tool``
children) get a thread each in their rank's process, after the clusters' threads and in start
order, named ``trajectory <rl.sample.id> (step N, <why it was kept>)``; their turns and tool calls
are slices nested under the trajectory's.

Times: spans are Unix-epoch nanoseconds. A torch.profiler (Kineto) trace stores ``ts`` in
microseconds relative to its top-level ``baseTimeNanoseconds`` (Unix epoch ns): ``ts * 1000 +
baseTimeNanoseconds`` is the event's wall-clock time, the clock the spans use. Older exports with
no base wrote Unix-epoch microseconds directly. Both are placed on the spans' clock; the output
uses the same convention (its ``baseTimeNanoseconds`` is the earliest event), so ``ts`` stays
small enough for microsecond floats to keep nanoseconds.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_rl.runs.records import SpanRecord
from otel_rl.runs.trajectories import TRAJECTORY_SPAN_NAMES
from otel_rl.runs.waterfall import STEP_SPAN_NAME, _ranges, _step_of, find_step_trace
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = [
    "ChromeTraceSummary",
    "ProfileError",
    "TorchProfile",
    "load_torch_profile",
    "parse_steps",
    "step_traces",
    "to_chrome_trace",
    "write_chrome_trace",
]

STEP_THREAD = "step"  # the thread of spans that carry no rl.cluster (the step root)
_TRAJECTORY_TRACK = "\0trajectory "  # + the trace id: a thread key no rl.cluster value can take
_EPOCH_US_FLOOR = 1e15  # microseconds since 1970 pass this in 2001: an older export's absolute ts
_FLOW_ID_STRIDE = 1 << 40  # keeps each merged profile's flow ids apart (and below 2**53 for JS readers)
_PROFILE_METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
_CPU_COUNTERS = ((A.RL_MEMORY_RSS, "rss"), (A.RL_MEMORY_VMS, "vms"))
_GPU_COUNTERS = (
    (A.RL_MEMORY_ALLOCATED, "allocated"),
    (A.RL_MEMORY_RESERVED, "reserved"),
    (A.RL_MEMORY_MAX_ALLOCATED, "max_allocated"),
    (A.RL_MEMORY_MAX_RESERVED, "max_reserved"),
)


class ProfileError(ValueError):
    """A --profile file that cannot be merged; the message names the file and the fix."""


# --------------------------------------------------------------------------------------------
# Picking the steps
# --------------------------------------------------------------------------------------------


def parse_steps(text: str) -> list[int]:
    """``"3-7"`` -> ``[3, 4, 5, 6, 7]``; also ``"3"`` and lists ``"1,4-5"``. Raises ``ValueError``."""
    steps: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise ValueError(f"bad step range {text!r}: write N, N-M or a list like 1,4-6") from None
        if hi < lo:
            raise ValueError(f"bad step range {part!r}: the first step is past the last")
        steps.update(range(lo, hi + 1))
    return sorted(steps)


def step_traces(spans: Sequence[SpanRecord], steps: Iterable[int]) -> tuple[list[SpanRecord], list[int]]:
    """The spans of each of ``steps``' traces (``find_step_trace``) and the steps that have none.

    Raises ``LookupError`` naming the steps available when none of ``steps`` has a trace.
    """
    wanted = list(steps)
    found: list[SpanRecord] = []
    missing: list[int] = []
    for step in wanted:
        try:
            found.extend(find_step_trace(spans, step))
        except LookupError:
            missing.append(step)
    if not found:
        available = [s for s in (_step_of(x) for x in spans if x.name == STEP_SPAN_NAME and x.parent_span_id is None) if s is not None]
        what = f"step {wanted[0]}" if len(wanted) == 1 else f"steps {_ranges(wanted)}"
        if available:
            raise LookupError(f"no {STEP_SPAN_NAME!r} trace for {what}; steps available: {_ranges(available)}")
        raise LookupError(f"no {STEP_SPAN_NAME!r} trace for {what}: no {STEP_SPAN_NAME!r} root spans among {len(spans)} spans")
    return found, missing


# --------------------------------------------------------------------------------------------
# torch.profiler traces
# --------------------------------------------------------------------------------------------


@dataclass
class TorchProfile:
    """A Chrome trace written by torch.profiler, with the offset that puts it on the Unix clock."""

    path: str
    events: list[dict[str, Any]]
    base_ns: int  # Unix-epoch ns of ts == 0
    rank: int | None = None  # distributedInfo.rank when torch.distributed was initialised

    def unix_ns(self, ts: Any) -> int:
        return int(round(float(ts) * 1000.0)) + self.base_ns


def load_torch_profile(path: str | os.PathLike[str]) -> TorchProfile:
    """Read a ``export_chrome_trace`` / ``tensorboard_trace_handler`` file (``.json`` or ``.json.gz``)."""
    name = os.fspath(path)
    try:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(name, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ProfileError(f"profile {name} does not exist: pass the file torch.profiler's export_chrome_trace() wrote") from None
    except (OSError, ValueError, EOFError) as exc:
        raise ProfileError(f"profile {name} is not a JSON Chrome trace ({exc}): pass the file export_chrome_trace() wrote") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"profile {name} has no 'traceEvents' list: pass the file torch.profiler's export_chrome_trace() wrote")
    events = [e for e in events if isinstance(e, dict) and isinstance(e.get("ph"), str)]
    base = data.get("baseTimeNanoseconds") if isinstance(data, dict) else None
    if isinstance(base, (int, float)) and not isinstance(base, bool) and base > 0:
        base_ns = int(base)
    else:
        stamps = [float(e["ts"]) for e in events if isinstance(e.get("ts"), (int, float)) and e["ph"] != "M"]
        if stamps and min(stamps) < _EPOCH_US_FLOOR:
            raise ProfileError(
                f"profile {name} has no 'baseTimeNanoseconds' and its ts are not Unix-epoch microseconds, so it cannot be "
                "placed on the spans' clock: export it with torch.profiler's export_chrome_trace() or tensorboard_trace_handler"
            )
        base_ns = 0
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    return TorchProfile(name, events, base_ns, rank if isinstance(rank, int) and not isinstance(rank, bool) else None)


# --------------------------------------------------------------------------------------------
# The conversion
# --------------------------------------------------------------------------------------------


@dataclass
class ChromeTraceSummary:
    """What went into the file, for the CLI to print."""

    spans: int = 0
    counters: int = 0
    trajectories: int = 0  # agent trajectories, each on a thread of its own
    ranks: list[int] = field(default_factory=list)
    window_ns: tuple[int, int] = (0, 0)  # the spans' first start and last end (Unix ns)
    profiles: list[tuple[str, int, int]] = field(default_factory=list)  # (path, events merged, events outside the window)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


class _Layout:
    """Ranks, threads and lanes of the spans; tids unique across the whole file."""

    def __init__(self, spans: Sequence[SpanRecord]) -> None:
        self.by_id = {(s.trace_id, s.span_id): s for s in spans}
        self._rank: dict[int, int] = {}
        self._cluster: dict[int, str] = {}
        self.next_tid = 1
        self.threads: dict[tuple[int, str, int], int] = {}  # (pid, cluster, lane) -> tid
        self.tid_of: dict[int, int] = {}  # id(span) -> tid
        # trace id -> the root of an agent trajectory's trace: each such trace is a thread of its own
        self.trajectories = {s.trace_id: s for s in spans if s.name == N.RL_TRAJECTORY_SPAN and s.parent_span_id is None}
        self.names: dict[str, str] = {}  # thread key -> its name, where they differ (a trajectory's)

    def _parent(self, span: SpanRecord) -> SpanRecord | None:
        parent = self.by_id.get((span.trace_id, span.parent_span_id or ""))
        return parent if parent is not span else None

    def rank(self, span: SpanRecord) -> int:
        key = id(span)
        if key not in self._rank:
            value = _as_int(span.attributes.get(A.RL_RANK))
            if value is None:
                value = _as_int(span.resource.get(A.RL_RANK))
            if value is None:
                self._rank[key] = 0  # a guard against parent cycles while the parent is asked
                parent = self._parent(span)
                value = self.rank(parent) if parent is not None else 0
            self._rank[key] = max(value, 0)
        return self._rank[key]

    def cluster(self, span: SpanRecord) -> str:
        key = id(span)
        root = self.trajectories.get(span.trace_id)
        if root is not None:
            track = _TRAJECTORY_TRACK + span.trace_id
            if track not in self.names:
                attributes = root.attributes
                why = [f"step {attributes[A.RL_STEP]}"] if A.RL_STEP in attributes else []
                why += [str(attributes[A.RL_TRAJECTORY_REASON])] if A.RL_TRAJECTORY_REASON in attributes else []
                name = f"trajectory {attributes.get(A.RL_SAMPLE_ID, span.trace_id[:8])}"
                self.names[track] = name + (f" ({', '.join(why)})" if why else "")
            return track
        if key not in self._cluster:
            value = span.attributes.get(A.RL_CLUSTER)
            if value in (None, ""):
                self._cluster[key] = STEP_THREAD
                parent = self._parent(span)
                # A span with no cluster (a user's span in a stage) stays on its parent's thread in the same rank.
                value = self.cluster(parent) if parent is not None and self.rank(parent) == self.rank(span) else STEP_THREAD
            self._cluster[key] = str(value)
        return self._cluster[key]

    def assign(self, spans: Sequence[SpanRecord]) -> None:
        """Give every span a tid: its (rank, cluster) thread, or a further lane where it would not nest."""
        groups: dict[tuple[int, str], list[SpanRecord]] = {}
        for span in spans:
            groups.setdefault((self.rank(span), self.cluster(span)), []).append(span)
        for pid, cluster in sorted(groups, key=lambda k: (k[0], *self._order(k[1]))):
            lanes: list[list[int]] = []  # per lane: the end times of the open spans (a stack)
            for span in sorted(groups[(pid, cluster)], key=lambda s: (s.start_ns, -s.end_ns)):
                end = max(span.end_ns, span.start_ns)
                for lane, stack in enumerate(lanes):
                    while stack and stack[-1] <= span.start_ns:
                        stack.pop()
                    if not stack or end <= stack[-1]:
                        stack.append(end)
                        break
                else:
                    lane = len(lanes)
                    lanes.append([end])
                self.tid_of[id(span)] = self.tid(pid, cluster, lane)

    def _order(self, cluster: str) -> tuple[int, int, str]:
        """The step's thread, then the clusters' by name, then the trajectories' by start."""
        if cluster == STEP_THREAD:
            return (0, 0, "")
        if cluster.startswith(_TRAJECTORY_TRACK):
            root = self.trajectories.get(cluster[len(_TRAJECTORY_TRACK) :])
            return (2, root.start_ns if root is not None else 0, cluster)
        return (1, 0, cluster)

    def tid(self, pid: int, cluster: str, lane: int) -> int:
        key = (pid, cluster, lane)
        if key not in self.threads:
            self.threads[key] = self.new_tid()
        return self.threads[key]

    def new_tid(self) -> int:
        self.next_tid += 1
        return self.next_tid - 1


def _category(span: SpanRecord) -> str:
    if span.name == STEP_SPAN_NAME and span.parent_span_id is None:
        return "rl.step"
    if span.name in TRAJECTORY_SPAN_NAMES:
        return span.name
    if A.RL_STAGE_PHASE in span.attributes:
        return "rl.stage.phase"
    if A.RL_STAGE in span.attributes:
        return "rl.stage"
    return span.scope or "span"


def _span_args(span: SpanRecord) -> dict[str, Any]:
    args = {k: _json_value(v) for k, v in sorted(span.attributes.items())}
    args["otel.trace_id"] = span.trace_id
    args["otel.span_id"] = span.span_id
    if span.parent_span_id:
        args["otel.parent_span_id"] = span.parent_span_id
    if span.status == "error":
        args["otel.status_code"] = "ERROR"
        if span.status_message:
            args["otel.status_description"] = span.status_message
    return args


def _counters(attributes: Mapping[str, Any]) -> list[tuple[str, dict[str, int | float]]]:
    """The counter samples of one rl.memory.snapshot: process memory, then the GPU's."""
    out: list[tuple[str, dict[str, int | float]]] = []
    device = attributes.get(A.HW_ID)
    gpu = f"gpu {device} memory" if device not in (None, "") else "gpu memory"
    for title, keys in (("process memory", _CPU_COUNTERS), (gpu, _GPU_COUNTERS)):
        values = {label: v for key, label in keys if isinstance(v := attributes.get(key), (int, float)) and not isinstance(v, bool)}
        if values:
            out.append((title, values))
    return out


def to_chrome_trace(
    spans: Sequence[SpanRecord], profiles: Sequence[TorchProfile] = (), *, other_data: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], ChromeTraceSummary]:
    """Spans (one or more steps' traces, any ranks) and torch.profiler traces as one Chrome trace.

    Returns the JSON object (``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``) and a summary.
    """
    if not spans:
        raise ValueError("no spans to convert")
    layout = _Layout(spans)
    layout.assign(spans)
    window = (min(s.start_ns for s in spans), max(max(s.end_ns, s.start_ns) for s in spans))
    profile_stamps = [p.unix_ns(e["ts"]) for p in profiles for e in p.events if e["ph"] != "M" and isinstance(e.get("ts"), (int, float))]
    origin = min([window[0], *profile_stamps])

    def us(unix_ns: int) -> float:
        return round((unix_ns - origin) / 1000.0, 3)

    summary = ChromeTraceSummary(spans=len(spans), window_ns=window, trajectories=len(layout.trajectories))
    events: list[dict[str, Any]] = []
    for span in spans:
        pid, tid = layout.rank(span), layout.tid_of[id(span)]
        events.append(
            {
                "name": span.name,
                "cat": _category(span),
                "ph": "X",
                "ts": us(span.start_ns),
                "dur": round(span.duration_ns / 1000.0, 3),
                "pid": pid,
                "tid": tid,
                "args": _span_args(span),
            }
        )
        for event in span.events:
            attributes = {k: _json_value(v) for k, v in sorted(event.attributes.items())}
            events.append(
                {
                    "name": event.name,
                    "cat": "span_event",
                    "ph": "i",
                    "s": "t",
                    "ts": us(event.time_ns),
                    "pid": pid,
                    "tid": tid,
                    "args": attributes,
                }
            )
            if event.name == N.RL_MEMORY_SNAPSHOT_EVENT:
                for title, values in _counters(event.attributes):
                    events.append(
                        {"name": title, "cat": "memory", "ph": "C", "ts": us(event.time_ns), "pid": pid, "tid": tid, "args": values}
                    )
                    summary.counters += 1

    ranks = sorted({pid for pid, _, _ in layout.threads})
    summary.ranks = ranks
    metadata: list[dict[str, Any]] = []
    for rank in ranks:
        metadata.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        metadata.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for (pid, cluster, lane), tid in sorted(layout.threads.items(), key=lambda item: item[1]):
        name = layout.names.get(cluster, cluster)
        name = name if lane == 0 else f"{name} ({lane + 1})"
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        metadata.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    next_pid = (ranks[-1] + 1) if ranks else 0
    for index, profile in enumerate(profiles):
        next_pid, merged, outside = _merge_profile(profile, index, next_pid, layout, us, window, events, metadata)
        summary.profiles.append((profile.path, merged, outside))

    events.sort(key=lambda e: e["ts"] if isinstance(e.get("ts"), (int, float)) else 0.0)
    data: dict[str, Any] = {
        "traceEvents": metadata + events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": origin,  # ts * 1000 + this = Unix-epoch ns, as in torch.profiler's traces
        "otherData": {"generator": "otel-rl trace --format chrome", **dict(other_data or {})},
    }
    return data, summary


def _merge_profile(
    profile: TorchProfile,
    index: int,
    next_pid: int,
    layout: _Layout,
    us: Any,
    window: tuple[int, int],
    events: list[dict[str, Any]],
    metadata: list[dict[str, Any]],
) -> tuple[int, int, int]:
    """Put one profile's events on processes and threads of their own; returns (next pid, merged, outside)."""
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    for event in profile.events:
        if event["ph"] == "M" and isinstance(event.get("args"), dict):
            if event.get("name") == "process_name":
                process_names[event.get("pid")] = str(event["args"].get("name", ""))
            elif event.get("name") == "thread_name":
                thread_names[(event.get("pid"), event.get("tid"))] = str(event["args"].get("name", ""))
    pids: dict[Any, int] = {}
    tids: dict[tuple[Any, Any], int] = {}
    label = os.path.basename(profile.path)
    who = f"rank {profile.rank} " if profile.rank is not None else ""

    def pid_for(original: Any) -> int:
        nonlocal next_pid
        if original not in pids:
            pids[original] = pid = next_pid
            next_pid += 1
            source = process_names.get(original) or str(original)
            metadata.append(
                {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{who}torch.profiler {label}: {source}"}}
            )
            metadata.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        return pids[original]

    def tid_for(original_pid: Any, original_tid: Any) -> int:
        key = (original_pid, original_tid)
        if key not in tids:
            pid = pid_for(original_pid)
            tids[key] = tid = layout.new_tid()  # the profile's own tids are OS thread ids: they could repeat ours
            name = thread_names.get(key) or f"thread {original_tid}"
            metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            metadata.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return tids[key]

    merged = outside = 0
    for event in profile.events:
        if event["ph"] == "M" and event.get("name") in _PROFILE_METADATA:
            continue
        out = dict(event)
        original_pid = event.get("pid", 0)
        out["pid"] = pid_for(original_pid)
        out["tid"] = tid_for(original_pid, event.get("tid", original_pid))
        if isinstance(event.get("ts"), (int, float)):
            unix_ns = profile.unix_ns(event["ts"])
            out["ts"] = us(unix_ns)
            if event["ph"] != "M":
                merged += 1
                if not window[0] <= unix_ns <= window[1]:
                    outside += 1
        elif event["ph"] != "M":
            continue  # an event with no time cannot be placed
        for key in ("id", "bind_id"):
            if index and key in out:
                value = out[key]
                out[key] = (
                    value + index * _FLOW_ID_STRIDE if isinstance(value, int) and not isinstance(value, bool) else f"p{index}:{value}"
                )
        events.append(out)
    return next_pid, merged, outside


def write_chrome_trace(data: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the trace compactly (a step of a large run holds many events)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
        fh.write("\n")
