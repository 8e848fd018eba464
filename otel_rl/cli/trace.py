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
    "with --out write it as the JSON Jaeger's UI loads from its upload button, or with --format chrome as the "
    "Chrome Trace Event JSON that ui.perfetto.dev and chrome://tracing open (a step or a range, --steps 3-7; one "
    "process per rank, one thread per cluster, memory counters, torch.profiler traces merged with --profile)."
)


def latest_run_dir(base: Path = Path("otel-rl-runs")) -> Path | None:
    """The most recently written run folder under ``base`` (the default run-folder parent)."""
    runs = [p for p in base.glob("*") if (p / "traces.jsonl").is_file()] if base.is_dir() else []
    return max(runs, key=lambda p: (p / "traces.jsonl").stat().st_mtime) if runs else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir_arg", nargs="?", metavar="RUN_DIR", help="read from this run folder (same as --run-dir)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--step", type=int, help="the training step")
    which.add_argument("--steps", metavar="N-M", help="several steps for --format chrome: a range (3-7) or a list (1,4-6)")
    parser.add_argument("--run-dir", metavar="DIR", help="read from this run folder")
    parser.add_argument("--phoenix", metavar="URL", help="read from the Phoenix trace store at URL (e.g. http://127.0.0.1:6006)")
    parser.add_argument(
        "--project",
        default="default",
        help="Phoenix project (default: default; a run picks its project with OTEL_RESOURCE_ATTRIBUTES=openinference.project.name=NAME)",
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="with --phoenix: the run (its rl.run.id) when several runs in the project have the step; without it they are listed",
    )
    parser.add_argument(
        "--jaeger-url",
        default="http://localhost:16686",
        help="Jaeger query service/UI base URL (default: the Docker stack's); the link is printed only when it answers",
    )
    parser.add_argument("--out", metavar="FILE", help="write the trace to FILE (as --format says)")
    parser.add_argument(
        "--format",
        choices=("jaeger", "chrome"),
        default="jaeger",
        help="what --out writes: jaeger (the JSON Jaeger's UI uploads; the default) or chrome (Trace Event JSON for ui.perfetto.dev)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="FILE",
        help="with --format chrome: merge this torch.profiler trace (export_chrome_trace / tensorboard_trace_handler "
        "output, .json or .json.gz) on its own tracks, aligned to the spans' clock; repeatable",
    )
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")


