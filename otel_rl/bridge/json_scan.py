"""A bound on what an OTLP/JSON body costs, counted on its bytes before ``json.loads`` reads it.

``json.loads`` builds a Python object for every value it reads (an empty list is 56 bytes, a
float 24) and ``json_format.ParseDict`` then spends about 2 µs on each: 8 MB of ``[[],[],...]``
or ``[0,0,...]`` gzips to 8 KB and costs hundreds of MB and seconds of parsing. :func:`scan_json`
counts every kind of value first (objects, arrays, strings, numbers, ``true``/``false``/``null``)
and the nesting depth, with C-speed byte operations only (``bytes.count``, ``replace``,
``translate`` and ``split``), and raises :class:`RequestTooBig` naming the limit before anything
is built. Worst case on 8 MiB of any shape: a few tenths of a second and a few copies of the body.

Counting works on bytes: ``"`` and ``\\`` never occur inside a multi-byte UTF-8 character. With
the escape pairs taken out (left to right, as JSON reads them), every quote left opens or closes
a string; blanking the strings out leaves only structure, numbers and literals to count. On a
body that is not valid JSON the counts still bound what ``json.loads`` builds before it stops:
up to its first error the body reads exactly as counted here.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import accumulate, count

from otel_rl.bridge.limits import RequestLimits, RequestTooBig

__all__ = ["JsonCounts", "count_json", "scan_json"]

_CHUNK = 1 << 18  # strings are blanked out this many bytes at a time: split()'s list of parts stays small
_LITERALS = (b"true", b"false", b"null", b"NaN", b"Infinity")  # json.loads takes NaN and Infinity too
_NUMBER_CHARS = b"0123456789.eE+-"
_AS_NUMBER_MARKS = bytes(ord("n") if b in _NUMBER_CHARS else ord(" ") for b in range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")  # an opening adds 2, every bracket takes 1 back


@dataclass
class JsonCounts:
    """What :func:`count_json` counted (:func:`scan_json`: zeros when a cheap bound showed the body fits)."""

    objects: int = 0
    arrays: int = 0
    strings: int = 0
    numbers: int = 0
    literals: int = 0
    depth: int = 0

    @property
    def values(self) -> int:
        return self.objects + self.arrays + self.strings + self.numbers + self.literals

    def describe(self) -> str:
        return (
            f"{self.objects} objects, {self.arrays} arrays, {self.strings} strings, {self.numbers} numbers, {self.literals} true/false/null"
        )


def scan_json(body: bytes | bytearray, limits: RequestLimits) -> JsonCounts:
    """Count the values and the nesting depth of a JSON ``body``; :class:`RequestTooBig` past a limit.

    Malformed JSON is not judged here (``json.loads`` refuses it next); only what it could cost.
    """
    opens = body.count(b"{") + body.count(b"[")
    # Every value but the first follows a ",", ":" or "[", and every key a "{" or ",": when even
    # these counts (strings included) are within the limits, the body fits (a normal request).
    bound = 1 + body.count(b",") + body.count(b":") + opens
    if bound <= limits.max_json_values and opens <= limits.max_json_depth:
        return JsonCounts()
    counts = count_json(body, limits.max_json_values)
    if counts.values > limits.max_json_values:
        raise RequestTooBig(
            f"OTLP/JSON body holds over {limits.max_json_values} values (the bridge's JSON value limit; "
            f"counted before it stopped: {counts.describe()}): send smaller batches"
        )
    if counts.depth > limits.max_json_depth:
        raise RequestTooBig(
            f"OTLP/JSON body nests {counts.depth} deep, over the bridge's limit of {limits.max_json_depth}: "
            "OTLP nests about 20 deep; send flatter values"
        )
    return counts


def count_json(body: bytes | bytearray, most: int | None = None) -> JsonCounts:
    """Every value of a JSON ``body`` by kind (object keys as strings), and its nesting depth.

    With ``most``, counting stops once the values counted so far pass it (the depth is then left 0).
    """
    counts = JsonCounts()

    def past_most() -> bool:
        return most is not None and counts.values > most

    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")  # every quote left delimits a string
    counts.strings = (unescaped.count(b'"') + 1) // 2
    if past_most():
        return counts
    rest = _outside_strings(unescaped)
    del unescaped
    counts.objects, counts.arrays = rest.count(b"{"), rest.count(b"[")
    if past_most():
        return counts
    for literal in _LITERALS:
        found = rest.count(literal)
        if found:
            counts.literals += found
            rest = rest.replace(literal, b" ")
    if past_most():
        return counts
    marks = rest.translate(_AS_NUMBER_MARKS)  # every number is a run of "n"; count where runs start
    counts.numbers = marks.count(b" n") + marks.startswith(b"n")
    del marks
    if past_most():
        return counts
    # The nesting depth after each bracket is 2 * openings so far - brackets so far (C iterators only).
    steps = rest.translate(_BRACKET_STEPS, _NOT_BRACKETS)
    counts.depth = max(map(operator.sub, accumulate(steps), count(1)), default=0)
    return counts


def _outside_strings(unescaped: bytes | bytearray) -> bytes:
    """The body with every string blanked out to one space (escapes already taken out), a chunk at a
    time: each chunk ends outside a string, stretched to the closing quote when its end falls inside one."""
    parts, pos, end = [], 0, len(unescaped)
    while pos < end:
        cut = min(pos + _CHUNK, end)
        if unescaped.count(b'"', pos, cut) % 2:
            close = unescaped.find(b'"', cut)
            cut = end if close < 0 else close + 1
        parts.append(b" ".join(unescaped[pos:cut].split(b'"')[::2]))
        pos = cut
    return b"".join(parts)
