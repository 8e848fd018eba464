"""Series values held as columns (``StepValues``): the same answers a dict by step gives, at 16
bytes a point; and the line reading that does not split a whole log at once."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest

from otel_rl.analyze._series import Series, StepValues, build_series
from otel_rl.replay._checks import iter_lines
from otel_rl.replay._log import ParsedLog, StepRecord


def test_step_values_answer_as_the_dict_of_the_same_log_order_would() -> None:
    logged = [(3, 0.3), (1, 0.1), (2, 0.2), (1, 1.5), (10, float("nan"))]  # out of order, step 1 twice
    values = StepValues.of([s for s, _ in logged], array("d", [v for _, v in logged]))
    expected = dict(logged)
    assert list(values) == sorted(expected) and len(values) == len(expected)
    assert [(s, v) for s, v in values.items() if v == v] == sorted((s, v) for s, v in expected.items() if v == v)
    assert values[1] == 1.5 and values.get(4) is None and values.get(4, -1.0) == -1.0
    assert 2 in values and 4 not in values and np.int64(3) in values and "2" not in values and True not in values
    with pytest.raises(KeyError):
        values[7]
    series = Series("rl.loss", {}, "loss", by_step=values)
    steps, x = series.arrays()
    assert steps.tolist() == [1, 2, 3, 10] and x[:3].tolist() == [1.5, 0.2, 0.3]
    steps[0] = 99  # a copy: the series is not changed through it
    assert list(series.by_step)[0] == 1


def test_build_series_gives_columns_with_the_later_value_of_a_step() -> None:
    parsed = ParsedLog(path=Path("train.log"), format="verl-console", framework="verl", records=[])
    parsed.records = [
        StepRecord(1, {"actor/entropy": 0.5, "actor/grad_norm": 1.0}, 1),
        StepRecord(2, {"actor/entropy": 0.4}, 2),
        StepRecord(2, {"actor/entropy": 0.45}, 3),  # the same step again: the later value wins
    ]
    series, _ = build_series(parsed)
    entropy = next(s for s in series.values() if s.label == "actor/entropy")
    assert isinstance(entropy.by_step, StepValues) and dict(entropy.by_step.items()) == {1: 0.5, 2: 0.45}


@pytest.mark.parametrize("block", [1, 2, 7, 1 << 20])
def test_iter_lines_is_splitlines_a_block_at_a_time(block: int) -> None:
    texts = ["a\nb\r\nc\rd\x0be\n", "x", "", "a\n\nb", "a\u2028b\x85c\n\n", "ab\r\ncd\r\n" * 50, "\n\n\r\r\n"]
    for text in texts:
        assert list(iter_lines(text, block)) == text.splitlines(), (text, block)


def test_step_values_is_a_mapping_whose_values_are_the_values() -> None:
    values = StepValues.of([1, 2], array("d", [0.5, 0.25]))
    assert list(values.values()) == [0.5, 0.25] and list(values.keys()) == [1, 2]
