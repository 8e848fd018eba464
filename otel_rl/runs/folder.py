"""Reading a run folder back: the OTLP/JSON lines files the embedded exporters write.

A run folder holds ``traces.jsonl``, ``metrics.jsonl`` and ``logs.jsonl`` (names below, shared
with the writer setup). Each line is one OTLP/JSON ``Export*ServiceRequest`` (the OpenTelemetry
Collector ``file`` exporter format), so files written by a Collector can be read too.

The ``read_*`` functions return a :class:`ReadResult`: a plain ``list`` of records with an extra
``problems`` attribute listing the lines that were skipped (not JSON, truncated by a crash, not
OTLP). Reading never fails because of a bad line::

    spans = read_spans("runs/x")
    if spans.problems:
        print(format_problems(spans.problems))   # skipped 2 malformed lines (traces.jsonl:17, ...)
    print(render_waterfall(find_step_trace(spans, 3)))

This module only needs the standard library (no protobuf), so the CLI can use it anywhere.
"""

from __future__ import annotations

import base64
import glob
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from otel_rl.exporters.files import LOGS_FILE, METRICS_FILE, TRACES_FILE, rank_file_name
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = [
    "LOGS_FILE",
    "METRICS_FILE",
    "TRACES_FILE",
    "MetricPoint",
    "Problem",
    "ReadResult",
    "SpanEvent",
    "SpanRecord",
    "decode_any_value",
    "decode_attributes",
    "find_step_trace",
    "format_duration",
    "format_problems",
    "read_log_records",
    "read_metrics",
    "rank_file_name",
    "read_spans",
    "render_waterfall",
]


STEP_SPAN_NAME = N.RL_STEP_SPAN
STEP_ATTRIBUTE = A.RL_STEP
MEMORY_SNAPSHOT_EVENT = N.RL_MEMORY_SNAPSHOT_EVENT

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Result containers
# --------------------------------------------------------------------------------------------


class Problem(NamedTuple):
    """One skipped line: ``file`` (base name), 1-based ``line`` number and the ``reason``."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class ReadResult(list, Generic[T]):  # type: ignore[type-arg]
    """A list of decoded records plus ``problems``: the malformed lines that were skipped."""

    def __init__(self, items: Iterable[T] = (), problems: Iterable[Problem] = ()) -> None:
        super().__init__(items)
        self.problems: list[Problem] = list(problems)


def format_problems(problems: Sequence[Problem], limit: int = 5) -> str:
    """``"skipped 2 malformed lines (traces.jsonl:17, traces.jsonl:20)"``; ``""`` when none."""
    if not problems:
        return ""
    where = ", ".join(f"{p.file}:{p.line}" for p in problems[:limit])
    if len(problems) > limit:
        where += f", ... {len(problems) - limit} more"
    noun = "line" if len(problems) == 1 else "lines"
    return f"skipped {len(problems)} malformed {noun} ({where})"


class SpanEvent(NamedTuple):
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass
class SpanRecord:
    trace_id: str  # 32 lowercase hex chars
    span_id: str  # 16 lowercase hex chars
    parent_span_id: str | None  # None for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    status: str = "unset"  # "unset" | "ok" | "error"
    status_message: str = ""
    kind: int = 0  # OTLP SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, ...
    scope: str = ""  # instrumentation scope name

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass
class MetricPoint:
    """One data point of one metric, flattened (resource and scope folded in)."""

    name: str
    unit: str
    kind: str  # "gauge" | "sum" | "histogram" | "exponential_histogram" | "summary"
    attributes: dict[str, Any]
    time_ns: int
    start_time_ns: int = 0
    value: float | int | None = None  # gauge / sum
    count: int | None = None  # histogram family
    sum: float | None = None
    bucket_counts: list[int] | None = None  # histogram
    explicit_bounds: list[float] | None = None  # histogram
    min: float | None = None
    max: float | None = None
    description: str = ""
    temporality: int = 0  # sum / histogram: 1 delta, 2 cumulative
    is_monotonic: bool = False  # sum
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


# --------------------------------------------------------------------------------------------
# OTLP/JSON value decoding
# --------------------------------------------------------------------------------------------


def _int(value: Any, default: int = 0) -> int:
    """int64/uint64/fixed64 fields: decimal strings in OTLP/JSON, numbers tolerated."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def _float(value: Any, default: float | None = None) -> float | None:
    """double fields: numbers, or the strings "NaN" / "Infinity" / "-Infinity"."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float(value)  # accepts "NaN", "Infinity", "-Infinity", "1e3"
    raise ValueError(f"expected a number, got {value!r}")


def _hex_id(value: Any, nbytes: int) -> str | None:
    """A trace/span id as lowercase hex; ``None`` when absent or all zero.

    OTLP/JSON says hex; plain proto3 JSON (base64) is accepted as well.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"id is not a string: {value!r}")
    if len(value) == 2 * nbytes:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if raw:
            return None if not any(raw) else raw.hex()
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != nbytes:
        raise ValueError(f"invalid {nbytes}-byte id {value!r}")
    return None if not any(raw) else raw.hex()


