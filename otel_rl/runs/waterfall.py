"""One training step's trace picked out of a run's spans (``find_step_trace``), and any set
of spans drawn as a text waterfall (``render_waterfall``), as ``otel-rl trace`` prints them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from otel_rl.runs.records import SpanRecord
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = ["FOLD_MIN_RANKS", "find_step_trace", "format_duration", "keep_rank", "rank_list", "render_waterfall", "span_rank"]

STEP_SPAN_NAME = N.RL_STEP_SPAN
STEP_ATTRIBUTE = A.RL_STEP
MEMORY_SNAPSHOT_EVENT = N.RL_MEMORY_SNAPSHOT_EVENT


# --------------------------------------------------------------------------------------------
# Step traces
# --------------------------------------------------------------------------------------------


def _step_of(span: SpanRecord) -> int | None:
    return whole_number(span.attributes.get(STEP_ATTRIBUTE))


def whole_number(value: Any) -> int | None:
    """A step, rank or time read back from a file: an int, a whole float or a decimal string; None
    for anything else (a bool included)."""
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
        (span.start_ns, index, span) for index, span in enumerate(spans) if span.name == STEP_SPAN_NAME and span.parent_span_id is None
    ]
    matches = [entry for entry in step_roots if _step_of(entry[2]) == int(step)]
    if not matches:
        available = [s for s in (_step_of(entry[2]) for entry in step_roots) if s is not None]
        if available:
            raise LookupError(f"no {STEP_SPAN_NAME!r} trace for step {step}; steps available: {_ranges(available)}")
        raise LookupError(f"no {STEP_SPAN_NAME!r} trace for step {step}: no {STEP_SPAN_NAME!r} root spans among {len(spans)} spans")
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
    rank = span_rank(span)
    # A rank is shown where the work moves to another process (a joined worker's stage).
    if rank not in (None, 0) and (parent is None or span_rank(parent) != rank):
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
    parts.extend(_agent_details(span))
    if span.status == "error":
        # without a message (a failure returned, or text kept out of the export) the error's type says what failed
        why = span.status_message or span.attributes.get(A.ERROR_TYPE)
        parts.append(f"ERROR{': ' + str(why) if why else ''}")
    return " ".join(parts)


def _agent_details(span: SpanRecord) -> list[str]:
    """An agent trajectory's turn (why it stopped, tokens in -> out) or tool call (the tool's name)."""
    attributes = span.attributes
    if span.name == N.RL_TOOL_SPAN:
        name = attributes.get(A.GEN_AI_TOOL_NAME)
        return [str(name)] if name not in (None, "") else []
    if span.name != N.RL_TURN_SPAN:
        return []
    parts: list[str] = []
    reasons = attributes.get(A.GEN_AI_RESPONSE_FINISH_REASONS)
    if reasons not in (None, "", []):
        parts.append("finish=" + (",".join(map(str, reasons)) if isinstance(reasons, (list, tuple)) else str(reasons)))
    tokens_in, tokens_out = attributes.get(A.GEN_AI_USAGE_INPUT_TOKENS), attributes.get(A.GEN_AI_USAGE_OUTPUT_TOKENS)
    if tokens_in is not None or tokens_out is not None:
        parts.append(f"tokens {'?' if tokens_in is None else tokens_in}->{'?' if tokens_out is None else tokens_out}")
    return parts


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


# A parent's children from this many ranks or more are folded into one line per stage: a step of a
# 1,024-rank job holds ~10,000 spans, and what one reads there is the spread and the stragglers.
FOLD_MIN_RANKS = 8
# A rank is a straggler when its stage takes this much longer than the median rank's (and 3 robust
# spreads beyond it): a few percent is noise between GPUs, not a rank to look at.
STRAGGLER_RATIO = 1.2


def span_rank(span: SpanRecord) -> int | None:
    """The rank that recorded ``span`` (its ``rl.rank``, else its resource's)."""
    rank = whole_number(span.attributes.get(A.RL_RANK))
    return rank if rank is not None else whole_number(span.resource.get(A.RL_RANK))


def rank_list(spans: Iterable[SpanRecord]) -> str:
    """The ranks that recorded ``spans``, as ranges: ``"0-1023"``."""
    return _ranges(rank for span in spans if (rank := span_rank(span)) is not None) or "none named"


def keep_rank(spans: Sequence[SpanRecord], rank: int) -> list[SpanRecord]:
    """The spans of ``rank`` and the spans above them (the step's root on rank 0): one rank's
    part of a step, unfolded."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    kept: dict[tuple[str, str], SpanRecord] = {}
    for span in spans:
        if span_rank(span) != rank:
            continue
        node: SpanRecord | None = span
        while node is not None and (node.trace_id, node.span_id) not in kept:
            kept[(node.trace_id, node.span_id)] = node
            node = by_id.get((node.trace_id, node.parent_span_id)) if node.parent_span_id else None
    return [s for s in spans if (s.trace_id, s.span_id) in kept]


def _fold_text(group: Sequence[SpanRecord]) -> str:
    """``x1024 ranks: slowest rank 731 4.1 s, median 3.2 s, fastest rank 12 2.9 s; stragglers: ...``

    A rank with several spans in the group (a stage run several times a step) is judged by its
    total time in them: a straggler is a rank, named once."""
    totals: dict[int | None, int] = {}
    for span in group:
        rank = span_rank(span)
        totals[rank] = totals.get(rank, 0) + span.duration_ns
    timed = sorted(((d, rank) for rank, d in totals.items()), key=lambda t: (t[0], -1 if t[1] is None else t[1]))
    durations = [d for d, _ in timed]
    median = (
        durations[len(durations) // 2] if len(durations) % 2 else (durations[len(durations) // 2 - 1] + durations[len(durations) // 2]) / 2
    )
    spread = sorted(abs(d - median) for d in durations)[len(durations) // 2] * 1.4826
    bound = max(median * STRAGGLER_RATIO, median + 3 * spread)
    stragglers = [rank for d, rank in reversed(timed) if d > bound]
    (low, low_rank), (high, high_rank) = timed[0], timed[-1]
    if len(group) == len(totals):
        head = f"x{len(totals)} ranks: "
    else:
        each = len(group) / len(totals)
        head = f"x{len(group)} spans on {len(totals)} ranks ({f'{each:.0f}' if each.is_integer() else f'{each:.1f}'} a rank), each rank's total: "
    text = (
        f"{head}slowest rank {high_rank} {format_duration(high)}, median {format_duration(median)}, "
        f"fastest rank {low_rank} {format_duration(low)}"
    )
    if stragglers:
        named = ", ".join(str(r) for r in stragglers[:5]) + (f" and {len(stragglers) - 5} more" if len(stragglers) > 5 else "")
        text += f"; straggler{'s' if len(stragglers) != 1 else ''} (> {format_duration(bound)}): rank{'s' if len(stragglers) != 1 else ''} {named}"
    return text


def _fold(
    kids: list[SpanRecord],
    children: dict[tuple[str, str], list[SpanRecord]],
    notes: dict[int, str],
    folded_away: set[tuple[str, str]],
    min_ranks: int,
) -> list[SpanRecord]:
    """``kids`` with each (name, cluster) group recorded by ``min_ranks`` ranks or more replaced by one
    span covering the group (its children: every member's, folded in turn); ``notes`` gets its text,
    ``folded_away`` the members' keys."""
    if len(kids) < min_ranks:
        return kids
    groups: dict[tuple[str, Any], list[SpanRecord]] = {}
    for kid in kids:
        groups.setdefault((kid.name, kid.attributes.get(A.RL_CLUSTER)), []).append(kid)
    out: list[SpanRecord] = []
    for (name, _), group in groups.items():
        if len(group) < min_ranks or len({span_rank(s) for s in group}) < min_ranks:
            out.extend(group)
            continue
        first = group[0]
        folded = SpanRecord(
            first.trace_id,
            f"folded:{first.parent_span_id}:{name}:{len(out)}",
            first.parent_span_id,
            name,
            min(s.start_ns for s in group),
            max(s.end_ns for s in group),
            {A.RL_CLUSTER: first.attributes.get(A.RL_CLUSTER)},
        )
        notes[id(folded)] = _fold_text(group)
        folded_away.update((member.trace_id, member.span_id) for member in group)
        children[(folded.trace_id, folded.span_id)] = [k for s in group for k in children.get((s.trace_id, s.span_id), [])]
        out.append(folded)
    return out


def render_waterfall(
    spans: Sequence[SpanRecord], width: int = 60, max_columns: int = 100, fold_min_ranks: int | None = FOLD_MIN_RANKS
) -> str:
    """A text waterfall of ``spans`` (usually :func:`find_step_trace`'s result).

    One line per span in tree order (children by start time): tree-indented name plus details
    (``rl.cluster``, ``rl.stage.phase`` unless the name says it, ``[N memory snapshots]``, other
    event counts, a turn's finish reason and tokens, a tool call's name, errors with their message
    or ``error.type``), start offset from the root, duration, and a bar placed on the root's
    time span. ``width`` is the widest bar; the bar narrows so lines stay within ``max_columns``
    (names are cut with ``…`` only when they alone would not fit). Spans whose parent is missing
    are listed under ``(orphans)`` at the end. Siblings of one stage from ``fold_min_ranks`` ranks
    or more are one line: the span they cover, with the slowest, median and fastest rank and the
    stragglers (``None``: every span its own line).
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
    notes: dict[int, str] = {}  # id(folded span) -> its ranks' figures

    def walk(span: SpanRecord, lead: str, branch: str, rows: list[tuple[str, SpanRecord]]) -> None:
        key = (span.trace_id, span.span_id)
        if key in visited:
            return
        visited.add(key)
        rows.append((lead + branch, span))
        kids = children.get(key, [])
        if fold_min_ranks is not None:
            kids = _fold(kids, children, notes, visited, fold_min_ranks)
        kids = [k for k in order(kids) if (k.trace_id, k.span_id) not in visited]
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
        + ("  (folded)" if id(span) in notes else "")
        for prefix, span in all_rows
    }
    numbers_width = 1 + 8 + 1 + 8 + 2  # " +start" " duration" "  "
    min_bar = max(1, min(width, 30))  # long names are cut before the bar gets narrower than this
    label_width = max(len(text) for text in labels.values())
    label_width = max(4, min(label_width, max_columns - numbers_width - min_bar))
    bar_width = max(1, min(width, max_columns - numbers_width - label_width))

    def line(prefix: str, span: SpanRecord, t0: int, total: int) -> str:
        label = _truncate(labels[id(span)], label_width).ljust(label_width)
        offset = "+" + format_duration(span.start_ns - t0) if span.start_ns >= t0 else "-" + format_duration(t0 - span.start_ns)
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
        spans_in = sum(1 for span in by_id.values() if span.trace_id == root.trace_id)
        head += f"  {format_duration(root.duration_ns)}  {spans_in:,} span{'s' if spans_in != 1 else ''}"
        if any(id(span) in notes for _, span in rows):
            head += f" on {len(rows)} lines (the ranks of a stage folded)"
        out.append(head)
        scale = f"0{' ' * max(1, bar_width - 1 - len(format_duration(total)))}{format_duration(total)}"
        out.append(f"{'span'.ljust(label_width)} {'start':>8} {'duration':>8}  {scale}".rstrip())
        for prefix, span in rows:
            out.append(line(prefix, span, t0, total))
            if id(span) in notes:  # the ranks' figures under their line, whole (a label is cut to fit)
                out.append(f"{prefix[:-3]}{'│  ' if prefix.endswith('├─ ') else '   '}   {notes[id(span)]}".rstrip())
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
