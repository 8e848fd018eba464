"""The Prometheus text exposition format (0.0.4), as vLLM and SGLang serve it on ``/metrics``.

A small reader instead of ``prometheus_client.parser`` (not a dependency of otel-rl): it returns
the samples and the lines it could not read, so the caller can say once what it skipped instead
of failing a whole scrape over one odd line. It reads

* ``# HELP`` and ``# TYPE`` lines (the type of each family is kept), other comments, ``# EOF``;
* ``name{label="value",...} value [timestamp]``, names with colons (``vllm:...``), label values
  with the escapes ``\\\\``, ``\\"`` and ``\\n``, a trailing comma in the label set;
* values ``+Inf``, ``-Inf``, ``NaN`` and Go's float syntax (``8.128902e+06``);
* an OpenMetrics exemplar after the value (`` # {trace_id="..."} 0.5``), which it drops.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's strconv.ParseFloat as Prometheus writes numbers; Python's float() alone would also take
# "1_000" and "infinity".
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_SPECIAL = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a scrape: the sample's name (``..._bucket`` for a histogram bucket), its labels
    in the order written, and its value."""

    name: str
    labels: Labels
    value: float

    def label(self, name: str) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return None


@dataclass
class Exposition:
    """A parsed scrape: the samples, each family's ``# TYPE``, and the lines skipped (number, text, why)."""

    samples: list[Sample]
    types: dict[str, str]
    bad_lines: list[tuple[int, str, str]]


def parse_number(text: str) -> float:
    """A sample value or bucket bound as Prometheus writes it; ValueError otherwise."""
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _labels(line: str, i: int) -> tuple[Labels, int]:
    """The label set that starts after the ``{`` at ``line[i - 1]``; returns it and the index after ``}``."""
    labels: list[tuple[str, str]] = []
    n = len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return tuple(labels), i + 1
        match = _LABEL_NAME.match(line, i)
        if match is None:
            raise ValueError("bad label name")
        name, i = match.group(0), match.end()
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != "=":
            raise ValueError(f"label {name!r} has no '='")
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise ValueError(f"label {name!r} has no quoted value")
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise ValueError(f"label {name!r}: unterminated value")
            c = line[i]
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError(f"label {name!r}: unterminated value")
                chars.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                chars.append(c)
                i += 1
        labels.append((name, "".join(chars)))
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == ",":
            i += 1
        elif i < n and line[i] == "}":
            continue
        else:
            raise ValueError("expected ',' or '}' after a label")


def parse_line(line: str) -> Sample:
    """One sample line; ValueError saying why it is not one."""
    match = _NAME.match(line)
    if match is None:
        raise ValueError("no metric name")
    name, i = match.group(0), match.end()
    labels: Labels = ()
    if i < len(line) and line[i] == "{":
        labels, i = _labels(line, i + 1)
    rest = line[i:]
    if rest and rest[0] not in " \t":
        raise ValueError("no space between the name and the value")
    rest = rest.split(" # ", 1)[0]  # an OpenMetrics exemplar follows the value
    fields = rest.split()
    if not fields or len(fields) > 2:
        raise ValueError("expected a value and an optional timestamp")
    value = parse_number(fields[0])
    if len(fields) == 2:
        parse_number(fields[1])  # the timestamp: checked, not kept (the scrape's time is what counts)
    return Sample(name, labels, value)


def parse_exposition(text: str) -> Exposition:
    """Every sample of ``text``; lines that are not samples or comments are listed, never raised."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    bad: list[tuple[int, str, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip().lower()
            continue  # HELP, EOF and plain comments
        try:
            samples.append(parse_line(line))
        except ValueError as exc:
            bad.append((number, raw, str(exc)))
    return Exposition(samples, types, bad)
