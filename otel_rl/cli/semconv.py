"""``otel-rl semconv``: check, generate and query the semantic-convention registry."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REGISTRY_HELP = "the semconv/ folder (holding registry/, mappings/, templates/); default: found from here"


def find_semconv_dir(explicit: str | None) -> Path:
    """The registry folder: --registry, else semconv/ above the working directory or beside the package."""
    from otel_rl.codegen.generate import find_repo_root

    if explicit:
        path = Path(explicit)
        if not (path / "registry").is_dir():
            raise SystemExit(f"otel-rl: {path} has no registry/ folder; pass --registry pointing at the semconv/ folder")
        return path
    return find_repo_root(option="--registry") / "semconv"


def run_check(args: argparse.Namespace) -> int:
    """``otel-rl semconv check``: validate the registry and the framework mappings."""
    from otel_rl._sdk.keys.resolver import load_mapping_files, validate_mappings
    from otel_rl.codegen.manifest import check_manifest
    from otel_rl.codegen.registry import load_registry

    semconv_dir = find_semconv_dir(args.registry)
    registry = load_registry(semconv_dir)
    problems = [str(p) for p in [*registry.problems, *check_manifest(semconv_dir)]]
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
    print(
        f"otel-rl semconv check: ok ({len(registry.metrics)} metrics, {len(registry.attributes)} attributes, "
        f"{len(mappings)} framework mappings in {semconv_dir})"
    )
    return 0


def run_generate(args: argparse.Namespace) -> int:
    """``otel-rl semconv generate [--check]``: write (or compare) otel_rl/semconv/ and docs/semconv/."""
    import otel_rl.codegen.generate as codegen

    semconv_dir = find_semconv_dir(args.registry)
    repo_root = semconv_dir.parent
    registry, files = codegen.generate(repo_root, semconv_dir)
    if registry.problems:
        for p in registry.problems:
            print(p, file=sys.stderr)
        print("otel-rl semconv generate: fix the registry first (otel-rl semconv check)", file=sys.stderr)
        return 1
    return codegen.check_or_write(
        "otel-rl semconv generate",
        repo_root,
        {f.path: f.content for f in files},
        codegen.stale_files(repo_root, files),
        check=args.check,
        source="semconv/",
        stale_reason="stale: not produced by the registry",
    )


def run_resolve(args: argparse.Namespace) -> int:
    """``otel-rl semconv resolve``: the registry metric and attributes each framework key maps to."""
    from otel_rl._sdk.keys.resolver import KeyResolver

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check``, ``generate`` and ``resolve`` subcommands."""
    sub = parser.add_subparsers(dest="semconv_command", metavar="SUBCOMMAND")
    check = sub.add_parser("check", help="validate the registry and mappings like OTel's tooling (file:line: [rule] message)")
    check.add_argument("--registry", metavar="DIR", help=REGISTRY_HELP)
    check.set_defaults(func=run_check)
    gen = sub.add_parser("generate", help="write otel_rl/semconv/ and docs/semconv/ from the registry")
    gen.add_argument("--registry", metavar="DIR", help=REGISTRY_HELP)
    gen.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the committed files differ from what would be generated"
    )
    gen.set_defaults(func=run_generate)
    res = sub.add_parser("resolve", help="show the registry metric and attributes each framework key maps to (exit 1 if any falls back)")
    res.add_argument("--framework", choices=["roll", "verl", "trl", "swift"], help="try this framework's mapping first")
    res.add_argument("--registry", metavar="DIR", help="read mappings from this semconv/ folder instead of the generated tables")
    res.add_argument("keys", nargs="+", metavar="KEY", help="a flat key as the framework logs it, e.g. actor/pg_loss")
    res.set_defaults(func=run_resolve)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``otel-rl semconv`` on the ``otel-rl`` subparsers."""
    parser = subparsers.add_parser("semconv", help="check, generate and query the semantic-convention registry")
    add_arguments(parser)
    parser.set_defaults(func=lambda a: (parser.print_help(), 2)[1])  # no subcommand: show them
    return parser
