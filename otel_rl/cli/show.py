"""``otel-rl show``: a run folder's steps as a table of the headline values (one row per step, as
the console summary prints them); ``--step N``: that step's trace as a waterfall; ``--step N
--samples``: the step's rollout samples (``rl.sample`` events: prompt, response, reward and its parts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (traces.jsonl inside)")
    parser.add_argument("--step", type=int, help="show this training step's trace (default: a table of every step)")
    parser.add_argument(
        "--rows", type=int, default=20, metavar="N", help="the step table shows its first and last rows, N in all (default 20)"
    )
    parser.add_argument("--all", action="store_true", help="the step table shows every row")
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    parser.add_argument(
        "--samples", action="store_true", help="print the step's rollout samples (logged with init(log_samples=K)) instead of its trace"
    )


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans, render_waterfall

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl show: {run_dir} does not exist", file=sys.stderr)
        return 2
    if args.step is None:
        if args.samples:
            print("otel-rl show: --samples needs --step N", file=sys.stderr)
            return 2
        return _show_steps(run_dir, None if args.all else max(2, args.rows))
    if args.samples:
        return _show_samples(run_dir, args.step)
    spans = read_spans(run_dir)
    if spans.problems:
        print(format_problems(spans.problems), file=sys.stderr)
    if not spans:
        print(f"otel-rl show: no spans in {run_dir} (is it a run folder with traces.jsonl?)", file=sys.stderr)
        return 1
    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        print(f"otel-rl show: {exc}", file=sys.stderr)
        return 1
    print(render_waterfall(trace, width=args.width))
    return 0


def _show_steps(run_dir: Path, limit: int | None) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.steps import format_step_table, headline_table, read_step_rows, read_step_seconds

    try:
        rows = read_step_rows(run_dir)
        seconds = read_step_seconds(run_dir)
    except (OSError, ValueError) as exc:  # not a run folder: a FIFO, a device, unreadable
        print(f"otel-rl show: {exc}", file=sys.stderr)
        return 1
    if rows.problems:
        print(format_problems(rows.problems), file=sys.stderr)
    if not rows and not seconds:
        print(f"otel-rl show: no steps in {run_dir} (no rl.step spans in traces.jsonl, no rl.log events in logs.jsonl)", file=sys.stderr)
        return 1
    columns, table = headline_table(rows, seconds)
    steps = sorted({int(entry["step"]) for entry in table})
    print(f"{len(steps)} steps ({steps[0]}-{steps[-1]}); seconds: the step's wall time; the rest as the console summary names them")
    print(format_step_table(columns, table, limit=limit))
    print(f"\nevery logged key: otel-rl export {run_dir} --format csv; one step's trace: otel-rl show {run_dir} --step {steps[-1]}")
    return 0


def _show_samples(run_dir: Path, step: int) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.samples import format_samples, read_samples, sample_steps

    rows = read_samples(run_dir, step)
    if rows.problems:
        print(format_problems(rows.problems), file=sys.stderr)
    if not rows:
        steps = sample_steps(run_dir)
        where = f"steps with samples: {_ranges(steps)}" if steps else "none at all: run with init(log_samples=K) / OTEL_RL_LOG_SAMPLES=K"
        print(f"otel-rl show: no rollout samples of step {step} in {run_dir} ({where})", file=sys.stderr)
        return 1
    print(f"step {step}: {len(rows)} rollout sample{'s' if len(rows) != 1 else ''}\n")
    print(format_samples(rows))
    return 0


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (f", ... ({len(steps)} steps)" if len(steps) > 10 else "")


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl show`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("show", help="print a run folder's steps as a table, or one step's trace as a waterfall")
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
