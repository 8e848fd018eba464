"""``otel-rl show``: a run folder's steps as a table of the headline values (one row per step, as
the console summary prints them); ``--step N``: that step's trace as a waterfall; ``--step N
--samples``: the step's rollout samples (``rl.sample`` events: prompt, response, reward and its parts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from otel_rl.runs.waterfall import FOLD_MIN_RANKS, rank_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (traces.jsonl inside)")
    parser.add_argument("--step", type=int, help="show this training step's trace (default: a table of every step)")
    parser.add_argument(
        "--rows", type=int, default=20, metavar="N", help="the step table shows its first and last rows, N in all (default 20)"
    )
    parser.add_argument("--all", action="store_true", help="the step table shows every row")
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="a folder given to several runs in turn holds them all: read this one (default: the latest; the others are named)",
    )
    parser.add_argument(
        "--samples", action="store_true", help="print the step's rollout samples (logged with init(log_samples=K)) instead of its trace"
    )
    add_rank_options(parser)


def add_rank_options(parser: argparse.ArgumentParser) -> None:
    """--rank / --ranks: how a step's trace shows a multi-rank job (show --step, trace --step)."""
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help=f"with --step N: rank R's spans alone, each on its line (by default a stage run by {FOLD_MIN_RANKS} ranks or "
        "more is one line: its slowest, median and fastest rank and the stragglers)",
    )
    ranks.add_argument("--ranks", action="store_true", help="with --step N: every rank's spans on their own lines, unfolded")


def step_waterfall(trace: list, args: argparse.Namespace) -> str | None:
    """The step's waterfall as --rank / --ranks ask; None when --rank names a rank with no span there."""
    from otel_rl.runs.waterfall import keep_rank, render_waterfall

    if args.rank is not None:
        trace = keep_rank(trace, args.rank)
        if not trace:
            return None
    return render_waterfall(trace, width=args.width, fold_min_ranks=None if args.ranks or args.rank is not None else FOLD_MIN_RANKS)


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans
    from otel_rl.runs.run_selection import choose_run

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl show: {run_dir} does not exist", file=sys.stderr)
        return 2
    if args.step is None:
        for given, flag in ((args.samples, "--samples"), (args.rank is not None or args.ranks, "--rank / --ranks")):
            if given:
                print(f"otel-rl show: {flag} needs --step N", file=sys.stderr)
                return 2
        return _show_steps(run_dir, None if args.all else max(2, args.rows), args.run_id)
    if args.samples:
        return _show_samples(run_dir, args.step, args.run_id)
    spans = read_spans(run_dir)
    if spans.problems:
        print(format_problems(spans.problems), file=sys.stderr)
    if not spans:
        print(f"otel-rl show: no spans in {run_dir} (is it a run folder with traces.jsonl?)", file=sys.stderr)
        return 1
    try:
        choice = choose_run((span.resource for span in spans), args.run_id)
    except LookupError as exc:
        print(f"otel-rl show: {run_dir}: {exc}", file=sys.stderr)
        return 2
    if choice.note:
        print(f"otel-rl show: {choice.note}", file=sys.stderr)
    try:
        trace = find_step_trace([span for span in spans if choice.keeps(span.resource)], args.step)
    except LookupError as exc:
        print(f"otel-rl show: {exc}", file=sys.stderr)
        return 1
    text = step_waterfall(trace, args)
    if text is None:
        print(f"otel-rl show: no span of rank {args.rank} in step {args.step}'s trace (ranks there: {rank_list(trace)})", file=sys.stderr)
        return 1
    print(text)
    return 0


def _show_steps(run_dir: Path, limit: int | None, run_id: str | None) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.step_table import read_step_table
    from otel_rl.runs.steps import SECONDS_COLUMN, format_step_table

    try:
        table = read_step_table(run_dir, run_id, limit)  # one streaming pass: memory holds the rows shown
    except LookupError as exc:
        print(f"otel-rl show: {run_dir}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # not a run folder: a FIFO, a device, unreadable
        print(f"otel-rl show: {exc}", file=sys.stderr)
        return 1
    if table.problems:
        print(format_problems(table.problems), file=sys.stderr)
    if table.run.note:
        print(f"otel-rl show: {table.run.note}", file=sys.stderr)
    if not table.total:
        print(f"otel-rl show: {_why_no_steps(run_dir)}", file=sys.stderr)
        return 1
    timed = "seconds: the step's wall time; " if SECONDS_COLUMN in table.columns else ""
    print(f"{table.steps} steps ({table.first_step}-{table.last_step}); {timed}the values as the console summary names them")
    print(format_step_table(table.columns, table.rows, limit=limit, total=table.total))
    hint = f"\nevery logged key: otel-rl export {run_dir} --format csv"
    if table.last_traced is not None:  # a folder replayed from a log without stage timers has no step traces
        hint += f"; one step's trace: otel-rl show {run_dir} --step {table.last_traced}"
    print(hint)
    return 0


def _why_no_steps(folder: Path) -> str:
    """What ``folder`` is, when it holds no steps: a folder of run folders, a spool only, or neither."""
    from otel_rl._sdk.lifecycle.run_lock import RUN_INFO_FILE
    from otel_rl.exporters.files import LOGS_FILE

    runs = (
        sorted(p for p in folder.iterdir() if p.is_dir() and any((p / name).exists() for name in (RUN_INFO_FILE, LOGS_FILE)))
        if folder.is_dir()
        else []
    )
    if runs:
        names = ", ".join(p.name for p in runs[-5:])
        return (
            f"{folder} is a folder of {len(runs)} run folder(s), not one run ({names}{' and more' if len(runs) > 5 else ''}): "
            f"give one, e.g. otel-rl show {runs[-1]}"
        )
    spool = folder / "spool"
    if spool.is_dir() and any(spool.rglob("*")):
        return (
            f"no steps in {folder}'s files: its telemetry is in {spool}, waiting for the collector it was sent to "
            f'(otel-rl push {folder} delivers it; add exporters="otlp,file" to keep a readable copy in the folder)'
        )
    return f"no steps in {folder} (no rl.step spans in traces.jsonl, no rl.log events in logs.jsonl)"


def _show_samples(run_dir: Path, step: int, run_id: str | None) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.samples import format_samples, read_samples, sample_steps

    try:
        rows = read_samples(run_dir, step, run_id)
    except LookupError as exc:
        print(f"otel-rl show: {run_dir}: {exc}", file=sys.stderr)
        return 2
    if rows.problems:
        print(format_problems(rows.problems), file=sys.stderr)
    if not rows:
        steps = sample_steps(run_dir, run_id)
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
