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

This module holds the file reading; the record types (:mod:`otel_rl.runs.records`), the
request decoding (:mod:`otel_rl.runs.otlp_json_decode`) and the step waterfall
(:mod:`otel_rl.runs.waterfall`) live beside it, their names re-exported here. All of it only
needs the standard library (no protobuf), so the CLI can use it anywhere.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

from otel_rl.exporters.files import LOGS_FILE, METRICS_FILE, TRACES_FILE, rank_file_name
from otel_rl.runs.otlp_json_decode import (
    StepKeySets,
    decode_any_value,
    decode_attributes,
    decode_logs_request,
    decode_metrics_request,
    decode_trace_request,
)
from otel_rl.runs.records import MetricPoint, Problem, ReadResult, SpanEvent, SpanRecord, format_problems
from otel_rl.runs.textfile import MAX_LINE_BYTES, NotRegularFileError, bounded_lines, require_regular_file
from otel_rl.runs.waterfall import find_step_trace, format_duration, render_waterfall

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
    "iter_log_records",
    "iter_spans",
    "read_log_records",
    "read_metrics",
    "rank_file_name",
    "read_spans",
    "render_waterfall",
]


T = TypeVar("T")


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
    if os.path.exists(path):
        require_regular_file(path)  # a FIFO or a device: say so, rather than "not found" (or a hang)
    raise FileNotFoundError(f"run folder not found: {path}")


def _iter_lines(path: str) -> Iterator[tuple[int, bytes | None, int]]:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        yield from bounded_lines(f)


def _read(
    run_dir: str | os.PathLike[str],
    file_name: str,
    top_key: str,
    decode_request: Callable[[Mapping[str, Any]], list[T]],
    restorer: Callable[[], Callable[[list[T]], str | None]] | None = None,
) -> ReadResult[T]:
    """``restorer``: makes, per file, what completes each line's records in place (returning a
    problem to report, or None)."""
    result: ReadResult[T] = ReadResult()
    result.extend(_iter(run_dir, file_name, top_key, decode_request, result.problems, restorer))
    return result


def _iter(
    run_dir: str | os.PathLike[str],
    file_name: str,
    top_key: str,
    decode_request: Callable[[Mapping[str, Any]], list[T]],
    problems: list[Problem],
    restorer: Callable[[], Callable[[list[T]], str | None]] | None = None,
) -> Iterator[T]:
    for path in _resolve(run_dir, file_name):
        yield from _read_file(path, top_key, decode_request, problems, restorer() if restorer is not None else None)


def iter_log_records(run_dir: str | os.PathLike[str], problems: list[Problem]) -> Iterator[dict[str, Any]]:
    """:func:`read_log_records` one record at a time (memory: one line's records); skipped lines go
    to ``problems``."""
    return _iter(run_dir, LOGS_FILE, "resourceLogs", decode_logs_request, problems, lambda: StepKeySets().restore)


def iter_spans(run_dir: str | os.PathLike[str], problems: list[Problem]) -> Iterator[SpanRecord]:
    """:func:`read_spans` one span at a time."""
    return _iter(run_dir, TRACES_FILE, "resourceSpans", decode_trace_request, problems)


def _read_file(
    path: str,
    top_key: str,
    decode_request: Callable[[Mapping[str, Any]], list[T]],
    problems: list[Problem],
    restore: Callable[[list[T]], str | None] | None = None,
) -> Iterator[T]:
    base = os.path.basename(path)
    try:
        require_regular_file(path)
    except FileNotFoundError:
        return
    except NotRegularFileError as error:
        problems.append(Problem(base, 0, f"skipped: {error}"))
        return
    for number, raw, length in _iter_lines(path):
        if raw is None:
            problems.append(Problem(base, number, f"a line of {length:,} bytes, over the {MAX_LINE_BYTES:,}-byte limit"))
            continue
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            problems.append(Problem(base, number, f"not UTF-8 ({error.reason})"))
            continue
        try:
            obj = json.loads(text)
        except (RecursionError, MemoryError) as error:
            # nested deeper than Python's stack allows (a "[[[[..." line): this line only
            problems.append(Problem(base, number, f"JSON nested too deeply to read ({type(error).__name__})"))
            continue
        except ValueError as error:
            reason = "truncated JSON" if not text.endswith("\n") else f"not JSON ({cast(json.JSONDecodeError, error).msg})"
            problems.append(Problem(base, number, reason))
            continue
        if not isinstance(obj, dict) or top_key not in obj:
            problems.append(Problem(base, number, f"not an OTLP/JSON request (no {top_key!r})"))
            continue
        try:
            records = decode_request(obj)
        except (RecursionError, MemoryError) as error:
            problems.append(Problem(base, number, f"OTLP/JSON nested too deeply to read ({type(error).__name__})"))
            continue
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            problems.append(Problem(base, number, f"invalid OTLP/JSON: {error}"))
            continue
        if restore is not None:
            problem = restore(records)
            if problem is not None:
                problems.append(Problem(base, number, problem))
        yield from records


def read_spans(run_dir: str | os.PathLike[str]) -> ReadResult[SpanRecord]:
    """All spans of ``run_dir/traces.jsonl`` in file order (``.problems``: skipped lines)."""
    return _read(run_dir, TRACES_FILE, "resourceSpans", decode_trace_request)


def read_log_records(run_dir: str | os.PathLike[str]) -> ReadResult[dict[str, Any]]:
    """All log records of ``run_dir/logs.jsonl`` as dicts with keys ``timestamp``,
    ``observed_timestamp``, ``event_name``, ``body`` (kvlist decoded to a dict), ``attributes``,
    ``trace_id``, ``span_id`` (hex or None), ``severity_number``, ``severity_text``,
    ``resource``, ``scope``. The compact step records of a run folder (``rl.log.key_set``) come
    back with their key -> value map."""
    return _read(run_dir, LOGS_FILE, "resourceLogs", decode_logs_request, lambda: StepKeySets().restore)


def read_metrics(run_dir: str | os.PathLike[str]) -> ReadResult[MetricPoint]:
    """All data points of ``run_dir/metrics.jsonl``, flattened, in file order."""
    return _read(run_dir, METRICS_FILE, "resourceMetrics", decode_metrics_request)
