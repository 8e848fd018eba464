"""Sanity before verdicts: one record per step, steps in order, the count the log's own header
promises, the share of record-like lines read. A doubtful parse says so at the top of every report
and of replay's output instead of passing for a healthy run."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator

from otel_rl.replay._log import ParseCheck, ParsedLog, StepRecord

# Below this share of record-like lines read, the reader missed something systematic.
MIN_SHARE_READ = 0.9
# Below this share of the numeric fields on the lines it read, a reader read the wrong format (an
# EasyR1 row read as a flat row keeps one key of each nested dict: 161 of 161 lines "read").
MIN_FIELDS_KEPT = 0.5
FIELDS_SAMPLE = 20_000  # lines that share is judged on
# A numeric field as logs write it: "key": 0.5, 'key': '0.5', key:np.float64(0.5), key=1e-3, "k": NaN.
_NUMERIC_FIELD_RE = re.compile(r"""[:=]\s*['"]?(?:np\.\w+\(|numpy\.\w+\(|torch\.\w+\()?[-+]?(?:\d|\.\d|nan\b|NaN\b|inf\b|Infinity\b)""")


def settle_steps(out: ParsedLog) -> None:
    """One record per step, in step order. Records of the same step logged one after the other
    are one step's parts (merged, the later value wins); a step that goes back means the run was
    resumed from a checkpoint (or restarted): the later records of a step replace the earlier."""
    kept: dict[int, StepRecord] = {}
    previous: int | None = None
    replaced: list[int] = []
    resumes: list[tuple[int, int, int]] = []  # (line, from step, to step)
    per_step: Counter[int] = Counter()
    # Each key string once for the whole log (a reader makes one per line: 20 keys x 455,000 steps
    # of ~65 B is 590 MB), and each reader's record freed as soon as it is settled.
    names: dict[str, str] = {}
    records, out.records = out.records, []
    for i, record in enumerate(records):
        records[i] = None  # type: ignore[call-overload]
        values = {names.setdefault(key, key): value for key, value in record.values.items()}
        step = record.step
        per_step[step] += 1
        if previous is not None and step < previous:
            resumes.append((record.line, previous, step))
        existing = kept.get(step)
        if existing is not None and step == previous:
            existing.values.update(values)
        else:
            if existing is not None:
                replaced.append(step)
            kept[step] = StepRecord(step, values, record.line, record.time_ns, record.elapsed_s, record.segment)
        previous = step
    for line, before, after in resumes[:3]:
        out.notes.append(
            f"line {line}: the step went back from {before} to {after} (a resumed run, or another run "
            "appended to the file); a step logged twice keeps its later record"
        )
    if replaced:
        out.notes.append(f"{len(replaced)} step(s) logged more than once ({_span(replaced)}): the later record of each is kept")
    out.records = [kept[s] for s in sorted(kept)]
    out.check = ParseCheck(
        records=out.records_read,
        steps=len(out.records),
        first_step=out.records[0].step if out.records else None,
        last_step=out.records[-1].step if out.records else None,
        max_records_per_step=max(per_step.values(), default=0),
        monotonic=not resumes,
        steps_went_back=len(resumes),
        expected_steps=None,
        lines=out.lines,
        lines_read=0,
        record_like_lines=0,
    )


def _span(steps: list[int]) -> str:
    ordered = sorted(set(steps))
    return f"step {ordered[0]}" if len(ordered) == 1 else f"steps {ordered[0]}-{ordered[-1]}"


def check_parse(out: ParsedLog) -> ParseCheck:
    """Fill ``out.check`` and add to ``out.doubts`` what makes the steps read doubtful."""
    check = out.check
    if check is None:
        settle_steps(out)
        check = out.check
    assert check is not None
    lines_read = len({r.line for r in out.records})
    check.lines_read = lines_read
    check.record_like_lines = lines_read + len(out.problems)
    doubts = out.doubts
    if not out.records:
        doubts.append("no step records were read: nothing below describes the run")
        check.doubtful = True
        return check
    if check.max_records_per_step > 2 and check.max_records_per_step > 0.2 * check.records:
        doubts.append(f"{check.max_records_per_step} records fell on one step: the steps were not read right")
    planned = out.settings.get("max_steps")
    interval = out.settings.get("logging_steps")
    if isinstance(planned, int) and planned > 0 and check.last_step is not None:
        if check.last_step > planned:
            doubts.append(f"step {check.last_step} was read, past the {planned} steps the log's own header plans")
        if isinstance(interval, int) and interval > 0:
            check.expected_steps = planned // interval
            if out.settings.get("train_runtime") is not None and check.steps != check.expected_steps:
                doubts.append(
                    f"the run finished, so {check.expected_steps} records ({planned} steps / logging every "
                    f"{interval}) were expected; {check.steps} were read"
                )
    if check.record_like_lines and lines_read / check.record_like_lines < MIN_SHARE_READ:
        doubts.append(f"only {check.lines_text()}: the rest could not be parsed (see the malformed lines)")
    check.doubtful = bool(doubts)
    return check


def check_fields_kept(text: str, out: ParsedLog) -> None:
    """Doubt a read that kept under half of the numeric fields on the lines its records come from: the
    lines were claimed, but their content was not read (a wrong --format, a nested format read flat).

    Judged on at most FIELDS_SAMPLE of those lines, evenly spread (the share is what counts), read
    from ``text`` one line at a time rather than split into a list of every line."""
    if not out.records or out.check is None:
        return
    read = sorted({r.line for r in out.records if r.line > 0})
    sampled = len(read) > FIELDS_SAMPLE
    numbers = [read[int(i * len(read) / FIELDS_SAMPLE)] for i in range(FIELDS_SAMPLE)] if sampled else read
    wanted = set(numbers)
    kept: Counter[int] = Counter()
    for r in out.records:
        if r.line in wanted:
            kept[r.line] += sum(1 for v in r.values.values() if _is_number(v))
    fields = total_kept = lines_judged = 0
    for number, line in _lines_numbered(text, wanted):
        lines_judged += 1
        fields += len(_NUMERIC_FIELD_RE.findall(line)) if len(line) < 1_000_000 else 0
        total_kept += kept[number] + 1  # the step itself is a field the records keep as their step, not as a value
    if fields >= 20 and total_kept < MIN_FIELDS_KEPT * fields:
        where = f"{lines_judged:,} of the {len(read):,} lines it read" if sampled else f"the {len(read):,} lines it read"
        out.doubts.append(
            f"the reader kept {total_kept:,} of the {fields:,} numeric fields on {where} "
            f"({total_kept / fields:.0%}): those lines hold more than this format reads (is --format {out.format} right?)"
        )
        out.check.doubtful = True


def iter_blocks(text: str, block: int = 1 << 20) -> Iterator[str]:
    """``text`` in pieces of about ``block`` characters, each ending after a newline (so no line is
    cut, and the pieces' ``splitlines()`` are the text's)."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", start + block)
        end = size if end < 0 else end + 1
        yield text[start:end]
        start = end


def iter_lines(text: str, block: int = 1 << 20) -> Iterator[str]:
    """``text.splitlines()`` a block at a time: a 250 MB log split at once holds ~300 MB of lines."""
    for piece in iter_blocks(text, block):
        yield from piece.splitlines()


def _lines_numbered(text: str, wanted: set[int]) -> Iterator[tuple[int, str]]:
    """``(number, line)`` of the lines of ``text`` whose 1-based number (as ``splitlines()`` counts)
    is in ``wanted``, without holding every line at once."""
    last = max(wanted, default=0)
    for number, line in enumerate(iter_lines(text), start=1):
        if number > last:
            return
        if number in wanted:
            yield number, line


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        try:
            return not math.isnan(float(value)) or value.strip().lower() == "nan"
        except ValueError:
            return False
    return False
