"""The agent demo's task: arithmetic questions answered in turns, with a ``calculator`` tool.

A question is ``a op b`` with op one of ``+ - * /``. Easy ones (one-digit operands) the policy
answers right by itself; hard ones (two- and three-digit operands) it can only estimate (each
operand rounded to one significant digit) unless it calls the calculator, whose arguments come
from the question. The calculator really computes, and it is a flaky service the way real tools
are: a fixed share of calls is slow and a smaller share hangs until the caller's timeout, chosen
by a hash of the expression and the caller's key for the call (the rollout and the attempt: a
retry usually gets through); ``x / 0`` raises ``ZeroDivisionError``, which tells the agent the
answer is ``undefined``.

The reward has two parts: ``answer``, 1 for the exact answer and at most half of that for an
estimate (``0.5 * (1 - |error| / |exact|)``, at least 0), and ``tool_cost``, a small price per
tool call: the policy learns to answer easy questions itself and to call the tool for the rest.
"""

from __future__ import annotations

import asyncio
import operator
import random
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ANSWER",
    "CALL",
    "FEATURES",
    "TOOL_NAME",
    "UNDEFINED",
    "Question",
    "ToolTiming",
    "calculator",
    "count_tokens",
    "features",
    "make_questions",
    "score_answer",
]

TOOL_NAME = "calculator"
UNDEFINED = "undefined"  # the answer to x / 0
OPS = ("+", "-", "*", "/")
_COMPUTE: dict[str, Callable[[int, int], float]] = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
CALL, ANSWER = 0, 1  # the policy's two actions in a turn
FEATURES = 10  # see features()
ESTIMATE_CREDIT = 0.5  # the most an answer that is not exact scores
_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """Words, numbers and punctuation marks: the demo's tokenizer."""
    return len(_TOKEN.findall(text))


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _round_significant(value: int) -> int:
    """47 -> 50, 312 -> 300: how a head estimates an operand."""
    if abs(value) < 10:
        return value
    scale = 10 ** (len(str(abs(value))) - 1)
    return int(round(value / scale)) * scale


@dataclass(frozen=True)
class Question:
    """``a op b``; ``easy`` when both operands are one digit (a division's quotient too)."""

    a: int
    op: str
    b: int
    easy: bool

    @property
    def expression(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def divides_by_zero(self) -> bool:
        return self.op == "/" and self.b == 0

    def exact(self) -> str:
        """The right answer as text (``undefined`` for x / 0)."""
        if self.divides_by_zero:
            return UNDEFINED
        return _number_text(_COMPUTE[self.op](self.a, self.b))

    def estimate(self) -> str:
        """The policy's answer without the tool: exact for an easy question, else the operands rounded
        (and a / 0 taken as a / 1, a common slip)."""
        if self.easy:
            return self.exact()
        a, b = _round_significant(self.a), _round_significant(self.b)
        if self.op == "/":
            return _number_text(round(a / (b or 1)))
        return _number_text(_COMPUTE[self.op](a, b))


def make_questions(n: int, rng: random.Random, *, easy_share: float = 0.4, zero_share: float = 0.25) -> list[Question]:
    """``n`` questions; a hard division has divisor 0 with probability ``zero_share``."""
    out: list[Question] = []
    for _ in range(n):
        op = rng.choice(OPS)
        easy = rng.random() < easy_share
        if op == "/":
            if not easy and rng.random() < zero_share:
                out.append(Question(rng.randint(10, 999), op, 0, easy))
                continue
            b = rng.randint(1, 9) if easy else rng.randint(2, 99)
            quotient = rng.randint(1, 9) if easy else rng.randint(10, 99)
            out.append(Question(b * quotient, op, b, easy))
        else:
            low, high = (1, 9) if easy else (10, 999)
            out.append(Question(rng.randint(low, high), op, rng.randint(low, high), easy))
    return out


def score_answer(answer: str | None, question: Question) -> float:
    """1.0 for the exact answer; an estimate scores ``0.5 * (1 - |error| / |exact|)`` (at least 0)."""
    exact = question.exact()
    if answer is None:
        return 0.0
    if exact == UNDEFINED or answer == UNDEFINED:
        return float(answer == exact)
    try:
        got, want = float(answer), float(exact)
    except ValueError:
        return 0.0
    if got == want:
        return 1.0
    return ESTIMATE_CREDIT * max(0.0, 1.0 - abs(got - want) / max(1.0, abs(want)))


def features(question: Question, *, has_result: bool, last_failed: bool, turn: int, max_turns: int) -> list[float]:
    """What the policy sees in a turn: the operator (one-hot), whether the question is easy, a zero
    divisor, whether a tool result is in the context, whether the last call failed, how far along
    the turns are, and a bias."""
    onehot = [float(question.op == op) for op in OPS]
    return [
        *onehot,
        float(question.easy),
        float(question.divides_by_zero),
        float(has_result),
        float(last_failed),
        turn / max(1, max_turns - 1),
        1.0,
    ]


@dataclass(frozen=True)
class ToolTiming:
    """How long a calculator call takes: ``base_s`` mostly, ``slow_s`` for ``slow_percent`` of calls,
    and ``hang_s`` (past any sane timeout) for ``hang_percent`` of them."""

    base_s: float = 0.002
    slow_s: float = 0.035
    hang_s: float = 5.0
    slow_percent: int = 20
    hang_percent: int = 4

    def delay(self, expression: str, key: str) -> float:
        draw = zlib.crc32(f"{expression}#{key}".encode()) % 100
        if draw < self.hang_percent:
            return self.hang_s
        if draw < self.hang_percent + self.slow_percent:
            return self.slow_s
        return self.base_s * (1.0 + (draw % 10) / 10)


async def calculator(expression: str, *, key: str, timing: ToolTiming) -> str:
    """Compute ``a op b`` (the tool's argument): waits as the service would, then really computes;
    ``x / 0`` raises ZeroDivisionError. The caller bounds it with ``asyncio.wait_for``."""
    await asyncio.sleep(timing.delay(expression, key))
    left, op, right = expression.split()
    return _number_text(_COMPUTE[op](int(left), int(right)))
