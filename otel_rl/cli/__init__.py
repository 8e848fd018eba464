"""The ``otel-rl`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

EPILOG = """\
examples:
  otel-rl demo --steps 20                    a real GRPO run on CPU, telemetry into otel-rl-runs/
  otel-rl demo --ranks 2 --slow-rank 1       the same on 2 processes (gloo); rank 1 is the straggler
  otel-rl demo --async                       async RL: rollout overlaps training, policy lag and stale samples
  otel-rl show otel-rl-runs/<run> --step 3   that step's trace as a waterfall
  otel-rl trace --step 3 --out step3.json    find a step's trace (latest run or --phoenix URL), export it for Jaeger
  otel-rl semconv check                      validate the registry and the framework mappings
  otel-rl semconv generate [--check]         regenerate otel_rl/semconv/ and docs/semconv/
  otel-rl semconv resolve --framework trl kl completions/clipped_ratio
  otel-rl replay logging.jsonl               send a training log (ms-swift, TRL/HF, verl, ROLL) through telemetry
  otel-rl analyze logging.jsonl --out rep/   find spikes, collapses and their chains; write report.md/.html/.json
  otel-rl dashboards generate [--check]      regenerate grafana/dashboards from the registry
  otel-rl alerts generate [--check]          regenerate grafana/alerts and grafana/provisioning/alerting
"""


def find_semconv_dir(explicit: str | None) -> Path:
    """The registry folder: --registry, else semconv/ above the working directory or beside the package."""
    from otel_rl.codegen.generate import find_repo_root

    if explicit:
        path = Path(explicit)
        if not (path / "registry").is_dir():
            raise SystemExit(f"otel-rl: {path} has no registry/ folder; pass --registry pointing at the semconv/ folder")
        return path
    return find_repo_root(option="--registry") / "semconv"


def _cmd_semconv_check(args: argparse.Namespace) -> int:
    from otel_rl._sdk.keys import load_mapping_files, validate_mappings
    from otel_rl.codegen.registry import load_registry

    semconv_dir = find_semconv_dir(args.registry)
    registry = load_registry(semconv_dir)
    problems = [str(p) for p in registry.problems]
    try:
        mappings = load_mapping_files(semconv_dir / "mappings")
    except ValueError as exc:
        problems.append(str(exc))
        mappings = []
    if not registry.problems:
        metrics = {name: {"attributes": tuple(r.id for r in g.attributes)} for name, g in registry.metrics.items()}
        problems += validate_mappings(mappings, metrics, set(registry.attributes), registry.enum_members())
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"otel-rl semconv check: {len(problems)} problem(s) in {semconv_dir}", file=sys.stderr)
        return 1
    print(f"otel-rl semconv check: ok ({len(registry.metrics)} metrics, {len(registry.attributes)} attributes, "
          f"{len(mappings)} framework mappings in {semconv_dir})")
    return 0


def _cmd_semconv_generate(args: argparse.Namespace) -> int:
    import otel_rl.codegen.generate as _codegen
    semconv_dir = find_semconv_dir(args.registry)
    repo_root = semconv_dir.parent
    registry, files = _codegen.generate(repo_root, semconv_dir)
    if registry.problems:
        for p in registry.problems:
            print(p, file=sys.stderr)
        print("otel-rl semconv generate: fix the registry first (otel-rl semconv check)", file=sys.stderr)
        return 1
    return _codegen.check_or_write("otel-rl semconv generate", repo_root, {f.path: f.content for f in files},
                                   _codegen.stale_files(repo_root, files), check=args.check, source="semconv/",
                                   stale_reason="stale: not produced by the registry")


def _cmd_semconv_resolve(args: argparse.Namespace) -> int:
    from otel_rl._sdk.keys import KeyResolver

    resolver = KeyResolver.from_directory(find_semconv_dir(args.registry)) if args.registry else KeyResolver.default()
    fallback = 0
    for key in args.keys:
        res = resolver.resolve(key, args.framework)
        attrs = " ".join(f'{k}="{v}"' for k, v in res.attributes)
        mark = "  (fallback: no mapping knows this key)" if res.fallback else ""
        via = f" via {res.framework}" if res.framework else ""
        transform = f" transform={getattr(res.transform, '__name__', res.transform)}" if res.transform else ""
        print(f"{key}\t-> {res.metric}{{{attrs}}}{via}{transform}{mark}")
        fallback += res.fallback
    return 1 if fallback else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        from otel_rl.demo import run_demo
    except ImportError as exc:
        if "torch" in str(exc):
            print("otel-rl demo needs PyTorch: pip install 'otel-rl[torch]' (CPU build: pip install torch==2.13.0)", file=sys.stderr)
            return 2
        raise
    import otel_rl

    if args.ranks < 1:
        print(f"otel-rl demo: --ranks must be >= 1, not {args.ranks}", file=sys.stderr)
        return 2
    if args.slow_rank is not None and not 0 <= args.slow_rank < args.ranks:
        print(f"otel-rl demo: --slow-rank {args.slow_rank} is not one of the {args.ranks} rank(s) 0..{args.ranks - 1}", file=sys.stderr)
        return 2
    # The telemetry's one-line summary per step is the demo's progress display.
    options = {"service_name": f"otel-rl-demo-{args.algo}", "framework": "roll", "console": not args.quiet}
    if args.out:
        options["run_dir"] = args.out
    demo_args = dict(steps=args.steps, algo=args.algo, out=args.out, seed=args.seed, inject_spike_at=args.inject_spike_at,
                     progress=False, async_rollout=args.async_rollout, slow_rank=args.slow_rank)
    if args.max_staleness is not None:
        from otel_rl.demo import DemoConfig

        demo_args["config"] = DemoConfig(max_staleness=args.max_staleness)
    if args.ranks > 1:
        result = run_demo(ranks=args.ranks, telemetry_options=options, **demo_args)
        print(_demo_summary(result))
        print(f"  telemetry: {result.out}  ({args.ranks} ranks: traces.jsonl, traces.rank1.jsonl, ...)")
        print(f"  one step's trace, every rank:  otel-rl show {result.out} --step {result.steps}")
        return 0
    tel = otel_rl.init(**options)
    try:
        result = run_demo(telemetry=tel, **demo_args)
    finally:
        tel.shutdown()
    print(_demo_summary(result))
    if tel.run_dir is not None:
        print(f"  telemetry: {tel.run_dir}  (traces.jsonl, metrics.jsonl, logs.jsonl)")
        print(f"  one step's trace:  otel-rl show {tel.run_dir} --step {result.steps}")
    else:
        print(f"  telemetry: {', '.join(tel._providers.destinations)}")
    return 0


def _demo_summary(result: Any) -> str:
    first, last = result.rewards[:5], result.rewards[-5:]
    return (f"otel-rl demo: {result.steps} {result.algo} steps; mean score {sum(first) / len(first):.3f} (first 5 steps) -> "
            f"{sum(last) / len(last):.3f} (last 5)"
            + (f"; validation {result.final_val_score:.3f}" if result.final_val_score is not None else ""))


def _cmd_show(args: argparse.Namespace) -> int:
    from otel_rl.runs.folder import find_step_trace, format_problems, read_spans, render_waterfall

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        print(f"otel-rl show: {run_dir} does not exist", file=sys.stderr)
        return 2
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


def latest_run_dir(base: Path = Path("otel-rl-runs")) -> Path | None:
    """The most recently written run folder under ``base`` (the default run-folder parent)."""
    runs = [p for p in base.glob("*") if (p / "traces.jsonl").is_file()] if base.is_dir() else []
    return max(runs, key=lambda p: (p / "traces.jsonl").stat().st_mtime) if runs else None


def _cmd_trace(args: argparse.Namespace) -> int:
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


def _cmd_stack(args: argparse.Namespace) -> int:
    from otel_rl.stack.commands import run

    return run(args, args.stack_parser)


def _cmd_bridge(args: argparse.Namespace) -> int:
    from otel_rl.bridge import run_bridge

    return run_bridge(args.config, listen=args.listen, base_dir=args.base_dir, verbose=args.verbose)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-rl", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="OpenTelemetry for RL training of language models: semantic conventions, a demo run, and tools to read runs.",
    )
    from otel_rl._version import __version__

    parser.add_argument("--version", action="version", version=f"otel-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    semconv = sub.add_parser("semconv", help="check, generate and query the semantic-convention registry")
    semconv_sub = semconv.add_subparsers(dest="semconv_command", metavar="SUBCOMMAND")
    registry_help = "the semconv/ folder (holding registry/, mappings/, templates/); default: found from here"
    check = semconv_sub.add_parser("check", help="validate the registry and mappings like OTel's tooling (file:line: [rule] message)")
    check.add_argument("--registry", metavar="DIR", help=registry_help)
    check.set_defaults(func=_cmd_semconv_check)
    gen = semconv_sub.add_parser("generate", help="write otel_rl/semconv/ and docs/semconv/ from the registry")
    gen.add_argument("--registry", metavar="DIR", help=registry_help)
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 if the committed files differ from what would be generated")
    gen.set_defaults(func=_cmd_semconv_generate)
    res = semconv_sub.add_parser("resolve", help="show the registry metric and attributes each framework key maps to (exit 1 if any falls back)")
    res.add_argument("--framework", choices=["roll", "verl", "trl", "swift"], help="try this framework's mapping first")
    res.add_argument("--registry", metavar="DIR", help="read mappings from this semconv/ folder instead of the generated tables")
    res.add_argument("keys", nargs="+", metavar="KEY", help="a flat key as the framework logs it, e.g. actor/pg_loss")
    res.set_defaults(func=_cmd_semconv_resolve)
    semconv.set_defaults(func=lambda a: (semconv.print_help(), 2)[1])

    demo = sub.add_parser("demo", help="run a small real GRPO/PPO training on CPU with telemetry (needs torch)")
    demo.add_argument("--steps", type=int, default=20, help="training steps (default 20; reward rises over a few dozen)")
    demo.add_argument("--algo", choices=["grpo", "ppo"], default="grpo", help="GRPO (group-normalized advantages) or PPO (GAE with a critic)")
    demo.add_argument("--out", metavar="DIR", help="run folder (default otel-rl-runs/<run id>; ignored for files when OTEL_EXPORTER_OTLP_ENDPOINT exports elsewhere)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--inject-spike-at", type=int, metavar="STEP", help="destabilize training at this step (a real learning-rate blow-up) to exercise alerts")
    demo.add_argument("--ranks", type=int, default=1, metavar="N",
                      help="train on N processes (torch.distributed, gloo on CPU): one trace per step across ranks, "
                           "per-rank load and the straggler (default 1)")
    demo.add_argument("--slow-rank", type=int, metavar="R", help="make rank R slower on purpose (extra rollout time each step), "
                      "to see it named as the straggler")
    demo.add_argument("--async", dest="async_rollout", action="store_true",
                      help="async RL: train on the batch generated during the previous step while the next rollout runs "
                           "(queue depth, policy lag, stale samples)")
    demo.add_argument("--max-staleness", type=int, metavar="K",
                      help="with --async: samples more than K policy versions old count as stale (default 0)")
    demo.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    demo.set_defaults(func=_cmd_demo)

    show = sub.add_parser("show", help="print one step's trace from a run folder as a waterfall")
    show.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by otel-rl (traces.jsonl inside)")
    show.add_argument("--step", type=int, required=True, help="the training step to show")
    show.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    show.set_defaults(func=_cmd_show)

    trace = sub.add_parser(
        "trace", help="find one step's trace (run folder or trace store), print its URL and tree, export it for Jaeger",
        description="Find step N's trace in a run folder (default: the latest under otel-rl-runs/) or in a Phoenix trace "
                    "store (--phoenix URL), print where to open it (Jaeger's /trace/<id>, Phoenix), its span tree, and "
                    "with --out write it as the JSON Jaeger's UI loads from its upload button.")
    trace.add_argument("--step", type=int, required=True, help="the training step")
    trace.add_argument("--run-dir", metavar="DIR", help="read from this run folder")
    trace.add_argument("--phoenix", metavar="URL", help="read from the Phoenix trace store at URL (e.g. http://127.0.0.1:6006)")
    trace.add_argument("--project", default="default",
                       help="Phoenix project (default: default; a run picks its project with OTEL_RESOURCE_ATTRIBUTES=openinference.project.name=NAME)")
    trace.add_argument("--jaeger-url", default="http://localhost:16686", help="Jaeger UI base URL for the printed link (default: the Docker stack's)")
    trace.add_argument("--out", metavar="FILE", help="write the trace as Jaeger JSON to FILE")
    trace.add_argument("--width", type=int, default=50, help="bar width in columns (default 50)")
    trace.set_defaults(func=_cmd_trace)

    from otel_rl.runs.push import add_cli as add_push_cli

    add_push_cli(sub)

    from otel_rl.stack.commands import add_arguments as add_stack_arguments

    stack = sub.add_parser("stack", help="a local observability stack without Docker: install | up | down | status")
    add_stack_arguments(stack)
    stack.set_defaults(func=_cmd_stack, stack_parser=stack)

    from otel_rl.bridge import CLI_DESCRIPTION as BRIDGE_DESCRIPTION, CLI_EPILOG as BRIDGE_EPILOG

    bridge = sub.add_parser("bridge", help="the tracker bridge: OTLP/HTTP from a collector -> TensorBoard, W&B, SwanLab, ...",
                            description=BRIDGE_DESCRIPTION, epilog=BRIDGE_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    bridge.add_argument("--config", required=True, metavar="FILE", help="the bridge's YAML file (see above)")
    bridge.add_argument("--listen", metavar="HOST:PORT", help="listen here instead of the file's listen")
    bridge.add_argument("--base-dir", metavar="DIR", help="per-run folders here instead of the file's base_dir")
    bridge.add_argument("-v", "--verbose", action="store_true", help="also log each rejected request and tracker notes")
    bridge.set_defaults(func=_cmd_bridge)
    from otel_rl.ops.alerts import add_cli as add_alerts_cli
    from otel_rl.ops.dashboards import add_cli as add_dashboards_cli
    from otel_rl.analyze import add_cli as add_analyze_cli
    from otel_rl.replay import add_cli as add_replay_cli

    add_replay_cli(sub)
    add_analyze_cli(sub)
    add_dashboards_cli(sub)
    add_alerts_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

