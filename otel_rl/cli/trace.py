"""``otel-rl trace``: find one step's trace (run folder or Jaeger), print where to open it and its
span tree, and export it as the JSON Jaeger's UI loads; ``--slowest K`` prints the step's slowest
agent trajectories instead, and ``--format chrome`` puts them on the timeline too."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from otel_rl.cli.show import add_rank_options, step_waterfall
from otel_rl.runs.waterfall import rank_list

DESCRIPTION = (
    "Find step N's trace in a run folder (default: the latest under otel-rl-runs/) or in Jaeger (--jaeger URL; "
    "also when there is no run folder), print its Jaeger link (when that Jaeger holds the trace) and its span tree, and "
    "with --out write it as the JSON Jaeger's UI loads from its upload button, or with --format chrome as the "
    "Chrome Trace Event JSON that ui.perfetto.dev and chrome://tracing open (a step or a range, --steps 3-7; one "
    "process per rank, one thread per cluster, one per agent trajectory, memory counters, torch.profiler traces "
    "merged with --profile). --slowest K prints the step's K slowest agent trajectories (traces of their own, "
    "read from a run folder) as span trees: turns, tool calls, finish reasons, tool errors, reward and why each was kept."
)


def latest_run_dir(base: Path = Path("otel-rl-runs")) -> Path | None:
    """The most recently written run folder under ``base`` (the default run-folder parent)."""
    runs = [p for p in base.glob("*") if (p / "traces.jsonl").is_file()] if base.is_dir() else []
    return max(runs, key=lambda p: (p / "traces.jsonl").stat().st_mtime) if runs else None


def _local_jaeger_url(default: str) -> str:
    """The local stack's Jaeger: its port moved by OTEL_RL_STACK_PORT_OFFSET, as ``otel-rl stack`` moves it."""
    from otel_rl.stack import default_port_offset

    offset = default_port_offset()
    return default if not offset else default.replace(":16686", f":{16686 + offset}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir_arg", nargs="?", metavar="RUN_DIR", help="read from this run folder (same as --run-dir)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--step", type=int, help="the training step")
    which.add_argument("--steps", metavar="N-M", help="several steps for --format chrome: a range (3-7) or a list (1,4-6)")
    parser.add_argument("--run-dir", metavar="DIR", help="read from this run folder")
    parser.add_argument(
        "--jaeger",
        metavar="URL",
        help="read the trace from Jaeger's query API at URL (without --jaeger and without a run folder: the local stack's, "
        "http://127.0.0.1:16686); with a run folder given, only where the link points, printed when that Jaeger holds the trace",
    )
    parser.add_argument("--service", metavar="NAME", help="with Jaeger: the run's service.name (default: search every service)")
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="the run (its rl.run.id): with Jaeger, when several runs have the step (without it they are listed); in a run "
        "folder given to several runs in turn, the one to read (default: the latest; the others are named)",
    )
    parser.add_argument(
        "--lookback", default="30d", metavar="SPAN", help="with Jaeger: how far back to search (30d, the local stack's retention; 12h, 90m)"
    )
    parser.add_argument("--out", metavar="FILE", help="write the trace to FILE (as --format says)")
    parser.add_argument(
        "--format",
        choices=("jaeger", "chrome"),
        default="jaeger",
        help="what --out writes: jaeger (the JSON Jaeger's UI uploads; the default) or chrome (Trace Event JSON for ui.perfetto.dev; "
        "from a run folder with each kept agent trajectory of the steps on a thread of its own)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="FILE",
        help="with --format chrome: merge this torch.profiler trace (export_chrome_trace / tensorboard_trace_handler "
        "output, .json or .json.gz) on its own tracks, aligned to the spans' clock; repeatable",
    )
    parser.add_argument(
        "--slowest",
        type=int,
        metavar="K",
        help="with --step N: print the K slowest agent trajectories kept of step N (those with rl.step N or linked to "
        "its trace), longest first, each as a span tree with its turns and tool calls, reward and why it was kept; "
        "with --format chrome: only those K of each step go on the timeline (default: every kept one). Run folders only",
    )
    parser.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    add_rank_options(parser)


