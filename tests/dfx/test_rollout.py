"""Rollout request metrics from vLLM- and SGLang-shaped outputs, against hand-computed values.

vLLM and SGLang are not installed here: the classes below are STAND-INS that mirror the real
field names, read from their sources: vllm/outputs.py (RequestOutput, CompletionOutput),
vllm/sequence.py (V0 RequestMetrics), vllm/v1/metrics/stats.py (V1 RequestStateStats), and the
meta_info dict SGLang's tokenizer_manager.py builds (python/sglang/srt/managers/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from dfx_support import histogram, latest

from otel_rl import dfx
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M


@dataclass
class RequestMetrics:
    """Stand-in for vLLM V0 vllm.sequence.RequestMetrics (wall-clock seconds)."""

    arrival_time: float
    last_token_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None = None
    scheduler_time: float | None = None
    model_forward_time: float | None = None
    model_execute_time: float | None = None


@dataclass
class RequestStateStats:
    """Stand-in for vLLM V1 vllm.v1.metrics.stats.RequestStateStats."""

    num_generation_tokens: int = 0
    arrival_time: float = 0.0  # frontend wall clock
    queued_ts: float = 0.0  # engine-core monotonic clock from here on
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0


@dataclass
class CompletionOutput:
    """Stand-in for vllm.outputs.CompletionOutput."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """Stand-in for vllm.outputs.RequestOutput (the constructor's fields)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Any = None
    num_cached_tokens: int | None = None
    extra: dict = field(default_factory=dict)


def vllm_outputs() -> list[RequestOutput]:
    a = RequestOutput(  # V0, n=2: arrival 100.0, first token 100.5, last 102.5, finished 102.6
        "a",
        "p",
        [1] * 7,
        None,
        [CompletionOutput(0, "x", [5] * 5, finish_reason="stop"), CompletionOutput(1, "y", [6] * 3, finish_reason="length")],
        True,
        RequestMetrics(
            arrival_time=100.0,
            last_token_time=102.5,
            first_scheduled_time=100.1,
            first_token_time=100.5,
            time_in_queue=0.1,
            finished_time=102.6,
        ),
    )
    b = RequestOutput(  # V0, aborted after one token
        "b",
        "q",
        [1] * 4,
        None,
        [CompletionOutput(0, "z", [7], finish_reason="abort")],
        True,
        RequestMetrics(
            arrival_time=100.0,
            last_token_time=101.0,
            first_scheduled_time=100.2,
            first_token_time=101.0,
            time_in_queue=0.2,
            finished_time=101.0,
        ),
    )
    c = RequestOutput(  # V1: TTFT 0.25 s, 11 tokens decoded over 1.0 s
        "c",
        "r",
        [1] * 3,
        None,
        [CompletionOutput(0, "w", [8] * 11, finish_reason="stop")],
        True,
        RequestStateStats(
            num_generation_tokens=11,
            arrival_time=1.7e9,
            queued_ts=49.7,
            scheduled_ts=49.75,
            first_token_ts=50.0,
            last_token_ts=51.0,
            first_token_latency=0.25,
        ),
    )
    return [a, b, c]


def test_request_stats_of_vllm_v0_and_v1():
    a, b, c = (dfx.request_stats(o) for o in vllm_outputs())
    assert (a.prompt_tokens, list(a.output_tokens), list(a.finish_reasons)) == (7, [5, 3], ["stop", "length"])
    assert (a.ttft, a.latency, a.tpot) == pytest.approx((0.5, 2.6, 2.0 / 4))  # TPOT over the longest completion
    assert (b.ttft, b.latency, b.tpot, b.succeeded) == (1.0, 1.0, None, False)
    assert (c.ttft, c.latency, c.tpot) == pytest.approx((0.25, 1.25, 1.0 / 10))


def test_record_requests_from_vllm(stats, tel):
    out = dfx.record_requests(stats, vllm_outputs())
    assert out == {"abort_ratio": 0.25, "timeout_ratio": 0.0, "prompt_tokens": 14.0, "output_tokens": 20.0}
    assert latest(tel, M.RL_ROLLOUT_TOKENS, {A.GEN_AI_TOKEN_TYPE: "input"}) == 14.0  # prefill: 7 + 4 + 3
    assert latest(tel, M.RL_ROLLOUT_TOKENS, {A.GEN_AI_TOKEN_TYPE: "output"}) == 20.0  # decode: 5 + 3 + 1 + 11
    assert histogram(tel, M.GEN_AI_SERVER_REQUEST_DURATION) == pytest.approx((3, 2.6 + 1.0 + 1.25))
    assert histogram(tel, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN) == pytest.approx((2, 0.5 + 0.25))  # successful only
    assert histogram(tel, M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN) == pytest.approx((2, 0.5 + 0.1))
    assert latest(tel, M.RL_ROLLOUT_ABORT_RATIO) == 0.25
    assert latest(tel, M.RL_ROLLOUT_TIMEOUT_RATIO) == 0.0


def test_requests_slower_than_the_timeout_count_as_timed_out(stats, tel):
    out = dfx.record_requests(stats, vllm_outputs(), timeout_s=2.0)  # request a took 2.6 s: both completions
    assert (out["timeout_ratio"], out["abort_ratio"]) == (0.5, 0.25)
    assert latest(tel, M.RL_ROLLOUT_TIMEOUT_RATIO) == 0.5


def sglang_results() -> list[dict]:
    """Stand-ins for SGLang /generate results: {"text", "output_ids", "meta_info"} as tokenizer_manager builds them."""
    return [
        {
            "text": "...",
            "output_ids": [3] * 16,
            "meta_info": {  # with --enable-metrics timestamps
                "id": "r1",
                "finish_reason": {"type": "length", "length": 16},
                "prompt_tokens": 12,
                "completion_tokens": 16,
                "cached_tokens": 4,
                "e2e_latency": 1.9,
                "request_received_ts": 1000.0,
                "prefill_finished_ts": 1000.4,
                "decode_finished_ts": 1001.9,
            },
        },
        {
            "text": "",
            "output_ids": [],
            "meta_info": {  # _handle_abort_req: id, finish_reason, completion_tokens
                "id": "r2",
                "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                "completion_tokens": 0,
            },
        },
        {
            "text": "ok",
            "output_ids": [9],
            "meta_info": {
                "id": "r3",
                "finish_reason": {"type": "stop", "matched": 2},
                "prompt_tokens": 5,
                "completion_tokens": 1,
                "cached_tokens": 0,
                "e2e_latency": 0.3,
            },
        },
    ]


def test_record_requests_from_sglang(stats, tel):
    r1, r2, r3 = (dfx.from_sglang(r) for r in sglang_results())
    assert (r1.ttft, r1.tpot, r1.latency) == pytest.approx((0.4, (1.9 - 0.4) / 15, 1.9))
    assert (r2.prompt_tokens, r2.latency, r2.succeeded) == (0, None, False)
    assert (r3.ttft, r3.tpot) == (None, None)  # no timing metrics enabled
    out = dfx.record_requests(stats, sglang_results())
    assert out["abort_ratio"] == pytest.approx(1 / 3) and out["output_tokens"] == 17.0
    assert histogram(tel, M.GEN_AI_SERVER_REQUEST_DURATION) == pytest.approx((2, 2.2))
    assert histogram(tel, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN) == pytest.approx((1, 0.4))


def test_unknown_outputs_are_refused(stats):
    with pytest.raises(TypeError):
        dfx.record_requests(stats, [object()])
    assert dfx.record_requests(stats, []) == {}
