"""The caller's half of the bulk path: which packed steps the worker takes as they are."""

from __future__ import annotations

import math
import random
import struct
import sys

import pytest

from otel_rl._sdk.pipeline.step_plan import KeySets, surely_finite


def _packed(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


SIGNALING_NAN = struct.unpack("<d", bytes.fromhex("0100000000f0ff7f"))[0]  # the lowest mantissa bit set, the quiet bit clear


@pytest.mark.parametrize("bad", [math.nan, -math.nan, math.inf, -math.inf, SIGNALING_NAN], ids=["nan", "-nan", "inf", "-inf", "snan"])
def test_a_nan_or_an_infinity_anywhere_is_found(bad: float) -> None:
    for position in range(5):
        values = [1.0, -2.5, 0.0, 3e10, -1e-300]
        values[position] = bad
        assert not surely_finite(_packed(*values))


def test_every_double_found_non_finite_is_past_5e303_or_not_finite() -> None:
    # random bit patterns: the check never calls a NaN or an infinity finite, and only calls a
    # finite value non-finite when it is past ~5e303 (such a step goes per key, as it should anyway)
    rng = random.Random(7)
    for _ in range(20_000):
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        found = surely_finite(_packed(value))
        if not math.isfinite(value):
            assert not found
        else:
            assert found or abs(value) >= 2.0**1009


@pytest.mark.parametrize("value", [0.0, -0.0, 5e-324, 1.0, -1e300, 2.0**1008, sys.float_info.min, 123456.789])
def test_ordinary_values_are_finite(value: float) -> None:
    assert surely_finite(_packed(1.0, value, 2.0))


def test_a_step_of_no_values_is_finite() -> None:
    assert surely_finite(b"")


def test_key_sets_are_bounded_in_sets_and_in_keys_the_oldest_forgotten_first() -> None:
    sets: KeySets[int] = KeySets(limit=3, keys_limit=100)
    for step in range(1000):  # a step counter inside every key: a new key set each step
        sets.keep(tuple(f"s{step}/k{i}" for i in range(30)), step)
        assert len(sets) <= 3 and sets.keys_held <= 100
        assert sets.keys_held == sum(map(len, sets))
    assert list(sets.values()) == [997, 998, 999]  # the newest kept
    sets.keep(tuple(f"big/{i}" for i in range(101)), -1)  # larger than the bound alone: not kept
    assert -1 not in sets.values() and sets.keys_held == 90
    same = next(iter(sets))
    sets.keep(same, 5)  # a key set kept already: its value replaced, nothing forgotten
    assert sets[same] == 5 and len(sets) == 3
    sets.pop(same)
    assert sets.keys_held == 60
    sets.clear()
    assert sets.keys_held == 0 and not sets