def decode_any_value(value: Any) -> Any:
    """An OTLP/JSON ``AnyValue`` object as the Python value it carries."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"AnyValue is not an object: {value!r}")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "intValue" in value:
        return _int(value["intValue"])
    if "doubleValue" in value:
        return _float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [decode_any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return decode_attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None  # empty AnyValue


def decode_attributes(key_values: Any) -> dict[str, Any]:
    """A list of OTLP/JSON ``KeyValue`` objects as a dict."""
    if key_values is None:
        return {}
    if not isinstance(key_values, list):
        raise ValueError(f"attributes are not a list: {key_values!r}")
    out: dict[str, Any] = {}
    for kv in key_values:
        if not isinstance(kv, Mapping) or "key" not in kv:
            raise ValueError(f"attribute is not a KeyValue: {kv!r}")
        out[str(kv["key"])] = decode_any_value(kv.get("value"))
    return out


def _resource(resource_entry: Mapping[str, Any]) -> dict[str, Any]:
    return decode_attributes((resource_entry.get("resource") or {}).get("attributes"))


def _scope_name(scope_entry: Mapping[str, Any]) -> str:
    return str((scope_entry.get("scope") or {}).get("name", ""))


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value


# --------------------------------------------------------------------------------------------
# File reading
# --------------------------------------------------------------------------------------------


def _rank_of(file_name: str) -> int:
    match = re.search(r"\.rank(\d+)\.[^.]+$", file_name)
    return int(match.group(1)) if match else 0


def _resolve(run_dir: str | os.PathLike[str], file_name: str) -> list[str]:
    """The signal files inside ``run_dir``, every rank's, rank 0 first (``run_dir`` may also be one file)."""
    path = os.fspath(run_dir)
    if os.path.isdir(path):
        stem, _, ext = file_name.rpartition(".")
        ranks = glob.glob(os.path.join(glob.escape(path), f"{stem}.rank*.{ext}"))
        return [os.path.join(path, file_name), *sorted(ranks, key=lambda p: _rank_of(os.path.basename(p)))]
    if os.path.isfile(path):
        return [path]
    raise FileNotFoundError(f"run folder not found: {path}")


def _iter_lines(path: str) -> Iterator[tuple[int, bytes]]:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield number, raw


def _read(
    run_dir: str | os.PathLike[str],
    file_name: str,
    top_key: str,
    decode_request: Callable[[Mapping[str, Any]], list[T]],
) -> ReadResult[T]:
    result: ReadResult[T] = ReadResult()
    for path in _resolve(run_dir, file_name):
        _read_file(path, top_key, decode_request, result)
    return result


