"""Replay RL training logs (ms-swift, TRL / Hugging Face, verl, ROLL, otel-rl run folders) as telemetry.

```python
from otel_rl.replay import parse_file, replay_file

log = parse_file("logging.jsonl")            # format detected from the content
print(log.format, len(log.records), log.problems[:3])
replay_file("logging.jsonl")                 # into otel-rl-runs/replay-<hash>/, or OTLP when an endpoint is set
```

``otel-rl replay FILE...`` is the command (``--help`` explains every option).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_rl.replay._formats import FORMATS, FRAMEWORK_OF, detect_format, parse_file
from otel_rl.replay._log import FormatError, ParseCheck, ParsedLog, Segment, StepRecord
from otel_rl.replay._run import (
    DEFAULT_START,
    DEFAULT_STEP_SECONDS,
    MARKER_FILE,
    ReplayResult,
    parse_summary,
    replay_file,
    replay_files,
    run_id_for,
)
from otel_rl.replay._settings import CANONICAL as SETTINGS
from otel_rl.replay.target import ReplayNotStored, ReplayTarget

__all__ = [
    "FORMATS",
    "FRAMEWORK_OF",
    "FormatError",
    "MARKER_FILE",
    "ParseCheck",
    "ParsedLog",
    "ReplayNotStored",
    "ReplayResult",
    "ReplayTarget",
    "SETTINGS",
    "Segment",
    "StepRecord",
    "add_cli",
    "detect_format",
    "parse_file",
    "parse_summary",
    "replay_file",
    "replay_files",
    "run_id_for",
]

CLI_DESCRIPTION = """\
Send every step of a training log through otel-rl telemetry, as if the run were happening now,
but with each step's original time: the rl.log event of each step carries the exact key -> value
map and the step's time, and every metric point is stamped with the step's time; keys map to registry metrics through the framework's mapping (swift,
trl, verl, roll, areal, nemo_rl, openrlhf). With OTEL_EXPORTER_OTLP_ENDPOINT or --endpoint the data goes to a collector,
otherwise into a run folder (otel-rl-runs/<run id>/, OTLP-JSON lines).

Formats (detected from the content unless --format says):
  swift         ms-swift logging.jsonl (global_step/max_steps, elapsed_time, train_speed, memory(GiB))
  trl-state     TRL / Hugging Face trainer_state.json (log_history)
  hf-console    Hugging Face Trainer console output ({'loss': ...} lines among tqdm bars)
  verl-jsonl    verl's file logger ({"step": N, "data": {...}}), also otel-rl's jsonl tracker
  easyr1-jsonl  EasyR1's experiment_log.jsonl ({"step": N, "reward": {...}, "actor": {...}, ...})
  verl-console  verl's console logger (step:N - key:value - ...; Ray prefixes and colours are fine)
  roll-stdout   ROLL's stdout tracker (metrics_tag: {"step": N, "metrics": {...}})
  hf-notebook   a Jupyter notebook's Trainer progress table (Step | Training Loss | reward | ...)
  nemo-rl-console  NeMo-RL's per-step GRPO summary (===== Step N/M =====, • Avg Reward: ...)
  openrlhf-console  OpenRLHF's PPO trainer log (✨ Global step N: {'policy_loss': ...}; eval_metrics lines)
  areal-console  AReaL's StatsLogger (Train step N/M done. then a table of ppo_actor/..., timeperf/... values)
  metric-table  a CSV of metrics by step (a W&B "Export CSV", a tracker's history, AReaL's keys)
  key-value     a hand-written loop's progress lines (Step: N | Loss: x | KL: y, Epoch:[1/1](N/M), Reward: x, ...)
  metrics-jsonl a hand-written loop's JSON lines of metrics ({"type": "rollout", "grpo_step": N, "reward": x, ...}; eval lines: validation)
  otel-rl       an otel-rl run folder (its rl.log events)

