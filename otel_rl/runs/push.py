"""``otel-rl push RUN_DIR``: deliver what a run left in its disk spool to a collector.

A run whose collector stayed unreachable until it ended, or that crashed (SIGKILL, ``os._exit``,
an OOM kill), leaves its undelivered OTLP requests in ``RUN_DIR/spool/rank<N>/``. ``push`` sends
them, in order, through the same SDK OTLP exporters a run uses, so the endpoint, protocol,
headers and TLS settings come from the same ``OTEL_EXPORTER_OTLP_*`` variables (or
``--endpoint`` / ``--protocol``). What the collector acknowledges is deleted; what it does not
stays for the next push. A spool that a live run still owns is left to that run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl._sdk.spool.store import (
    MARKER_FILE,
    SIGNALS,
    Spool,
    SpoolBusy,
    damage_note,
    format_bytes,
    item_word,
    redact_endpoint,
    transport_for,
)

logger = logging.getLogger("otel_rl")

DESCRIPTION = """\
Deliver the OTLP data a run left in its disk spool (RUN_DIR/spool/rank<N>/) to a collector.

A run keeps in its spool what the collector did not take: during an outage, at exit when the
collector was unreachable, or when the process crashed. The next start with the same run folder
sends it by itself; this command sends it now. The collector is the one in --endpoint, else
OTEL_EXPORTER_OTLP_ENDPOINT; headers, TLS and timeouts come from the OTEL_EXPORTER_OTLP_*
variables as for a run. Exit status 0 when everything was delivered, 1 when something is left.
"""


@dataclass
class PushReport:
    folder: Path
    delivered: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    left: dict[str, int] = field(default_factory=dict)
    skipped: str = ""  # why the folder was not pushed (in use by a live process)
    damaged: dict[str, int] = field(default_factory=dict)  # torn records discarded at opening, per signal

    @property
    def complete(self) -> bool:
        return not self.skipped and not any(self.left.values())


def find_spools(path: str | Path) -> list[Path]:
    """Spool folders in ``path``: itself, ``path/spool/*``, or any folder below holding a spool marker."""
    root = Path(path)
    if (root / MARKER_FILE).is_file():
        return [root]
    found = sorted(p.parent for p in root.glob(f"spool/*/{MARKER_FILE}"))
    if not found:
        found = sorted(p.parent for p in root.rglob(MARKER_FILE))
    return found


def push(
    path: str | Path,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    timeout_s: float = 60.0,
    give_up_after_s: float = 15.0,
    say: Callable[[str], None] = print,
) -> list[PushReport]:
    """Deliver every spool under ``path``; one report per spool folder (none: nothing was left).

    Raises FileNotFoundError when ``path`` is not a folder and ValueError when no collector is
    configured (neither ``endpoint`` nor OTEL_EXPORTER_OTLP_ENDPOINT)."""
    from otel_rl._sdk.export.providers import otlp_exporters
    from otel_rl._sdk.settings.config import resolve_config

    if not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is not a folder (expected a run folder, a spool root or a spool folder)")
    folders = find_spools(path)
    if not folders:  # a run whose collector took everything leaves no spool behind
        say(f"{path}: no undelivered telemetry (no spool folder); nothing to push")
        return []
    options: dict[str, Any] = {"exporters": "otlp", "run_dir": str(path)}
    if endpoint:
        options["endpoint"] = endpoint
    if protocol:
        options["protocol"] = protocol
    config = resolve_config(options)
    if not config.endpoint:
        raise ValueError("no collector to push to: pass --endpoint URL or set OTEL_EXPORTER_OTLP_ENDPOINT")
    reports = []
    for folder in folders:
        report = PushReport(folder)
        reports.append(report)
        try:
            spool = Spool(folder, announce=False)
        except SpoolBusy:
            report.skipped = "in use by a running process, which delivers it itself"
            say(f"{folder}: skipped ({report.skipped})")
            continue
        if any(st.damaged for st in spool.stats().values()):
            report.damaged = {s: st.damaged for s, st in spool.stats().items()}
            say(f"{folder}: {damage_note(folder, spool.stats())}")
        before = spool.pending_items()
        if not any(before.values()):
            spool.close()
            say(f"{folder}: nothing left to deliver")
            continue
        target = redact_endpoint(config.endpoint)
        say(
            f"{folder}: delivering {format_bytes(spool.pending_bytes)} ("
            + ", ".join(f"{n} {_word(s)}" for s, n in before.items() if n)
            + f") to {target} over {config.protocol}"
        )
        exporters = otlp_exporters(config)
        for exporter, signal in zip(exporters, SIGNALS):
            if before[signal]:
                spool.attach(signal, transport_for(exporter, signal))
            else:
                exporter.shutdown()
        spool.drain(timeout_s, give_up_after_s=give_up_after_s)
        spool.close()
        stats, left = spool.stats(), spool.pending_items()
        report.delivered = {s: st.delivered for s, st in stats.items()}
        report.dropped = {s: st.dropped_total for s, st in stats.items()}
        report.left = left
        line = ", ".join(f"{report.delivered[s]} {_word(s)}" for s in SIGNALS if report.delivered[s]) or "nothing"
        say(
            f"{folder}: delivered {line}"
            + (f"; dropped {sum(report.dropped.values())} the collector refused" if any(report.dropped.values()) else "")
            + (
                f"; {sum(left.values())} items left (the collector at {target} did not take them: run push again)"
                if any(left.values())
                else "; spool empty"
            )
        )
    return reports


def _word(signal: str) -> str:
    return item_word(signal)


def _cmd_push(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        reports = push(
            args.run_dir, endpoint=args.endpoint, protocol=args.protocol, timeout_s=args.timeout, give_up_after_s=args.give_up_after
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"otel-rl push: {exc}", file=sys.stderr)
        return 1
    return 0 if all(r.complete for r in reports) else 1


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``otel-rl push`` to the ``otel-rl`` command's subparsers."""
    parser = subparsers.add_parser(
        "push",
        help="deliver what a run left in its disk spool to a collector",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (its spool/ inside), a spool root or one spool folder")
    parser.add_argument("--endpoint", metavar="URL", help="the collector (default: OTEL_EXPORTER_OTLP_ENDPOINT)")
    parser.add_argument(
        "--protocol", choices=["grpc", "http/protobuf"], help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="stop after S seconds even if data is left (default 60)")
    parser.add_argument(
        "--give-up-after",
        type=float,
        default=15.0,
        metavar="S",
        help="stop once the collector has been unreachable for S seconds (default 15)",
    )
    parser.set_defaults(func=_cmd_push)
    return parser