def _read_file(path: str, top_key: str, decode_request: Callable[[Mapping[str, Any]], list[T]],
               result: ReadResult[T]) -> None:
    base = os.path.basename(path)
    for number, raw in _iter_lines(path):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            result.problems.append(Problem(base, number, f"not UTF-8 ({error.reason})"))
            continue
        try:
            obj = json.loads(text)
        except ValueError as error:
            reason = "truncated JSON" if not text.endswith("\n") else f"not JSON ({error.msg})"
            result.problems.append(Problem(base, number, reason))
            continue
        if not isinstance(obj, dict) or top_key not in obj:
            result.problems.append(Problem(base, number, f"not an OTLP/JSON request (no {top_key!r})"))
            continue
        try:
            records = decode_request(obj)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            result.problems.append(Problem(base, number, f"invalid OTLP/JSON: {error}"))
            continue
        result.extend(records)


# ---- traces


def _status(span: Mapping[str, Any]) -> tuple[str, str]:
    status = span.get("status") or {}
    code = status.get("code", 0)
    if isinstance(code, str):  # tolerate enum names
        code = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, 0)
    return {1: "ok", 2: "error"}.get(int(code), "unset"), str(status.get("message", ""))


def _decode_trace_request(obj: Mapping[str, Any]) -> list[SpanRecord]:
    spans: list[SpanRecord] = []
    for resource_spans in _list(obj, "resourceSpans"):
        resource = _resource(resource_spans)
        for scope_spans in _list(resource_spans, "scopeSpans"):
            scope = _scope_name(scope_spans)
            for span in _list(scope_spans, "spans"):
                trace_id = _hex_id(span.get("traceId"), 16)
                span_id = _hex_id(span.get("spanId"), 8)
                if trace_id is None or span_id is None:
                    raise ValueError("span without traceId/spanId")
                status, message = _status(span)
                spans.append(
                    SpanRecord(
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_span_id=_hex_id(span.get("parentSpanId"), 8),
                        name=str(span.get("name", "")),
                        start_ns=_int(span.get("startTimeUnixNano")),
                        end_ns=_int(span.get("endTimeUnixNano")),
                        attributes=decode_attributes(span.get("attributes")),
                        events=[
                            SpanEvent(
                                str(event.get("name", "")),
                                _int(event.get("timeUnixNano")),
                                decode_attributes(event.get("attributes")),
                            )
                            for event in _list(span, "events")
                        ],
                        resource=resource,
                        status=status,
                        status_message=message,
                        kind=_int(span.get("kind")),
                        scope=scope,
                    )
                )
    return spans


def read_spans(run_dir: str | os.PathLike[str]) -> ReadResult[SpanRecord]:
    """All spans of ``run_dir/traces.jsonl`` in file order (``.problems``: skipped lines)."""
    return _read(run_dir, TRACES_FILE, "resourceSpans", _decode_trace_request)


# ---- logs


