"""``otel-rl dashboards``: generate the Grafana dashboards from the registry (``generate [--check]``)
and draw their panels into PNGs from a query API (``render``).

The boards are built in ``otel_rl.ops.dashboards``, the pictures drawn in ``otel_rl.ops.grafana_render``;
this module holds only the arguments and the commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def run_generate(args: argparse.Namespace) -> int:
    """``otel-rl dashboards generate [--check]``: write (or compare) grafana/dashboards/*.json."""
    from otel_rl.codegen.generate import check_or_write, find_repo_root
    from otel_rl.ops.dashboards import STALE_BOARD, generate, stale_boards

    root = find_repo_root(args.repo, "--repo")
    files = generate(root)
    return check_or_write(
        "otel-rl dashboards generate",
        root,
        files,
        stale_boards(root, files),
        check=args.check,
        source="semconv/registry",
        stale_reason=STALE_BOARD,
    )


def add_render_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vm",
        required=True,
        metavar="URL",
        help="query API base URL of VictoriaMetrics (e.g. http://127.0.0.1:8428); the run is found with MetricsQL",
    )
    parser.add_argument("--out", default="docs/dashboards", metavar="DIR", help="where the PNGs go (default docs/dashboards)")
    parser.add_argument("--service", help="service.name of the run (default: the run that reported last)")
    parser.add_argument("--run", help="rl.run.id of the run (default: the run that reported last)")
    parser.add_argument("--board", action="append", metavar="SLUG", help="only this board (repeatable), e.g. e2e-timeline")
    parser.add_argument("--repo", metavar="DIR", help="the otel-rl checkout (default: found from the working directory)")


def run_render(args: argparse.Namespace) -> int:
    """``otel-rl dashboards render``: one PNG per board for one run, from VictoriaMetrics."""
    from otel_rl.ops.grafana_render import PNG_LIMIT_BYTES, QueryAPI, QueryError, find_run, render

    try:
        api = QueryAPI(args.vm)
        window = find_run(api, service=args.service, run=args.run)
        results = render(api, window, Path(args.out), repo_root=Path(args.repo) if args.repo else None, slugs=args.board)
    except QueryError as exc:
        print(f"otel-rl dashboards render: {exc}", file=sys.stderr)
        return 1
    for result in results:
        empty = f"; no data: {', '.join(result.empty_panels)}" if result.empty_panels else ""
        print(f"wrote {result.path} ({result.size // 1024} KiB, {len(result.panels)} panels{empty})")
    too_big = [r for r in results if r.size > PNG_LIMIT_BYTES]
    if too_big:
        print(f"otel-rl dashboards render: over {PNG_LIMIT_BYTES // 1000} KB: {', '.join(str(r.path) for r in too_big)}", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``generate`` and ``render`` subcommands."""
    sub = parser.add_subparsers(dest="dashboards_command", metavar="SUBCOMMAND")
    gen = sub.add_parser("generate", help="write grafana/dashboards/*.json from semconv/registry")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 if the committed boards differ from the registry's")
    gen.add_argument("--repo", metavar="DIR", help="the otel-rl checkout (default: found from the working directory)")
    gen.set_defaults(func=run_generate)
    render = sub.add_parser("render", help="draw each board's panels from a VictoriaMetrics / Prometheus query API into PNGs")
    add_render_arguments(render)
    render.set_defaults(func=run_render)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl dashboards generate [--check]`` and ``otel-rl dashboards render``."""
    parser = subparsers.add_parser("dashboards", help="generate the Grafana dashboards from the registry; render them to PNG")
    add_arguments(parser)
    parser.set_defaults(func=lambda a: (parser.print_help(), 2)[1])  # no subcommand: show them
    return parser
