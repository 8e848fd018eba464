"""Score ``analyze`` against a table of real logs and what an engineer sees in each.

The table (``benchmarks/analyze_corpus.yaml``) names each log's source (repository, path, commit),
whether it is a healthy control, how the run ended, the outcome events its report's headline must
carry (``expect``), what the report must not alarm on (``not_alarms``), the result of the first
analysis of the log ever made (``first_contact``) and the result now. A log passes when:

- a healthy control has no warning or critical headline incident and a verdict that is neither
  "Unstable" nor "Critical";
- each expected event is a warning or critical headline incident that reaches into its steps and
  involves each of its groups (``crash``: how the run ended);
- no not-alarm is a warning or critical headline incident;
- each ``noted`` event (one the registry's scale puts below an alarm: a gradient-norm spike under
  10x the clip, a lone KL blip under 10) is still in the report, as an incident of any severity or a
  detector finding at its steps: nothing is lost by not alarming on it;
- a log marked ``learned: no`` has a verdict that says it did not learn (no clear change, or worse);
- a log marked ``judged: false`` is reported as not judged (a read the analyzer cannot trust).

``python -m otel_rl.analyze.corpus FOLDER...`` scores every log of the table found in the folders
and prints a table; ``--write`` stores the results as the table's ``now`` column, and
``--first-contact FILE...`` records them as those logs' first contact (once: never overwritten).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from otel_rl.analyze._incident import RUN_END
from otel_rl.analyze._incidents import Incident
from otel_rl.analyze._run_incidents import NONFINITE
from otel_rl.replay import FormatError
from otel_rl.semconv import metrics as M

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "analyze_corpus.yaml"

# An expectation's groups -> the incident families (analyze._incidents.WATCHED) that count for it.
GROUPS: dict[str, frozenset[str]] = {
    "reward": frozenset({"reward", "signal"}),
    "validation": frozenset({"validation"}),
    "length": frozenset({"length"}),
    "entropy": frozenset({"entropy"}),
    "kl": frozenset({"kl"}),
    "grad": frozenset({"grad"}),
    "crash": frozenset({RUN_END}),
    "nonfinite": frozenset({NONFINITE}),
}
# A not-alarm names what must not be called a problem; "reward" there is the reward's level, not its
# spread (a run can learn while many groups have no spread, and be told so).
NOT_ALARM_GROUPS: dict[str, frozenset[str]] = {**GROUPS, "reward": frozenset({"reward"})}
SERIOUS = ("warning", "critical")


@dataclass(frozen=True)
class Expectation:
    what: str
    groups: tuple[str, ...]
    steps: tuple[int, int] | None = None
    alarm_free: bool = False  # a not-alarm (see NOT_ALARM_GROUPS)

    def matches(self, incident: Incident) -> bool:
        # A not-alarm is broken only by what the incident alarms on, not by the parts it explains.
        families = incident.alarm_families if self.alarm_free else set(incident.families.values())
        if self.alarm_free and NONFINITE in families and "nonfinite" not in self.groups:
            return False  # a not-alarm on a metric's values says nothing of its NaNs
        table = NOT_ALARM_GROUPS if self.alarm_free else GROUPS
        if not all(table[g] & families for g in self.groups):
            return False
        return self.steps is None or incident.reaches(*self.steps)


@dataclass
class Entry:
    file: str
    raw: dict[str, Any]
    healthy: bool
    judged: bool
    learned: str | None  # "no": the verdict must say it did not learn
    expect: list[Expectation]
    not_alarms: list[Expectation]
    noted: list[Expectation]

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.raw.get("source") or {})


@dataclass
class Score:
    file: str
    passed: bool
    failures: list[str] = field(default_factory=list)
    verdict: str = ""
    headline: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "failures": self.failures, "verdict": self.verdict, "headline": self.headline}


def _expectations(items: Iterable[dict[str, Any]] | None, file: str, *, alarm_free: bool = False) -> list[Expectation]:
    out = []
    for item in items or ():
        groups = tuple(item.get("groups") or ())
        unknown = [g for g in groups if g not in GROUPS]
        if unknown or not groups:
            raise ValueError(f"{file}: expectation {item.get('what')!r} has groups {list(groups)}; each must be one of {sorted(GROUPS)}")
        steps = item.get("steps")
        out.append(Expectation(str(item.get("what", "")), groups, (int(steps[0]), int(steps[1])) if steps else None, alarm_free))
    return out


def load_table(path: str | Path = DEFAULT_TABLE) -> list[Entry]:
    """The table's entries, checked: every group known, every file named once."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    entries = []
    seen: set[str] = set()
    for raw in data.get("logs") or ():
        file = str(raw["file"])
        if file in seen:
            raise ValueError(f"{path}: {file} is in the table twice")
        seen.add(file)
        entries.append(
            Entry(
                file=file,
                raw=raw,
                healthy=bool(raw.get("healthy", False)),
                judged=bool(raw.get("judged", True)),
                learned=raw.get("learned"),
                expect=_expectations(raw.get("expect"), file),
                not_alarms=_expectations(raw.get("not_alarms"), file, alarm_free=True),
                noted=_expectations(raw.get("noted"), file),
            )
        )
    return entries