def _fail(message: str, status: int) -> int:
    print(f"otel-rl trace: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import SpanRecord, find_step_trace, format_problems, read_spans
    from otel_rl.runs.out_path import out_file_problem, write_error

    chrome = args.format == "chrome"
    if args.steps is not None and not chrome:
        return _fail("--steps needs --format chrome (the tree and Jaeger JSON show one step: use --step N)", 2)
    if args.profile and not chrome:
        return _fail("--profile needs --format chrome --out FILE", 2)
    if chrome and not args.out:
        return _fail("--format chrome needs --out FILE (the .json to open in ui.perfetto.dev)", 2)
    if (args.rank is not None or args.ranks) and (args.step is None or chrome):
        return _fail("--rank / --ranks need --step N and the span tree (the Chrome export keeps one process per rank)", 2)
    if args.slowest is not None and args.slowest < 1:
        return _fail(f"--slowest must be >= 1, not {args.slowest}", 2)
    if args.slowest is not None and args.out and not chrome:
        return _fail("--slowest prints the trajectories; to write them with --out, add --format chrome", 2)
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
    from otel_rl.runs.jaeger import DEFAULT_JAEGER_URL, AmbiguousRunError, JaegerClient, JaegerError, parse_lookback

    try:
        lookback_s = parse_lookback(args.lookback)
    except ValueError as exc:
        return _fail(f"--lookback: {exc}", 2)
    run_dir_arg = args.run_dir_arg or args.run_dir
    run_dir = Path(run_dir_arg) if run_dir_arg else None
    # A run folder given: read it (a --jaeger URL is then only where the link points). --jaeger alone:
    # read Jaeger. Neither: the latest run folder, else the local stack's Jaeger.
    if run_dir is None and not args.jaeger:
        run_dir = latest_run_dir()
    if args.out and (problem := out_file_problem(args.out, [run_dir] if run_dir is not None else [])) is not None:
        return _fail(problem, 2)
    if args.slowest is not None and run_dir is None:
        return _fail(
            "--slowest reads agent trajectories from a run folder (each is a trace of its own, which this command does not "
            "search Jaeger for): give the run folder (otel-rl trace RUN_DIR --step N --slowest K), or in Jaeger's UI search "
            "the operation rl.trajectory with the tag rl.step=N",
            2,
        )
    client = JaegerClient(args.jaeger or _local_jaeger_url(DEFAULT_JAEGER_URL), lookback_s=lookback_s)
    source: str
    spans: list[SpanRecord]
    selection = None
    if run_dir is not None:
        if not run_dir.exists():
            return _fail(f"{run_dir} does not exist", 2)
        from otel_rl.runs.run_selection import choose_run

        read = read_spans(run_dir)
        if read.problems:
            print(format_problems(read.problems), file=sys.stderr)
        try:
            choice = choose_run((span.resource for span in read), args.run_id)
        except LookupError as exc:
            return _fail(f"{run_dir}: {exc}", 2)
        if choice.note:
            print(f"otel-rl trace: {choice.note}", file=sys.stderr)
        spans = [span for span in read if choice.keeps(span.resource)]
        selection = choice
        source = f"run folder {run_dir}" + (f" (run {choice.run_id})" if choice.others else "")
    else:
        try:
            spans = [span for step in steps for span in client.step_trace_spans(step, service=args.service, run_id=args.run_id)]
        except AmbiguousRunError as exc:
            return _fail(_list_runs(str(exc), exc.choices), 2)
        except JaegerError as exc:
            if exc.unreachable and not args.jaeger:
                return _fail(
                    f"no run found: no run folder under {Path('otel-rl-runs').resolve()}, and no Jaeger answers at "
                    f"{client.base_url} (the local stack's: `otel-rl stack up` starts it). Give a run folder "
                    "(otel-rl trace RUN_DIR --step N), or --jaeger URL",
                    1,
                )
            hint = "" if args.jaeger else " (no run folder under otel-rl-runs/ either: give one, or --jaeger URL)"
            return _fail(f"{exc}{hint}", 1)
        source = f"Jaeger at {client.base_url}" + (f" (service {args.service})" if args.service else "")
    if args.step is None:
        return _write_chrome(args, spans, steps, source)
    if args.slowest is not None and run_dir is not None:
        status = _print_slowest(args, spans, run_dir, selection, source)
        return status if status or not chrome else _write_chrome(args, spans, steps, source)
    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        return _fail(f"{exc} (in {source})", 1)
    trace_id = trace[0].trace_id
    print(f"step {args.step}: trace {trace_id} from {source}")
    if run_dir is None or _jaeger_has(client.base_url, trace_id):
        print(f"  Jaeger:  {client.trace_url(trace_id)}")
    else:
        upload = f"the file --out writes ({args.out})" if args.out else "the file --out FILE writes"
        print(f"  Jaeger:  {client.base_url} does not hold this trace; load {upload} in Jaeger's UI (Search > JSON File)")
    text = step_waterfall(trace, args)
    if text is None:
        return _fail(f"no span of rank {args.rank} in step {args.step}'s trace (ranks there: {rank_list(trace)})", 1)
    print(text)
    if run_dir is not None:
        from otel_rl.runs.trajectories import step_trajectories

        kept = len(step_trajectories(spans, args.step, trace))
        if kept:
            print(
                f"  {kept} agent trajectories of this step are traces of their own:  otel-rl trace {run_dir} --step {args.step} --slowest 5"
            )
    if chrome:
        return _write_chrome(args, spans, steps, source)
    if args.out:
        from otel_rl.runs.jaeger_json import write_jaeger_json

        try:
            write_jaeger_json(trace, args.out)
        except OSError as exc:
            return _fail(write_error(args.out, exc), 2)
        print(f"wrote {args.out}: Jaeger's own JSON of the trace; its UI loads it from Search > JSON File")
    return 0


def _jaeger_has(base_url: str, trace_id: str) -> bool:
    """Whether the Jaeger the link would point at holds the trace (bounded: a Jaeger that is not there costs ~1 s)."""
    from otel_rl.runs.jaeger import JaegerClient, JaegerError

    try:
        return bool(JaegerClient(base_url, timeout_s=1.0).trace(trace_id))
    except JaegerError:
        return False


def _list_runs(message: str, choices: list[Any]) -> str:
    """The message and one line per run: service, run id, first and last step time (UTC), number of steps."""
    from datetime import datetime, timezone

    def when(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    width = max([len(c.service) for c in choices] + [len("service (--service)")])
    lines = [
        message,
        f"  {'service (--service)':<{width}} {'run id (--run-id)':<36} {'first step (UTC)':<20} {'last step (UTC)':<20} steps",
    ]
    for c in choices:
        run = c.run_id or "(none: spans without rl.run.id)"
        lines.append(f"  {c.service:<{width}} {run:<36} {when(c.first_ns):<20} {when(c.last_ns):<20} {c.steps}")
    return "\n".join(lines)


def _print_slowest(args: argparse.Namespace, spans: Any, run_dir: Path, selection: Any, source: str) -> int:
    """``--step N --slowest K``: step N's K slowest kept agent trajectories as span trees."""
    from otel_rl.runs.trajectories import read_trajectory_counts, render_trajectories, slowest, step_trajectories
    from otel_rl.runs.waterfall import find_step_trace

    try:
        trace = find_step_trace(spans, args.step)
    except LookupError as exc:
        trace, missing = [], str(exc)
    else:
        missing = ""
    found = step_trajectories(spans, args.step, trace)
    counts = read_trajectory_counts(run_dir, selection)
    if counts is None:
        total = "the run's metrics count no agent trajectory (no rl.trajectory.count in its metrics.jsonl)"
    else:
        total = f"the run's metrics (all steps): {counts.describe()}"
    if not found:
        return _fail(f"step {args.step} has no kept agent trajectories in {source}; " + (f"{missing}; " if missing else "") + total, 1)
    shown = slowest(found, args.slowest)
    print(f"step {args.step}: {len(found)} agent trajectories kept, from {source}; the {len(shown)} slowest, longest first\n  {total}")
    print()
    print(render_trajectories(shown, width=args.width))
    return 0


def _write_chrome(args: argparse.Namespace, spans: Any, steps: list[int], source: str) -> int:
    """``--format chrome``: the steps' spans, their agent trajectories (the --slowest K of each step,
    else every kept one) and any --profile as Chrome Trace Event JSON in --out."""
    from otel_rl.runs.chrome_trace import ProfileError, load_torch_profile, step_traces, to_chrome_trace, write_chrome_trace
    from otel_rl.runs.out_path import write_error
    from otel_rl.runs.trajectories import slowest, step_trajectories
    from otel_rl.runs.waterfall import find_step_trace, format_duration

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
    trajectories = [
        span
        for step in shown
        for found in slowest(step_trajectories(spans, step, find_step_trace(window, step)), args.slowest)
        for span in found.spans
    ]
    data, summary = to_chrome_trace(window + trajectories, profiles, other_data={"source": source, "steps": ",".join(map(str, shown))})
    try:
        write_chrome_trace(data, args.out)
    except OSError as exc:
        return _fail(write_error(args.out, exc), 2)
    start, end = summary.window_ns
    what = f"step {shown[0]}" if len(shown) == 1 else f"{len(shown)} steps"
    print(
        f"wrote {args.out}: {what}, {summary.spans} spans on rank{'s' if len(summary.ranks) != 1 else ''} "
        f"{', '.join(map(str, summary.ranks))} over {format_duration(end - start)}, {summary.counters} memory counter samples"
        + (f", {summary.trajectories} agent trajectories (a thread each)" if summary.trajectories else "")
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
