"""The demo's toy task: reverse a short string of digits, then stop.

A prompt is ``BOS d1 .. dn =`` with 2..4 random digits; the right answer is the digits in
reverse order followed by EOS. The rule reward has two parts, so both the content and the
format of an answer move it:

- accuracy (weight 0.8): digits in the right place / max(answer length, target length),
  so missing digits and extra digits both cost;
- format (weight 0.2): the answer ended with EOS before the token budget ran out
  (a response that hits ``max_new_tokens`` without EOS is truncated: no format credit,
  and it counts in the clipped ratio).

A uniformly random policy scores about 0.1, the fresh demo policy (with its EOS prior) about 0.2;
it gets past 0.5 within a few dozen steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PAD = 0
BOS = 1
EOS = 2
SEP = 3
PLUS = 4
MINUS = 5
DIGIT0 = 6
VOCAB: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "=", "+", "-") + tuple(str(d) for d in range(10))
VOCAB_SIZE = len(VOCAB)

ACCURACY_WEIGHT = 0.8
FORMAT_WEIGHT = 0.2


def digit_token(d: int) -> int:
    return DIGIT0 + d


def decode(tokens: Sequence[int]) -> str:
    """Readable text of token ids (for progress output and debugging)."""
    return "".join(VOCAB[int(t)] if VOCAB[int(t)] != "<pad>" else "" for t in tokens)


@dataclass(frozen=True)
class RewardParts:
    score: float
    accuracy: float
    format_ok: bool


def target_tokens(prompt_digits: Sequence[int]) -> list[int]:
    """The right answer without EOS: the prompt digits reversed, as token ids."""
    return [digit_token(d) for d in reversed(list(prompt_digits))]


def score_response(prompt_digits: Sequence[int], response: Sequence[int]) -> RewardParts:
    """Rule reward of one response (token ids, PAD allowed after EOS)."""
    response = [int(t) for t in response]
    format_ok = EOS in response
    body = response[: response.index(EOS)] if format_ok else [t for t in response if t != PAD]
    target = target_tokens(prompt_digits)
    matches = sum(1 for got, want in zip(body, target) if got == want)
    accuracy = matches / max(len(body), len(target))
    score = ACCURACY_WEIGHT * accuracy + FORMAT_WEIGHT * float(format_ok)
    return RewardParts(score=score, accuracy=accuracy, format_ok=format_ok)


class ReverseDigitsTask:
    """Prompt sampler and batch encoder for the reverse-the-digits task."""

    name = "reverse_digits"

    def __init__(self, *, min_digits: int = 2, max_digits: int = 4) -> None:
        self.min_digits = min_digits
        self.max_digits = max_digits
        # digits + EOS, plus one token of slack so a too-long answer is possible
        self.max_new_tokens = max_digits + 2

    def sample_prompts(self, n: int, generator: torch.Generator) -> list[list[int]]:
        lengths = torch.randint(self.min_digits, self.max_digits + 1, (n,), generator=generator)
        return [torch.randint(0, 10, (int(k),), generator=generator).tolist() for k in lengths]

    @staticmethod
    def prompt_tokens(digits: Sequence[int]) -> list[int]:
        return [BOS, *(digit_token(d) for d in digits), SEP]

    def encode(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids [B, P] and their attention mask."""
        seqs = [self.prompt_tokens(p) for p in prompts]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        return ids, mask

    def score(self, prompts: Sequence[Sequence[int]], responses: torch.Tensor) -> list[RewardParts]:
        return [score_response(p, r.tolist()) for p, r in zip(prompts, responses)]


def sample_rows(
    prompts: Sequence[Sequence[int]],
    responses: torch.Tensor,
    parts: Sequence[RewardParts],
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
) -> list[dict[str, object]]:
    """A step's samples for ``Telemetry.log_samples``: prompt and response as text, the rule reward
    and its two parts, the sample's advantage, its length and truncation, and its GRPO group
    (``group_size`` adjacent samples share a prompt)."""
    return [
        {
            "prompt": decode(ReverseDigitsTask.prompt_tokens(prompt)),
            "response": decode(response.tolist()),
            "reward": part.score,
            "rewards": {"accuracy": part.accuracy, "format": float(part.format_ok)},
            "advantage": float(advantage),
            "response_length": int(length),
            "truncated": bool(cut),
            "group_id": i // max(group_size, 1),
        }
        for i, (prompt, response, part, length, cut, advantage) in enumerate(
            zip(prompts, responses, parts, lengths.tolist(), truncated.tolist(), advantages.tolist())
        )
    ]