def score(run: Any, entry: Entry) -> Score:
    """How the analysis of one log (a RunAnalysis) stands against the log's entry."""
    headline: list[Incident] = list(run.headline)
    serious = [i for i in headline if i.severity in SERIOUS]
    verdict = run.verdict
    stable = verdict.stable if verdict is not None else "unknown"
    failures: list[str] = []
    if not entry.judged:
        if stable != "unknown" and not run.parsed.doubts:
            failures.append(f"judged ({verdict.stable_text if verdict else stable}); the read cannot be trusted")
        return Score(entry.file, not failures, failures, verdict.stable_text if verdict else "", [_line(i) for i in headline])
    if not run.parsed.records:
        failures.append("not read: no logged step was read")  # a healthy control is no pass when nothing was read
    elif stable == "unknown" and entry.expect:
        failures.append(f"not judged: {verdict.stable_text if verdict else 'no verdict'}")
    if entry.healthy:
        if serious:
            failures.append(f"healthy control with {len(serious)} warning/critical headline incident(s): {serious[0].name}")
        if stable == "unstable" and verdict is not None:
            failures.append(f"healthy control called {verdict.stable_text.split(':')[0]!r}")
    if entry.learned == "no" and (verdict is None or verdict.learned not in ("no clear change", "worse")):
        failures.append(f"said to have learned ({verdict.learned_text if verdict else 'no verdict'}); it did not")
    for e in entry.expect:
        if not any(e.matches(i) for i in serious):
            failures.append(f"missing from the headline: {e.what}")
    for e in entry.noted:
        if not any(e.matches(i) for i in run.incidents) and not any(_finding_matches(f, e) for f in run.findings):
            failures.append(f"lost from the report (no incident or finding): {e.what}")
    for e in entry.not_alarms:
        hit = next((i for i in serious if e.matches(i)), None)
        if hit is not None:
            failures.append(f"alarm on what is no problem ({e.what}): [{hit.severity}] {hit.name}")
    return Score(entry.file, not failures, failures, verdict.stable_text if verdict else "", [_line(i) for i in headline])


# The registry metrics of each group, for detector findings (which name a metric, not a family).
_GROUP_METRICS: dict[str, frozenset[str]] = {
    "reward": frozenset({M.RL_REWARD, M.RL_SCORE, M.RL_REWARD_COMPONENT, M.RL_REWARD_ZERO_STD_RATIO}),
    "validation": frozenset({M.RL_VALIDATION_SCORE}),
    "length": frozenset({M.RL_RESPONSE_LENGTH, M.RL_RESPONSE_CLIPPED_RATIO}),
    "entropy": frozenset({M.RL_POLICY_ENTROPY}),
    "kl": frozenset({M.RL_POLICY_KL, M.RL_LOSS}),
    "grad": frozenset({M.RL_GRAD_NORM}),
}


def _finding_matches(f: Any, e: Expectation) -> bool:
    if not all(f.metric in _GROUP_METRICS.get(g, frozenset()) for g in e.groups[:1]):
        return False
    if e.steps is None:
        return True
    lo, hi = e.steps
    return f.first_step <= hi and lo <= f.last_step


def _line(i: Incident) -> str:
    return f"[{i.severity}] {i.text if len(i.text) <= 200 else i.text[:197] + '...'}"


def find_log(entry: Entry, folders: Sequence[Path]) -> Path | None:
    for folder in folders:
        candidate = folder / entry.file
        if candidate.is_file():
            return candidate
    return None


