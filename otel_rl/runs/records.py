"""What reading a run folder gives back: the record types (spans, metric points) and the
``ReadResult`` list that carries the skipped lines (``Problem``) along with the records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["MetricPoint", "Problem", "ReadResult", "SpanEvent", "SpanRecord", "format_problems"]

T = TypeVar("T")


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
    scope_version: str = ""
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id) of each linked span

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
