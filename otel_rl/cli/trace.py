"""``otel-rl trace``: find one step's trace (run folder or Phoenix), print where to open it and its
span tree, and export it as the JSON Jaeger's UI loads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = (
    "Find step N's trace in a run folder (default: the latest under otel-rl-runs/) or in a Phoenix trace "
    "store (--phoenix URL), print where to open it (Jaeger's /trace/<id>, Phoenix), its span tree, and "
    "with --out write it as the JSON Jaeger's UI loads from its upload button."
)


def latest_run_dir(base: Path = Path("otel-rl-runs")) -> Path | None:
    """The most recently written run folder under ``base`` (the default run-folder parent)."""
    runs = [p for p in base.glob("*") if (p / "traces.jsonl").is_file()] if base.is_dir() else []
    return max(runs, key=lambda p: (p / "traces.jsonl").stat().st_mtime) if runs else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=int, required=True, help="the training step")
    parser.add_argument("--run-dir", metavar="DIR", help="read from this run folder")
    parser.add_argument("--phoenix", metavar="URL", help="read from the Phoenix trace store at URL (e.g. http://127.0.0.1:6006)")
    parser.add_argument(
        "--project",
        default="default",
        help="Phoenix project (default: default; a run picks its project with OTEL_RESOURCE_ATTRIBUTES=openinference.project.name=NAME)",
    )
    parser.add_argument(
        "--jaeger-url", default="http://localhost:16686", help="Jaeger UI base URL for the printed link (default: the Docker stack's)"
    )
    parser.add_argument("--out", metavar="FILE", help="write the trace as Jaeger JSON to FILE")
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans, render_waterfall

    source: str
    phoenix_url = args.phoenix or None
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is None and phoenix_url is None:
        run_dir = latest_run_dir()
        if run_dir is None:
            phoenix_url = "http://127.0.0.1:6006"
    trace_url = None
    if run_dir is not None:
        if not run_dir.exists():
            print(f"otel-rl trace: {run_dir} does not exist", file=sys.stderr)
            return 2
        spans = read_spans(run_dir)
        if spans.problems:
            print(format_problems(spans.problems), file=sys.stderr)
        source = f"run folder {run_dir}"
    else:
        from otel_rl.runs.phoenix import PhoenixClient, PhoenixError

        client = PhoenixClient(str(phoenix_url), project=args.project)
        try:
            spans = client.step_trace_spans(args.step)
        except PhoenixError as exc:
            print(f"otel-rl trace: {exc}", file=sys.stderr)
            return 1
        source = f"Phoenix at {phoenix_url} (project {args.project})"
    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        print(f"otel-rl trace: {exc} (in {source})", file=sys.stderr)
        return 1
    trace_id = trace[0].trace_id
    if run_dir is None:
        try:
            trace_url = client.trace_url(trace_id)
        except PhoenixError as exc:
            print(f"otel-rl trace: {exc}", file=sys.stderr)
    print(f"step {args.step}: trace {trace_id} from {source}")
    print(f"  Jaeger:  {args.jaeger_url.rstrip('/')}/trace/{trace_id}")
    if trace_url:
        print(f"  Phoenix: {trace_url}")
    print(render_waterfall(trace, width=args.width))
    if args.out:
        from otel_rl.runs.jaeger_json import write_jaeger_json

        write_jaeger_json(trace, args.out)
        print(f"wrote {args.out}: load it in Jaeger's UI (Search > JSON File) to view this step without a Jaeger server")
    return 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl trace`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser(
        "trace",
        help="find one step's trace (run folder or trace store), print its URL and tree, export it for Jaeger",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