Time: timestamps in the log are used as they are; elapsed times (ms-swift elapsed_time, tqdm's
elapsed, verl's summed timing_s/step) count from --start-time; a log without any time gets the
clock --start-time + step x --step-seconds. Without --start-time the clock is placed so that the
replayed run ends now (a metrics store keeps only its retention). The clock used is printed.

Into the local stack's endpoint (otel-rl stack up), the points' times are checked against the
retention its VictoriaMetrics keeps before anything is sent (outside it: refused, naming
--start-time), and afterwards the samples stored are read back and printed; fewer stored than
sent is an error (exit 1). For any other endpoint the retention is unknown: a warning says so.

Before sending, the replay checks what it read and prints it: the step range, records per step,
whether steps go in order, the step count against the log's own header, the share of record-like
lines read, and where the steps came from. Anything doubtful is a WARNING line first. Settings the
log prints (a verl config dump, the Trainer header) are read as settings, never as records. A file
that holds several runs (an SFT run, then an RL run) is split: the last RL run is replayed, the
others are listed (--segment N picks one). A resumed run's repeated steps keep their later records.

Each file is one run. Its run id, replay-<16 hex>, comes from the file's content and the resource
(service name, framework, experiment), so replaying the same file again gives the same run id and
series; a replay.json marker in the run folder records the destinations a replay reached (the
folder's files, an OTLP endpoint): a second replay of the same content to the same destinations is
a no-op, one to a new destination is sent (--force replays it again; the folder's signal files are
replaced, each named, only when the replay writes files). Malformed lines are skipped and listed
with their line numbers; one bad line never stops a file.
"""

CLI_EPILOG = """\
examples:
  otel-rl replay output/v1-20251126/logging.jsonl
  otel-rl replay checkpoint-500/trainer_state.json --step-seconds 30
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc otel-rl replay train.log
  otel-rl replay verl_console.log --format verl-console --service-name grpo-7b --experiment try3
"""


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``replay`` to the ``otel-rl`` command's subparsers."""
    parser = subparsers.add_parser(
        "replay",
        help="send a training log (ms-swift, TRL/HF, verl, ROLL) through otel-rl telemetry, step by step",
        description=CLI_DESCRIPTION,
        epilog=CLI_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="log files (or otel-rl run folders); each is its own run")
    parser.add_argument("--format", default="auto", choices=["auto", *FORMATS], help="the log's format (default: auto, from the content)")
    parser.add_argument("--endpoint", metavar="URL", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT; none: a run folder)")
    parser.add_argument(
        "--protocol", choices=["grpc", "http/protobuf"], help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)"
    )
    parser.add_argument(
        "--exporters", metavar="LIST", help="file, otlp or both, as OTEL_RL_EXPORTERS (default auto: otlp with an endpoint, else file)"
    )
    parser.add_argument(
        "--service-name", metavar="NAME", help="service.name of the replayed run (default: OTEL_SERVICE_NAME, else otel-rl-replay-<format>)"
    )
    parser.add_argument("--experiment", metavar="NAME", help="rl.experiment.name of the replayed run")
    parser.add_argument("--run-id", metavar="ID", help="use this run id instead of the content-derived one (one FILE only)")
    parser.add_argument("--run-dir", metavar="DIR", help="run folder (one FILE only; default otel-rl-runs/<run id>)")
    parser.add_argument(
        "--start-time",
        default=DEFAULT_START,
        metavar="TIME",
        help="origin of elapsed and synthetic clocks, e.g. 2025-11-26T02:24:44+08:00, for repeatable times "
        "(default: the replayed run ends now)",
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=DEFAULT_STEP_SECONDS,
        metavar="S",
        help=f"seconds per step of the synthetic clock, for logs without times (default {DEFAULT_STEP_SECONDS:g})",
    )
    parser.add_argument(
        "--segment",
        type=int,
        metavar="N",
        help="a file that holds several runs (an SFT run, then an RL run): read run N (default: the last RL run)",
    )
    parser.add_argument("--force", action="store_true", help="replay a file again even though its run folder says it was replayed")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar (it is shown only on a terminal anyway)")
    parser.set_defaults(func=run_cli)
    return parser


def run_cli(args: argparse.Namespace) -> int:
    """``otel-rl replay``: replay each FILE; exit 1 when any file could not be read."""
    if len(args.files) > 1 and (args.run_id or args.run_dir):
        print(
            "otel-rl replay: --run-id and --run-dir name one run: give one FILE, or leave them out so each file gets its own run",
            file=sys.stderr,
        )
        return 2
    failed = 0
    for path in args.files:
        try:
            replay_file(
                path,
                format=args.format,
                service_name=args.service_name,
                experiment=args.experiment,
                run_id=args.run_id,
                run_dir=args.run_dir,
                endpoint=args.endpoint,
                protocol=args.protocol,
                exporters=args.exporters,
                start_time=args.start_time,
                step_seconds=args.step_seconds,
                force=args.force,
                progress=False if args.quiet else None,
                segment=args.segment,
                target_for=getattr(args, "target_for", None),
            )
        except (FileNotFoundError, IsADirectoryError, PermissionError, FormatError, ValueError) as exc:
            failed += 1
            print(f"otel-rl replay: {path}: {exc}", file=sys.stderr)
    return 1 if failed else 0
