"""``otel-rl export``: a run folder's steps as a table file, one row per step (and rank): ``step``,
``time``, ``rank`` (several ranks), then every key the steps logged, values as logged (CSV, or
Parquet with pyarrow). The table is built in ``otel_rl.runs.step_export``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (logs.jsonl inside)")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv", help="csv (default) or parquet (needs pyarrow)")
    parser.add_argument("--out", metavar="FILE", help="write to FILE (default: CSV to standard output; parquet needs --out)")
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="a folder given to several runs in turn holds them all: export this one (default: the latest; the others are named)",
    )


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import format_problems
    from otel_rl.runs.out_path import out_file_problem, write_error
    from otel_rl.runs.step_export import PARQUET_HINT, write_csv, write_parquet
    from otel_rl.runs.steps import read_step_rows

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl export: {run_dir} does not exist", file=sys.stderr)
        return 2
    if args.format == "parquet" and not args.out:
        print("otel-rl export: --format parquet writes a file: give --out FILE", file=sys.stderr)
        return 2
    if args.out and (problem := out_file_problem(args.out, [run_dir])) is not None:
        print(f"otel-rl export: {problem}", file=sys.stderr)
        return 2
    try:
        rows = read_step_rows(run_dir, args.run_id)
    except LookupError as exc:
        print(f"otel-rl export: {run_dir}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # not a run folder: a FIFO, a device, unreadable
        print(f"otel-rl export: {exc}", file=sys.stderr)
        return 1
    if rows.problems:
        print(f"otel-rl export: {format_problems(rows.problems)}", file=sys.stderr)
    if rows.run.note:
        print(f"otel-rl export: {rows.run.note}", file=sys.stderr)
    if rows.without_step:
        print(f"otel-rl export: left out {rows.without_step} rl.log event(s) logged without a step", file=sys.stderr)
    if not rows:
        print(f"otel-rl export: no steps in {run_dir} (no rl.log events with a step in logs.jsonl)", file=sys.stderr)
        return 1
    if not args.out:
        write_csv(rows, sys.stdout)
        return 0
    try:
        if args.format == "parquet":
            count = write_parquet(rows, args.out)
        else:
            with open(args.out, "w", newline="", encoding="utf-8") as out:
                count = write_csv(rows, out)
    except ImportError:
        print(f"otel-rl export: --format parquet needs pyarrow: {PARQUET_HINT}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"otel-rl export: {write_error(args.out, exc)}", file=sys.stderr)
        return 2
    print(f"wrote {count} rows to {args.out}", file=sys.stderr)
    return 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl export`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("export", help="write a run folder's steps as CSV or Parquet, one row per step")
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
