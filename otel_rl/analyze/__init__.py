"""Analyze a training log: what each metric means, what went wrong, in which order, and what to change.

```python
from otel_rl.analyze import analyze

runs = analyze(["logging.jsonl"], out="report/")     # report.md, report.html, report.json, plots/*.png
for f in runs[0].findings: print(f.detail)
```

Reads everything ``otel-rl replay`` reads (ms-swift, TRL / HF, verl, ROLL logs) and otel-rl run
folders. ``otel-rl analyze FILE... --out DIR`` is the command (``--help`` explains it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_rl.analyze._incidents import incident_limits
from otel_rl.analyze._report import write_reports
from otel_rl.analyze._run import RunAnalysis, analyze_parsed, key_series
from otel_rl.detect.detectors import DetectorConfig, default_rules_yaml, load_rules
from otel_rl.replay import FORMATS, FormatError, parse_file, parse_summary
from otel_rl.replay.progress import Progress
from otel_rl.runs.out_path import out_dir_problem, write_error

__all__ = ["RunAnalysis", "add_cli", "analyze"]

MAX_SERIES_PICTURES = 10


def analyze(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    *,
    format: str = "auto",
    plots: bool = True,
    rules: str | None = "default",
    cfg: DetectorConfig = DetectorConfig(),
    progress: bool | None = False,
    segment: int | None = None,
) -> list[RunAnalysis]:
    """Analyze each log (one run per file); with ``out``, write the reports (and PNG plots) there."""
    rule_set = load_rules(rules)
    runs: list[RunAnalysis] = []
    bar = Progress(len(paths), "analyze", unit="files", enabled=progress)
    for path in paths:
        parsed = parse_file(path, format, segment=segment)
        runs.append(analyze_parsed(parsed, cfg=cfg, rules=rule_set))
        bar.update(1, parsed.points)
    bar.close()
    if out is not None:
        out_dir = Path(out)
        if plots:
            _write_plots(runs, out_dir)
        write_reports(runs, out_dir)
    return runs


def _write_plots(runs: list[RunAnalysis], out_dir: Path) -> None:
    from otel_rl.analyze._plots import plot_incident, plot_series, slug

    for index, run in enumerate(runs, start=1):
        prefix = f"{index}-" if len(runs) > 1 else ""
        by_label = {s.label: s for s in run.series.values()}
        # A picture for each alarm of the headline; information gets one only where nothing alarms.
        pictured = [k for k, i in enumerate(run.headline) if i.severity != "info"] or list(range(min(2, len(run.headline))))
        for k, incident in enumerate(run.headline):
            if k not in pictured:
                continue
            rel = Path("plots") / f"{prefix}incident-{k + 1}.png"
            try:
                plot_incident(by_label, incident, out_dir / rel, limits=incident_limits(run, incident))
            except ImportError:
                raise
            except Exception as exc:  # noqa: BLE001 - a picture that fails never costs the report
                run.plot_failures.append(f"incident {k + 1}: {type(exc).__name__}: {exc}")
                continue
            run.incident_plots.append((k, rel.as_posix()))
        chosen = key_series(run.series)
        flagged = {(f.metric, tuple(sorted(f.attributes.items()))) for f in run.findings if f.severity in ("critical", "warning")}
        chosen += [s for s in run.series.values() if s.key in flagged and s not in chosen][:4]
        # A picture per key series, in reading order, ten at most: each one costs ~0.2 s to draw, and
        # the incidents' own pictures hold what went wrong.
        chosen = chosen[:MAX_SERIES_PICTURES]
        for series in chosen:
            mine = [f for f in run.findings if f.metric == series.metric and f.attributes == series.attributes]
            rel = Path("plots") / f"{prefix}{slug(series.label)}.png"
            try:
                plot_series(series, mine, out_dir / rel, title=f"{series.label}  ({series.metric})")
            except ImportError:
                raise  # no matplotlib: the message names the extra (or --no-plots)
            except Exception as exc:  # noqa: BLE001 - any plot failure (matplotlib on extreme values): never cost the report
                run.plot_failures.append(f"{series.label}: {type(exc).__name__}: {exc}")
                continue
            run.plots.append(rel.as_posix())


CLI_DESCRIPTION = """\
Analyze RL training logs the way an engineer reads them, outcome first, and write report.md,
report.html and report.json (plus PNG pictures) into --out:

- first, what was read and how sure it is (steps, records per step, the count against the log's own
  header, the share of lines and of numeric fields read); a doubtful read is a WARNING and gets no
  verdict of health;
- the verdict: how the run ended (finished; stopped short of its planned total; crashed, with the
  cause read from the log's own lines: a traceback, GPU out of memory, an NCCL timeout, a full disk),
  whether it learned (the core validation score where the log has one, else the task's success or
  score, first fifth against last with 2 standard errors), and the top incident;
- the headline: at most 7 incidents, most important first: the outcome (crash, reward, validation),
  then the policy's state (length, truncation, entropy), then the optimizer's signals. A KL or
  gradient-norm move is an alarm on its own only at its metric's scale in the registry (KL 1, a
  gradient norm 10x the stated clip); below it, only next to an outcome or policy change, and it is
  still told as information. What has an explanation is explained, not alarmed on: a sparse
  reward's few hits, a zero gradient on steps without reward spread, groups saturated by success, a
  length held at a value that is not the limit. NaN or infinite values of a training signal are an
  incident. Each incident is one record (steps, before and after, peaks, share of steps) that every
  sentence is written from; report.html draws each alarm with the outcome's series first;
