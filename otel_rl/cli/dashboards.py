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
    from otel_rl.ops.dashboards import STALE_BOARD, GrafanaSDKMissing, generate, stale_boards

    root = find_repo_root(args.repo, "--repo")
    try:
        files = generate(root)
    except GrafanaSDKMissing as exc:
        print(f"otel-rl dashboards generate: {exc}", file=sys.stderr)
        return 2
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
        "run_dir",
        nargs="?",
        metavar="RUN_DIR",
        help="a run folder written by otel-rl: its run.json names the run, and the PNGs go into RUN_DIR/dashboards/",
    )
    parser.add_argument(
        "--vm",
        required=True,
        metavar="URL",
        help="query API base URL of VictoriaMetrics (e.g. http://127.0.0.1:8428); the run is found with MetricsQL",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where the PNGs go (default: RUN_DIR/dashboards/, else otel-rl-runs/<--run>/dashboards/ when that folder exists, else a new temporary folder)",
    )
    parser.add_argument("--service", help="service.name of the run (default: the run that reported last)")
    parser.add_argument("--run", help="rl.run.id of the run (default: the run that reported last)")
    parser.add_argument("--board", action="append", metavar="SLUG", help="only this board (repeatable), e.g. e2e-timeline")
    parser.add_argument("--repo", metavar="DIR", help="the otel-rl checkout (default: found from the working directory)")


def run_render(args: argparse.Namespace) -> int:
    """``otel-rl dashboards render``: one PNG per board for one run, from VictoriaMetrics."""
    from otel_rl.ops.grafana_render import PNG_LIMIT_BYTES, QueryAPI, QueryError, find_run, render

    service, run_id = args.service, args.run
    if args.run_dir:
        try:
            service, run_id = _run_identity(Path(args.run_dir), service, run_id)
        except (OSError, ValueError) as exc:
            print(f"otel-rl dashboards render: {exc}", file=sys.stderr)
            return 2
    try:
        api = QueryAPI(args.vm)
        window = find_run(api, service=service, run=run_id)
        out_dir = render_out_dir(args.out, args.run_dir, run_id)
        results = render(api, window, out_dir, repo_root=Path(args.repo) if args.repo else None, slugs=args.board)
    except QueryError as exc:
        print(f"otel-rl dashboards render: {exc}", file=sys.stderr)
        return 1
    for result in results:
        empty = f"; no data: {', '.join(result.empty_panels)}" if result.empty_panels else ""
        print(f"wrote {result.path} ({result.size // 1024} KiB, {len(result.panels)} panels{empty})")
    too_big = [r for r in results if r.size > PNG_LIMIT_BYTES]
    if too_big:
        print(f"otel-rl dashboards render: over {PNG_LIMIT_BYTES // 1000} KB: {', '.join(str(r.path) for r in too_big)}", file=sys.stderr)
    print(f"the boards of run {window.run} are in {out_dir}")
    return 0


def _run_identity(run_dir: Path, service: str | None, run_id: str | None) -> tuple[str | None, str | None]:
    """``(service, run id)`` from the folder's run.json; what the command line gave wins."""
    import json

    from otel_rl._sdk.lifecycle.run_lock import RUN_INFO_FILE

    info_file = run_dir / RUN_INFO_FILE
    if not info_file.is_file():
        raise ValueError(f"{run_dir} is not a run folder written by otel-rl (no run.json)")
    info = json.loads(info_file.read_text(encoding="utf-8"))
    if not isinstance(info, dict):
        raise ValueError(f"{info_file}: not a JSON object")
    return service or info.get("service_name") or None, run_id or info.get("run_id") or None


def render_out_dir(out: str | None, run_dir: str | None, run_id: str | None) -> Path:
    """Where ``render`` writes: ``--out``; else under the run folder; else a new temporary folder
    (never a folder of the checkout, whose committed pictures it would overwrite)."""
    if out:
        return Path(out)
    if run_dir:
        return Path(run_dir) / "dashboards"
    if run_id:
        from otel_rl._sdk.settings.config import DEFAULT_RUNS_DIR

        folder = Path(DEFAULT_RUNS_DIR) / run_id
        if folder.is_dir() and Path(run_id).name == run_id:  # an id, not a path
            return folder / "dashboards"
    import tempfile

    return Path(tempfile.mkdtemp(prefix="otel-rl-dashboards-"))


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
