"""The ``otel-rl`` command: the top-level parser and ``main()``.

Each subcommand lives in its own module here (``otel_rl/cli/<command>.py``) with an ``add_cli(subparsers)``
that registers its parser and the function it runs; ``COMMANDS`` lists them in the order of ``--help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from otel_rl.cli import alerts, analyze, bridge, dashboards, demo, export, push, recover, replay, semconv, show, stack, trace
from otel_rl.cli.semconv import find_semconv_dir
from otel_rl.cli.trace import latest_run_dir

__all__ = ["COMMANDS", "EPILOG", "build_parser", "find_semconv_dir", "latest_run_dir", "main"]

EPILOG = """\
examples:
  otel-rl demo --steps 20                    a real GRPO run on CPU, telemetry into otel-rl-runs/
  otel-rl demo --ranks 2 --slow-rank 1       the same on 2 processes (gloo); rank 1 is the straggler
  otel-rl demo --async                       async RL: rollout overlaps training, policy lag and stale samples
  otel-rl show otel-rl-runs/<run>            the headline values of every step, one row each
  otel-rl show otel-rl-runs/<run> --step 3   that step's trace as a waterfall
  otel-rl export otel-rl-runs/<run> --format csv --out steps.csv   every logged key, one row per step
  otel-rl trace --step 3 --out step3.json    find a step's trace (latest run or --jaeger URL), export it for Jaeger
  otel-rl trace RUN --steps 3-7 --format chrome --out t.json   those steps as a timeline for ui.perfetto.dev
  otel-rl recover otel-rl-runs/<run>         after a crash: the metric points it had not exported, from its events
  otel-rl semconv check                      validate the registry and the framework mappings
  otel-rl semconv generate [--check]         regenerate otel_rl/semconv/ and docs/semconv/
  otel-rl semconv resolve --framework trl kl completions/clipped_ratio
  otel-rl replay logging.jsonl               send a training log (ms-swift, TRL/HF, verl, ROLL) through telemetry
  otel-rl analyze logging.jsonl --out rep/   find spikes, collapses and their chains; write report.md/.html/.json
  otel-rl dashboards generate [--check]      regenerate grafana/dashboards from the registry
  otel-rl alerts generate [--check]          regenerate grafana/alerts and grafana/provisioning/alerting
"""

# The subcommands in the order ``otel-rl --help`` lists them.
COMMANDS = (semconv, demo, show, export, trace, push, recover, stack, bridge, replay, analyze, dashboards, alerts)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``otel-rl`` parser with every subcommand registered, or ``command``'s alone when it names one
    (each subcommand's parser imports what it runs: one command starts without the others' modules)."""
    parser = argparse.ArgumentParser(
        prog="otel-rl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="OpenTelemetry for RL training of language models: semantic conventions, a demo run, and tools to read runs.",
    )
    from otel_rl._version import __version__

    parser.add_argument("--version", action="version", version=f"otel-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = {module.__name__.rsplit(".", 1)[-1]: module for module in COMMANDS}
    for module in [names[command]] if command in names else COMMANDS:
        module.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``otel-rl`` with ``argv`` (default: the process's arguments); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
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
