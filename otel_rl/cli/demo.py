"""``otel-rl demo``: a small real GRPO/PPO training on CPU with telemetry (needs torch); ``--agent``
trains a tool-calling policy whose multi-turn rollouts are recorded as agent trajectories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20; reward rises over a few dozen)")
    parser.add_argument(
        "--algo", choices=["grpo", "ppo"], default="grpo", help="GRPO (group-normalized advantages) or PPO (GAE with a critic)"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="run folder (default otel-rl-runs/<run id>; ignored for files when OTEL_EXPORTER_OTLP_ENDPOINT exports elsewhere)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--inject-spike-at",
        type=int,
        metavar="STEP",
        help="destabilize training at this step (a real learning-rate blow-up) to exercise alerts",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        metavar="N",
        help="train on N processes (torch.distributed, gloo on CPU): one trace per step across ranks, "
        "per-rank load and the straggler (default 1)",
    )
    parser.add_argument(
        "--slow-rank",
        type=int,
        metavar="R",
        help="make rank R slower on purpose (extra rollout time each step), to see it named as the straggler",
    )
    parser.add_argument(
        "--async",
        dest="async_rollout",
        action="store_true",
        help="async RL: train on the batch generated during the previous step while the next rollout runs "
        "(queue depth, policy lag, stale samples)",
    )
    parser.add_argument(
        "--max-staleness", type=int, metavar="K", help="with --async: samples more than K policy versions old count as stale (default 0)"
    )
    parser.add_argument(
        "--log-samples",
        type=int,
        default=0,
        metavar="K",
        help="keep K rollout samples (prompt, response, reward parts) per step as rl.sample events; "
        "see them with otel-rl show RUN --step N --samples (default 0: off)",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    agent = parser.add_argument_group(
        "agent mode",
        "--agent trains a tool-calling policy with GRPO instead: arithmetic questions answered in up to 3 turns, "
        "a calculator tool that really computes (some calls time out, x / 0 raises), every rollout an asyncio "
        "coroutine recorded as an agent trajectory (tel.trajectory). Which trajectories become traces follows "
        "OTEL_RL_TRAJECTORY_SAMPLE_RATIO (default 0.01) and OTEL_RL_TRAJECTORY_KEEP_SLOWEST (default 3 per step); "
        "see them with otel-rl trace RUN --step N --slowest 5",
    )
    agent.add_argument("--agent", action="store_true", help="run the agent mode (multi-turn rollouts with a tool) instead")
    agent.add_argument(
        "--questions",
        type=int,
        default=16,
        metavar="N",
        help="with --agent: questions per step, each answered by a group of 8 rollouts (default 16: 128 trajectories a step)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from otel_rl.demo import run_demo
    except ImportError as exc:
        if "torch" in str(exc):
            print("otel-rl demo needs PyTorch: pip install 'otel-rl[torch]' (CPU build: pip install torch==2.13.0)", file=sys.stderr)
            return 2
        raise
    import otel_rl

    if args.agent:
        return _run_agent(args)
    if args.ranks < 1:
        print(f"otel-rl demo: --ranks must be >= 1, not {args.ranks}", file=sys.stderr)
        return 2
    if args.slow_rank is not None and not 0 <= args.slow_rank < args.ranks:
        print(f"otel-rl demo: --slow-rank {args.slow_rank} is not one of the {args.ranks} rank(s) 0..{args.ranks - 1}", file=sys.stderr)
        return 2
    # The telemetry's one-line summary per step is the demo's progress display.
    from otel_rl.demo import demo_service

    options = {**demo_service(f"otel-rl-demo-{args.algo}"), "framework": "roll", "console": not args.quiet}
    if args.out:
        options["run_dir"] = args.out
    if args.log_samples < 0:
        print(f"otel-rl demo: --log-samples must be >= 0, not {args.log_samples}", file=sys.stderr)
        return 2
    if args.log_samples:
        options["log_samples"] = args.log_samples
    demo_args = dict(
        steps=args.steps,
        algo=args.algo,
        out=args.out,
        seed=args.seed,
        inject_spike_at=args.inject_spike_at,
        progress=False,
        async_rollout=args.async_rollout,
        slow_rank=args.slow_rank,
    )
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
        if args.log_samples:
            print(f"  its rollout samples:  otel-rl show {tel.run_dir} --step {result.steps} --samples")
    else:
        print(f"  telemetry: {', '.join(tel._providers.destinations)}")
    return 0


_NOT_WITH_AGENT = (
    ("--algo ppo", lambda a: a.algo != "grpo"),
    ("--ranks", lambda a: a.ranks != 1),
    ("--slow-rank", lambda a: a.slow_rank is not None),
    ("--async", lambda a: a.async_rollout),
    ("--max-staleness", lambda a: a.max_staleness is not None),
    ("--inject-spike-at", lambda a: a.inject_spike_at is not None),
)


def _run_agent(args: argparse.Namespace) -> int:
    """``otel-rl demo --agent``: the tool-calling policy, its trajectories, and how to look at them."""
    from otel_rl.demo import AgentConfig, run_agent_demo

    given = [flag for flag, present in _NOT_WITH_AGENT if present(args)]
    if given:
        print(f"otel-rl demo: {', '.join(given)}: not with --agent (it trains with GRPO on one process)", file=sys.stderr)
        return 2
    if args.questions < 1 or args.log_samples < 0:
        print("otel-rl demo: --questions must be >= 1 and --log-samples >= 0", file=sys.stderr)
        return 2
    import otel_rl
    from otel_rl.demo import demo_service

    options: dict[str, Any] = {**demo_service("otel-rl-demo-agent"), "framework": "roll", "console": not args.quiet}
    if args.out:
        options["run_dir"] = args.out
    if args.log_samples:
        options["log_samples"] = args.log_samples  # the turns' prompts and responses, the tool's arguments and results
    tel = otel_rl.init(**options)
    try:
        result = run_agent_demo(
            steps=args.steps, seed=args.seed, telemetry=tel, progress=False, config=AgentConfig(questions_per_step=args.questions)
        )
    finally:
        tel.shutdown()
    print(_agent_summary(result, tel.config))
    last = result.last_step
    if tel.run_dir is not None:
        print(f"  telemetry: {tel.run_dir}  (traces.jsonl: a trace per step and per kept trajectory; metrics.jsonl, logs.jsonl)")
        print(f"  the slowest trajectories of the last step:  otel-rl trace {tel.run_dir} --step {last} --slowest 5")
        chrome = Path(tel.run_dir) / f"step{last}-trajectories.json"
        print(f"  the step and its trajectories on a timeline:  otel-rl trace {tel.run_dir} --step {last} --format chrome --out {chrome}")
    else:
        print(f"  telemetry: {', '.join(tel._providers.destinations)}")
    return 0


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items())


def _agent_summary(result: Any, config: Any) -> str:
    k = max(1, min(5, result.steps // 2))  # the first and the last k steps, apart
    first, last = slice(0, k), slice(-k, None)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    def trend(values: list[float], form: str) -> str:
        if result.steps < 2:
            return format(mean(values), form)
        return f"{mean(values[first]):{form}} (first {k} step{'s' * (k > 1)}) -> {mean(values[last]):{form}} (last {k})"

    per_step = result.trajectories // max(1, result.steps)
    failed = sum(result.tool_errors.values())
    kept = sum(result.kept.values())
    lines = [
        f"otel-rl demo --agent: {result.steps} GRPO step{'s' * (result.steps > 1)} of {per_step} trajectories; mean reward "
        f"{trend(result.rewards, '.3f')}; exact answers {trend(result.accuracy, '.0%')}",
        f"  tool calls: {result.tool_calls}, {failed} failed" + (f" ({_counts(result.tool_errors)})" if failed else ""),
        f"  trajectories kept as traces: {kept} of {result.trajectories} ({_counts(result.kept)})"
        + (f"; only counted: {_counts(result.not_kept)}" if result.not_kept else ""),
        f"    each step keeps its failed ones, its {config.trajectory_keep_slowest} slowest, its highest and lowest reward, and "
        f"{config.trajectory_sample_ratio:g} of the rest (OTEL_RL_TRAJECTORY_KEEP_SLOWEST, OTEL_RL_TRAJECTORY_SAMPLE_RATIO)",
    ]
    return "\n".join(lines)


def _demo_summary(result: Any) -> str:
    first, last = result.rewards[:5], result.rewards[-5:]
    return (
        f"otel-rl demo: {result.steps} {result.algo} steps; mean score {sum(first) / len(first):.3f} (first 5 steps) -> "
        f"{sum(last) / len(last):.3f} (last 5)"
        + (f"; validation {result.final_val_score:.3f}" if result.final_val_score is not None else "")
    )


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl demo`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser(
        "demo", help="run a small real GRPO/PPO training on CPU with telemetry (needs torch); --agent: multi-turn rollouts with a tool"
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser
