"""The caller's half of the bulk path: which packed steps the worker takes as they are."""

from __future__ import annotations

import math
import random
import struct
import sys

import pytest

from otel_rl._sdk.step_plan import surely_finite


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