def _fail(message: str, status: int) -> int:
    print(f"otel-rl trace: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import SpanRecord, find_step_trace, format_problems, read_spans, render_waterfall

    chrome = args.format == "chrome"
    if args.steps is not None and not chrome:
        return _fail("--steps needs --format chrome (the tree and Jaeger JSON show one step: use --step N)", 2)
    if args.profile and not chrome:
        return _fail("--profile needs --format chrome --out FILE", 2)
    if chrome and not args.out:
        return _fail("--format chrome needs --out FILE (the .json to open in ui.perfetto.dev)", 2)
    if args.step is not None:
        steps = [args.step]
    else:
        from otel_rl.runs.chrome_trace import parse_steps

        try:
            steps = parse_steps(str(args.steps))
        except ValueError as exc:
            return _fail(f"--steps: {exc}", 2)
    if args.run_dir_arg and args.run_dir and Path(args.run_dir_arg) != Path(args.run_dir):
        return _fail(f"two run folders given ({args.run_dir_arg} and --run-dir {args.run_dir}): give one", 2)
    source: str
    phoenix_url = args.phoenix or None
    run_dir_arg = args.run_dir_arg or args.run_dir
    run_dir = Path(run_dir_arg) if run_dir_arg else None
    if run_dir is None and phoenix_url is None:
        run_dir = latest_run_dir()
        if run_dir is None:
            phoenix_url = "http://127.0.0.1:6006"
    trace_url = None
    spans: list[SpanRecord]
    if run_dir is not None:
        if not run_dir.exists():
            return _fail(f"{run_dir} does not exist", 2)
        read = read_spans(run_dir)
        if read.problems:
            print(format_problems(read.problems), file=sys.stderr)
        spans = read
        source = f"run folder {run_dir}"
    else:
        from otel_rl.runs.phoenix import AmbiguousRunError, PhoenixClient, PhoenixError

        client = PhoenixClient(str(phoenix_url), project=args.project)
        try:
            spans = [span for step in steps for span in client.step_trace_spans(step, run_id=args.run_id)]
        except AmbiguousRunError as exc:
            return _fail(_list_runs(str(exc), exc.choices), 2)
        except PhoenixError as exc:
            return _fail(str(exc), 1)
        source = f"Phoenix at {phoenix_url} (project {args.project})"
    if args.step is None:
        return _write_chrome(args, spans, steps, source)
    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        return _fail(f"{exc} (in {source})", 1)
    trace_id = trace[0].trace_id
    if run_dir is None:
        try:
            trace_url = client.trace_url(trace_id)
        except PhoenixError as exc:
            print(f"otel-rl trace: {exc}", file=sys.stderr)
    from otel_rl.runs.jaeger_json import jaeger_answers

    print(f"step {args.step}: trace {trace_id} from {source}")
    if jaeger_answers(args.jaeger_url):
        print(f"  Jaeger:  {args.jaeger_url.rstrip('/')}/trace/{trace_id}")
    else:
        upload = f"the file --out writes ({args.out})" if args.out else "the file --out FILE writes"
        print(f"  Jaeger:  none answers at {args.jaeger_url}; load {upload} in Jaeger's UI (Search > JSON File)")
    if trace_url:
        print(f"  Phoenix: {trace_url}")
    print(render_waterfall(trace, width=args.width))
    if chrome:
        return _write_chrome(args, trace, steps, source)
    if args.out:
        from otel_rl.runs.jaeger_json import write_jaeger_json

        write_jaeger_json(trace, args.out)
        print(f"wrote {args.out}: load it in Jaeger's UI (Search > JSON File) to view this step without a Jaeger server")
    return 0


def _list_runs(message: str, choices: list[Any]) -> str:
    """The message and one line per run: run id, first and last step time (UTC), number of steps."""
    from datetime import datetime, timezone

    def when(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    lines = [message, f"  {'run id (--run-id)':<36} {'first step (UTC)':<20} {'last step (UTC)':<20} steps"]
    for c in choices:
        lines.append(f"  {c.run_id or '(none: spans without rl.run.id)':<36} {when(c.first_ns):<20} {when(c.last_ns):<20} {c.steps}")
    return "\n".join(lines)


def _write_chrome(args: argparse.Namespace, spans: Any, steps: list[int], source: str) -> int:
    """``--format chrome``: the steps' spans (and any --profile) as Chrome Trace Event JSON in --out."""
    from otel_rl.runs.chrome_trace import ProfileError, load_torch_profile, step_traces, to_chrome_trace, write_chrome_trace
    from otel_rl.runs.waterfall import format_duration

    try:
        window, missing = step_traces(spans, steps)
    except LookupError as exc:
        return _fail(f"{exc} (in {source})", 1)
    if missing:
        print(
            f"otel-rl trace: no trace for step{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} (skipped)", file=sys.stderr
        )
    try:
        profiles = [load_torch_profile(path) for path in args.profile]
    except ProfileError as exc:
        return _fail(str(exc), 2)
    shown = [s for s in steps if s not in missing]
    data, summary = to_chrome_trace(window, profiles, other_data={"source": source, "steps": ",".join(map(str, shown))})
    try:
        write_chrome_trace(data, args.out)
    except OSError as exc:
        return _fail(f"cannot write {args.out}: {exc}", 1)
    start, end = summary.window_ns
    what = f"step {shown[0]}" if len(shown) == 1 else f"{len(shown)} steps"
    print(
        f"wrote {args.out}: {what}, {summary.spans} spans on rank{'s' if len(summary.ranks) != 1 else ''} "
        f"{', '.join(map(str, summary.ranks))} over {format_duration(end - start)}, {summary.counters} memory counter samples"
    )
    for path, merged, outside in summary.profiles:
        print(f"  merged {path}: {merged} events on tracks of their own")
        if merged and outside == merged:
            print(
                f"otel-rl trace: none of {path}'s events fall in the steps' window: was it taken during another step? "
                "(profile the same steps, or widen --steps)",
                file=sys.stderr,
            )
        elif outside:
            print(f"    {outside} of them fall outside the steps' window")
    print("open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)")
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