def _code_version() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(DEFAULT_TABLE.parent), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(DEFAULT_TABLE.parent), "status", "--porcelain", "--", "../otel_rl"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    from otel_rl.analyze import analyze

    parser = argparse.ArgumentParser(prog="python -m otel_rl.analyze.corpus", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding the table's logs (e.g. ../shared/logs)")
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE, help=f"the corpus table (default {DEFAULT_TABLE.name})")
    parser.add_argument("--write", action="store_true", help="store each result as the table's 'now' column")
    parser.add_argument(
        "--first-contact",
        nargs="*",
        metavar="FILE",
        default=None,
        help="record these logs' results as their first contact (only where none is recorded)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print each log's headline")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="write the table (source, first contact, now) as Markdown")
    args = parser.parse_args(argv)
    entries = load_table(args.table)
    data = yaml.safe_load(args.table.read_text(encoding="utf-8"))
    raw_by_file = {r["file"]: r for r in data["logs"]}
    version, today = _code_version(), _dt.date.today().isoformat()
    rows = []
    for entry in entries:
        path = find_log(entry, args.folders)
        if path is None:
            continue
        try:
            (run,) = analyze([path], plots=False)
            result = score(run, entry)
        except FormatError as exc:  # a log analyze cannot read at all fails, named, like any other
            result = Score(entry.file, False, [f"not read: {exc}"], "not read")
        rows.append(result)
        record = {**result.as_dict(), "code": version, "date": today}
        if args.write:
            raw_by_file[entry.file]["now"] = record
        if args.first_contact is not None and entry.file in args.first_contact and not raw_by_file[entry.file].get("first_contact"):
            raw_by_file[entry.file]["first_contact"] = record
        mark = "pass" if result.passed else "FAIL"
        print(f"{mark}  {entry.file}: {result.verdict[:120]}")
        for failure in result.failures:
            print(f"      - {failure}")
        if args.verbose:
            for line in result.headline:
                print(f"      {line}")
    passed = sum(r.passed for r in rows)
    print(
        f"{passed} passed, {len(rows) - passed} failed ({len(entries) - len(rows)} of the table's logs not in {', '.join(map(str, args.folders))})"
    )
    if args.write or args.first_contact is not None:
        args.table.write_text(_dump(data), encoding="utf-8")
    for line in summary(data["logs"]):
        print(line)
    if args.markdown is not None:
        args.markdown.write_text(markdown(data["logs"]), encoding="utf-8")
    return 0 if rows else 2


def _rate(rows: Sequence[dict[str, Any]], key: str) -> tuple[int, int]:
    judged = [r[key] for r in rows if r.get(key)]
    return sum(bool(r["passed"]) for r in judged), len(judged)


def summary(logs: Sequence[dict[str, Any]], last: int = 15) -> list[str]:
    """The figures the README gives: the pass rate now, and the first-contact pass rate of the last
    ``last`` logs added (in table order: logs are appended as they are added)."""
    now = _rate(logs, "now")
    met = [r for r in logs if r.get("first_contact")]
    recent = _rate(met[-last:], "first_contact")
    overall = _rate(met, "first_contact")
    by_code: dict[str, list[dict[str, Any]]] = {}
    for r in met:
        by_code.setdefault(str(r["first_contact"].get("code", "?")), []).append(r)
    versions = "; ".join(f"{code}: {_rate(rows, 'first_contact')[0]} of {len(rows)}" for code, rows in by_code.items())
    return [
        f"now: {now[0]} of {now[1]} logs pass",
        f"first contact, last {min(last, len(met))} logs added: {recent[0]} of {recent[1]} passed",
        f"first contact, all {overall[1]} logs with one recorded: {overall[0]} passed (by the code that met them: {versions})",
    ]


def markdown(logs: Sequence[dict[str, Any]]) -> str:
    """The corpus as a Markdown table: source, what is expected, first contact and now."""
    out = [
        "# The analyze corpus",
        "",
        "Generated from `benchmarks/analyze_corpus.yaml` by `python -m otel_rl.analyze.corpus ../shared/logs FOLDER... "
        '--markdown docs/analyze/corpus.md` (see docs/replay-and-analyze.md, "The corpus"). First contact: the result of the '
        "first analysis ever made of the log, with the code version that made it.",
        "",
        *(f"- {line}" for line in summary(logs)),
        "",
        "| log | framework | source (repository, path, commit) | healthy | expected in the headline | first contact | now |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in logs:
        src = r.get("source") or {}
        where = f"{src.get('repo', '')} `{src.get('path', '')}` {str(src.get('commit', ''))[:12]}".strip()
        expected = "; ".join(e["what"].split(":")[0][:60] for e in r.get("expect") or []) or "-"
        if r.get("learned") == "no":
            expected += " (and: did not learn)"
        fc = r.get("first_contact")
        first = "-" if not fc else ("pass" if fc["passed"] else "fail") + f" ({fc.get('code', '?')})"
        now = r.get("now")
        now_text = "-" if not now else ("pass" if now["passed"] else "fail: " + "; ".join(now["failures"])[:120])
        out.append(
            f"| `{r['file']}` | {r.get('framework', '')} | {where} | {'yes' if r.get('healthy') else 'no'} | {expected} | "
            f"{first} | {now_text} |"
        )
    return "\n".join(out) + "\n"


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


if __name__ == "__main__":
    sys.exit(main())