def _decode_logs_request(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for resource_logs in _list(obj, "resourceLogs"):
        resource = _resource(resource_logs)
        for scope_logs in _list(resource_logs, "scopeLogs"):
            scope = _scope_name(scope_logs)
            for log in _list(scope_logs, "logRecords"):
                observed = _int(log.get("observedTimeUnixNano"))
                records.append(
                    {
                        "timestamp": _int(log.get("timeUnixNano")) or observed,
                        "observed_timestamp": observed,
                        "event_name": str(log.get("eventName", "")) or None,
                        "body": decode_any_value(log.get("body")),
                        "attributes": decode_attributes(log.get("attributes")),
                        "trace_id": _hex_id(log.get("traceId"), 16),
                        "span_id": _hex_id(log.get("spanId"), 8),
                        "severity_number": _int(log.get("severityNumber")),
                        "severity_text": str(log.get("severityText", "")),
                        "resource": resource,
                        "scope": scope,
                    }
                )
    return records


def read_log_records(run_dir: str | os.PathLike[str]) -> ReadResult[dict[str, Any]]:
    """All log records of ``run_dir/logs.jsonl`` as dicts with keys ``timestamp``,
    ``observed_timestamp``, ``event_name``, ``body`` (kvlist decoded to a dict), ``attributes``,
    ``trace_id``, ``span_id`` (hex or None), ``severity_number``, ``severity_text``,
    ``resource``, ``scope``."""
    return _read(run_dir, LOGS_FILE, "resourceLogs", _decode_logs_request)


# ---- metrics

_METRIC_KINDS = {
    "gauge": "gauge",
    "sum": "sum",
    "histogram": "histogram",
    "exponentialHistogram": "exponential_histogram",
    "summary": "summary",
}


def _decode_metric(metric: Mapping[str, Any], resource: dict[str, Any], scope: str) -> list[MetricPoint]:
    for json_key, kind in _METRIC_KINDS.items():
        if json_key in metric:
            data = metric[json_key] or {}
            break
    else:
        raise ValueError(f"metric {metric.get('name')!r} has no data")
    common = {
        "name": str(metric.get("name", "")),
        "unit": str(metric.get("unit", "")),
        "description": str(metric.get("description", "")),
        "kind": kind,
        "temporality": _int(data.get("aggregationTemporality")),
        "is_monotonic": bool(data.get("isMonotonic", False)),
        "resource": resource,
        "scope": scope,
    }
    points: list[MetricPoint] = []
    for dp in _list(data, "dataPoints"):
        point = MetricPoint(
            attributes=decode_attributes(dp.get("attributes")),
            time_ns=_int(dp.get("timeUnixNano")),
            start_time_ns=_int(dp.get("startTimeUnixNano")),
            **common,
        )
        if kind in ("gauge", "sum"):
            if "asInt" in dp:
                point.value = _int(dp["asInt"])
            elif "asDouble" in dp:
                point.value = _float(dp["asDouble"])
        else:
            point.count = _int(dp.get("count"))
            point.sum = _float(dp.get("sum"))
            point.min = _float(dp.get("min"))
            point.max = _float(dp.get("max"))
            if kind == "histogram":
                point.bucket_counts = [_int(c) for c in _list(dp, "bucketCounts")]
                point.explicit_bounds = [float(_float(b)) for b in _list(dp, "explicitBounds")]  # type: ignore[arg-type]
        points.append(point)
    return points


def _decode_metrics_request(obj: Mapping[str, Any]) -> list[MetricPoint]:
    points: list[MetricPoint] = []
    for resource_metrics in _list(obj, "resourceMetrics"):
        resource = _resource(resource_metrics)
        for scope_metrics in _list(resource_metrics, "scopeMetrics"):
            scope = _scope_name(scope_metrics)
            for metric in _list(scope_metrics, "metrics"):
                points.extend(_decode_metric(metric, resource, scope))
    return points


def read_metrics(run_dir: str | os.PathLike[str]) -> ReadResult[MetricPoint]:
    """All data points of ``run_dir/metrics.jsonl``, flattened, in file order."""
    return _read(run_dir, METRICS_FILE, "resourceMetrics", _decode_metrics_request)


# --------------------------------------------------------------------------------------------
# Step traces
# --------------------------------------------------------------------------------------------


def _step_of(span: SpanRecord) -> int | None:
    value = span.attributes.get(STEP_ATTRIBUTE)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3, 7, 9-10"``."""
    values = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def find_step_trace(spans: Sequence[SpanRecord], step: int) -> list[SpanRecord]:
    """The spans of the trace whose root span is ``rl.step`` with ``rl.step == step``.

    When several traces carry that step (a rerun appending to the same run folder) the latest
    one (by start time, then file order) wins. The spans come back sorted by start time.
    Raises ``LookupError`` naming the steps that are available.
    """
    step_roots = [
        (span.start_ns, index, span)
        for index, span in enumerate(spans)
        if span.name == STEP_SPAN_NAME and span.parent_span_id is None
    ]
    matches = [entry for entry in step_roots if _step_of(entry[2]) == int(step)]
    if not matches:
        available = [s for s in (_step_of(entry[2]) for entry in step_roots) if s is not None]
        if available:
            raise LookupError(
                f"no {STEP_SPAN_NAME!r} trace for step {step}; steps available: {_ranges(available)}"
            )
        raise LookupError(
            f"no {STEP_SPAN_NAME!r} trace for step {step}: no {STEP_SPAN_NAME!r} root spans among "
            f"{len(spans)} spans"
        )
    root = max(matches, key=lambda entry: (entry[0], entry[1]))[2]
    trace = [span for span in spans if span.trace_id == root.trace_id]
    trace.sort(key=lambda span: (span is not root, span.start_ns, span.end_ns))
    return trace


# --------------------------------------------------------------------------------------------
# Waterfall rendering
# --------------------------------------------------------------------------------------------


def format_duration(ns: float) -> str:
    """Human duration: ``"850 µs"``, ``"4.12 ms"``, ``"412 ms"``, ``"1.23 s"``, ``"2m 03s"``."""
    if ns <= 0:
        return "0"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if ns < 1e9:
        ms = ns / 1e6
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    s = ns / 1e9
    if s < 60:
        return f"{s:.3g} s" if s < 10 else f"{s:.1f} s"
    minutes, seconds = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _details(span: SpanRecord, parent: SpanRecord | None) -> str:
    parts: list[str] = []
    cluster = span.attributes.get(A.RL_CLUSTER)
    # The cluster is shown where it changes (a stage), not again on each of its phases.
    if cluster not in (None, "") and (parent is None or parent.attributes.get(A.RL_CLUSTER) != cluster):
        parts.append(str(cluster))
    rank = span.attributes.get(A.RL_RANK)
    # A rank is shown where the work moves to another process (a joined worker's stage).
    if rank not in (None, 0) and (parent is None or parent.attributes.get(A.RL_RANK) != rank):
        parts.append(f"rank {rank}")
    phase = span.attributes.get(A.RL_STAGE_PHASE)
    if phase not in (None, "") and span.name != f"rl.{phase}":
        parts.append(f"phase={phase}")
    snapshots = sum(1 for event in span.events if event.name == MEMORY_SNAPSHOT_EVENT)
    others = len(span.events) - snapshots
    if snapshots:
        parts.append(f"[{snapshots} memory snapshot{'s' if snapshots != 1 else ''}]")
    if others:
        parts.append(f"[{others} event{'s' if others != 1 else ''}]")
    if span.status == "error":
        parts.append(f"ERROR{': ' + span.status_message if span.status_message else ''}")
    return " ".join(parts)


def _bar(span: SpanRecord, t0: int, total: int, width: int) -> str:
    start = (span.start_ns - t0) / total * width
    end = (span.end_ns - t0) / total * width
    start = min(max(start, 0.0), float(width))
    end = min(max(end, start), float(width))
    first = min(int(math.floor(start)), width - 1)
    last = int(round(end))
    if last <= first:
        return " " * first + "▏"
    return " " * first + "█" * (last - first)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def render_waterfall(spans: Sequence[SpanRecord], width: int = 60, max_columns: int = 100) -> str:
    """A text waterfall of ``spans`` (usually :func:`find_step_trace`'s result).

    One line per span in tree order (children by start time): tree-indented name plus details
    (``rl.cluster``, ``rl.stage.phase`` unless the name says it, ``[N memory snapshots]``, other
    event counts, errors), start offset from the root, duration, and a bar placed on the root's
    time span. ``width`` is the widest bar; the bar narrows so lines stay within ``max_columns``
    (names are cut with ``…`` only when they alone would not fit). Spans whose parent is missing
    are listed under ``(orphans)`` at the end.
    """
    if not spans:
        return "(no spans)"
    by_id: dict[tuple[str, str], SpanRecord] = {}
    for span in spans:
        by_id.setdefault((span.trace_id, span.span_id), span)
    children: dict[tuple[str, str], list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    orphans: list[SpanRecord] = []
    for span in by_id.values():
        if span.parent_span_id is None:
            roots.append(span)
        elif (span.trace_id, span.parent_span_id) in by_id and span.parent_span_id != span.span_id:
            children.setdefault((span.trace_id, span.parent_span_id), []).append(span)
        else:
            orphans.append(span)

    def order(items: list[SpanRecord]) -> list[SpanRecord]:
        return sorted(items, key=lambda s: (s.start_ns, s.end_ns, s.name))

    # Walk the trees into (prefix, span) rows; a span is visited once even with cyclic parents.
    visited: set[tuple[str, str]] = set()

    def walk(span: SpanRecord, lead: str, branch: str, rows: list[tuple[str, SpanRecord]]) -> None:
        key = (span.trace_id, span.span_id)
        if key in visited:
            return
        visited.add(key)
        rows.append((lead + branch, span))
        kids = [k for k in order(children.get(key, [])) if (k.trace_id, k.span_id) not in visited]
        if branch == "├─ ":
            lead += "│  "
        elif branch == "└─ ":
            lead += "   "
        for i, kid in enumerate(kids):
            walk(kid, lead, "└─ " if i == len(kids) - 1 else "├─ ", rows)

    sections: list[tuple[SpanRecord | None, list[tuple[str, SpanRecord]]]] = []
    for root in order(roots):
        rows: list[tuple[str, SpanRecord]] = []
        walk(root, "", "", rows)
        sections.append((root, rows))
    orphan_rows: list[tuple[str, SpanRecord]] = []
    for orphan in order(orphans):
        walk(orphan, "", "", orphan_rows)
    leftovers = [s for s in by_id.values() if (s.trace_id, s.span_id) not in visited]  # cycles
    for span in order(leftovers):
        walk(span, "", "", orphan_rows)

    # Column layout: label | start | duration | bar, within max_columns.
    all_rows = [row for _, rows in sections for row in rows] + orphan_rows
    labels = {
        id(span): f"{prefix}{span.name}"
        + (f"  {d}" if (d := _details(span, by_id.get((span.trace_id, span.parent_span_id or "")))) else "")
        for prefix, span in all_rows
    }
    numbers_width = 1 + 8 + 1 + 8 + 2  # " +start" " duration" "  "
    min_bar = max(1, min(width, 30))  # long names are cut before the bar gets narrower than this
    label_width = max(len(text) for text in labels.values())
    label_width = max(4, min(label_width, max_columns - numbers_width - min_bar))
    bar_width = max(1, min(width, max_columns - numbers_width - label_width))

    def line(prefix: str, span: SpanRecord, t0: int, total: int) -> str:
        label = _truncate(labels[id(span)], label_width).ljust(label_width)
        offset = "+" + format_duration(span.start_ns - t0) if span.start_ns >= t0 else "-" + format_duration(
            t0 - span.start_ns
        )
        text = f"{label} {offset:>8} {format_duration(span.duration_ns):>8}  {_bar(span, t0, total, bar_width)}"
        return text.rstrip()

    def timeline(group: Sequence[SpanRecord], root: SpanRecord | None) -> tuple[int, int]:
        if root is not None:
            t0 = root.start_ns
            end = root.end_ns if root.end_ns > t0 else max(s.end_ns for s in group)
        else:
            t0 = min(s.start_ns for s in group)
            end = max(s.end_ns for s in group)
        return t0, max(1, end - t0)

    out: list[str] = []
    for root, rows in sections:
        assert root is not None
        t0, total = timeline([span for _, span in rows], root)
        if out:
            out.append("")
        head = f"trace {root.trace_id}  {root.name}"
        step = _step_of(root) if root.name == STEP_SPAN_NAME else None
        if step is not None:
            head += f" {step}"
        head += f"  {format_duration(root.duration_ns)}  {len(rows)} span{'s' if len(rows) != 1 else ''}"
        out.append(head)
        scale = f"0{' ' * max(1, bar_width - 1 - len(format_duration(total)))}{format_duration(total)}"
        out.append(f"{'span'.ljust(label_width)} {'start':>8} {'duration':>8}  {scale}".rstrip())
        out.extend(line(prefix, span, t0, total) for prefix, span in rows)
    if orphan_rows:
        group = [span for _, span in orphan_rows]
        if len(sections) == 1 and sections[0][0] is not None:
            t0, total = timeline(group, sections[0][0])
        else:
            t0, total = timeline(group, None)
        if out:
            out.append("")
        out.append(f"(orphans) {len(orphan_rows)} span{'s' if len(orphan_rows) != 1 else ''} whose parent is missing")
        out.extend(line(prefix, span, t0, total) for prefix, span in orphan_rows)
    return "\n".join(out)