- folded below: the other incidents, the metrics (meaning and good direction from the registry),
  every detector finding (at the level the verdict gives it), chains, the online alert rules replayed
  over the log, the settings the log shows (each with where it comes from, including a KL coefficient
  the values prove: loss = c x KL), and advice given only from what the report alarms on.

Inputs: everything otel-rl replay reads (ms-swift logging.jsonl, trainer_state.json, HF console
output, a Kaggle notebook's JSON log, a Jupyter notebook's Trainer table, verl JSONL / console,
EasyR1 experiment_log.jsonl, ROLL stdout) and otel-rl run folders. Each FILE is one run. Its pictures need matplotlib (pip install
'otel-rl[analyze]'); --no-plots skips them. How it scores on real logs it had never seen:
python -m otel_rl.analyze.corpus FOLDER (benchmarks/analyze_corpus.yaml).
"""


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``analyze`` to the ``otel-rl`` command's subparsers."""
    parser = subparsers.add_parser(
        "analyze",
        help="find spikes, collapses, chains and their causes in a training log; write a report",
        description=CLI_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  otel-rl analyze output/v1/logging.jsonl --out report/\n"
        "  otel-rl analyze otel-rl-runs/<run> --out report/ --no-plots\n"
        "  otel-rl analyze --print-rules > rules.yaml      # the default alert rules, to edit",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="log files or otel-rl run folders (each is one run)")
    parser.add_argument("--out", metavar="DIR", help="folder for report.md, report.html, report.json and plots/ (required with FILEs)")
    parser.add_argument("--format", default="auto", choices=["auto", *FORMATS], help="the logs' format (default: auto)")
    parser.add_argument(
        "--rules", default="default", metavar="FILE", help="alert rules to replay: default, off, or a YAML file (see --print-rules)"
    )
    parser.add_argument(
        "--segment",
        type=int,
        metavar="N",
        help="a file that holds several runs (an SFT run, then an RL run): analyze run N (default: the last RL run)",
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG plots (no matplotlib needed)")
    parser.add_argument(
        "--z", type=float, default=DetectorConfig.z, help=f"robust z-score of an anomalous value (default {DetectorConfig.z:g})"
    )
    parser.add_argument(
        "--window", type=int, default=DetectorConfig.window, help=f"values in the rolling baseline (default {DetectorConfig.window})"
    )
    parser.add_argument("--print-rules", action="store_true", help="print the default alert rules as YAML and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_cli)
    return parser


def run_cli(args: argparse.Namespace) -> int:
    """``otel-rl analyze``."""
    if args.print_rules:
        sys.stdout.write(default_rules_yaml())
        return 0
    if not args.files:
        print("otel-rl analyze: give one or more FILEs (logs or otel-rl run folders) and --out DIR", file=sys.stderr)
        return 2
    if not args.out:
        print("otel-rl analyze: --out DIR is required: the folder for report.md, report.html, report.json and plots/", file=sys.stderr)
        return 2
    if args.window < 5 or args.z <= 0:
        print("otel-rl analyze: --window must be >= 5 and --z positive", file=sys.stderr)
        return 2
    if (problem := out_dir_problem(args.out, args.files)) is not None:
        print(f"otel-rl analyze: {problem}", file=sys.stderr)
        return 2
    cfg = DetectorConfig(z=args.z, window=args.window)
    try:
        runs = analyze(
            args.files,
            args.out,
            format=args.format,
            plots=not args.no_plots,
            rules=args.rules,
            cfg=cfg,
            progress=False if args.quiet else None,
            segment=args.segment,
        )
    except (FileNotFoundError, FormatError, ValueError, ImportError) as exc:
        print(f"otel-rl analyze: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a log unreadable, or the reports unwritable (a full disk, a folder that went away)
        read = exc.filename is not None and not str(exc.filename).startswith(str(args.out))
        print(f"otel-rl analyze: {f'cannot read {exc.filename}: {exc.strerror}' if read else write_error(args.out, exc)}", file=sys.stderr)
        return 2
    for run in runs:
        counts = {s: sum(1 for i in run.incidents if i.severity == s) for s in ("critical", "warning")}
        print(
            f"otel-rl analyze: {run.parsed.path}: {len(run.parsed.records)} steps, {len(run.series)} series, "
            f"{len(run.incidents)} incident(s) ({counts['critical']} critical, {counts['warning']} warning), "
            f"{len(run.alerts)} alert(s) replayed"
        )
        for line in parse_summary(run.parsed):
            print(f"  {line}")
        ending = run.parsed.ending
        if ending is not None and ending.status != "unknown":
            print(f"  how did it end? {ending.text}")
        if run.verdict is not None:
            print(f"  is it stable? {run.verdict.stable_text}")
            print(f"  did it learn? {run.verdict.learned_text}")
        for n, incident in enumerate(run.headline, start=1):
            text = incident.text if len(incident.text) <= 220 else incident.text[:217] + "..."
            print(f"  {n}. [{incident.severity}] {text}")
        if run.parsed.problems:
            print(f"  {len(run.parsed.problems)} malformed line(s) skipped, first at line {run.parsed.problems[0].line}")
    print(f"  report: {Path(args.out) / 'report.md'} (also report.html, report.json)")
    return 0
