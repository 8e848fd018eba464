"""Rollout stage from inference-engine request outputs.

Fields read (nothing else is assumed; a missing timing field leaves that latency out):

vLLM ``RequestOutput`` (vllm/outputs.py): ``prompt_token_ids``; ``outputs[i].token_ids`` and
``outputs[i].finish_reason`` ('stop', 'length', 'abort'; newer versions also 'error');
``metrics``, either
  - V0 ``RequestMetrics`` (vllm/sequence.py; wall-clock seconds): ``arrival_time``,
    ``first_token_time``, ``last_token_time``, ``finished_time``; or
  - V1 ``RequestStateStats`` (vllm/v1/metrics/stats.py): ``first_token_latency`` (TTFT, s) and
    the engine-core monotonic ``first_token_ts`` / ``last_token_ts``.
SGLang ``/generate`` result dicts (python/sglang/srt/managers/tokenizer_manager.py):
``meta_info["prompt_tokens"]``, ``["completion_tokens"]``, ``["e2e_latency"]`` (s),
``["finish_reason"]["type"]`` ('stop', 'length', 'abort'); with ``--enable-metrics`` also
``["request_received_ts"]`` and ``["prefill_finished_ts"]`` (first token, wall clock).

Per request: latency = finished - arrival (V1: TTFT + decode time, the engine's own clocks);
TTFT = first token - arrival; TPOT = (last token - first token) / (output tokens - 1) over the
longest completion of the request (parallel samples decode in lock-step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from otel_rl.dfx._collector import StepStats
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

STOP, LENGTH, ABORT, TIMEOUT = "stop", "length", "abort", "timeout"
_FAILED = {ABORT, TIMEOUT, "error", None}  # None: the engine returned an unfinished completion
_INPUT = A.GenAiTokenTypeValues.INPUT.value
_OUTPUT = A.GenAiTokenTypeValues.OUTPUT.value


@dataclass(frozen=True, slots=True)
class RequestStats:
    """What the rollout metrics need of one generation request (one prompt, n completions)."""

    prompt_tokens: int
    output_tokens: Sequence[int]  # per completion
    finish_reasons: Sequence[str | None]  # per completion: stop / length / abort / timeout / error
    latency: float | None = None  # s, arrival -> last token
    ttft: float | None = None  # s, arrival -> first token
    tpot: float | None = None  # s per output token after the first

    @property
    def succeeded(self) -> bool:
        return all(r not in _FAILED for r in self.finish_reasons)


def from_vllm(output: Any) -> RequestStats:
    """RequestStats of a vLLM ``RequestOutput`` (see the module docstring for the fields)."""
    outputs = output.outputs
    n_tokens = [len(o.token_ids) for o in outputs]
    reasons = [_reason(o.finish_reason) for o in outputs]
    latency = ttft = decode = None
    metrics = getattr(output, "metrics", None)
    if metrics is not None and getattr(metrics, "first_token_latency", None) is not None:  # vLLM V1
        ttft = _positive(metrics.first_token_latency)
        first, last = getattr(metrics, "first_token_ts", None), getattr(metrics, "last_token_ts", None)
        decode = last - first if first and last and last >= first else None
        latency = ttft + decode if ttft is not None and decode is not None else None
    elif metrics is not None:  # vLLM V0 RequestMetrics
        arrival = getattr(metrics, "arrival_time", None)
        first = getattr(metrics, "first_token_time", None)
        last = getattr(metrics, "last_token_time", None)
        finished = getattr(metrics, "finished_time", None) or last
        ttft = first - arrival if arrival is not None and first else None
        latency = finished - arrival if arrival is not None and finished else None
        decode = last - first if first and last and last >= first else None
    return RequestStats(
        prompt_tokens=len(output.prompt_token_ids or ()),
        output_tokens=n_tokens,
        finish_reasons=reasons,
        latency=latency,
        ttft=ttft,
        tpot=_tpot(decode, max(n_tokens, default=0)),
    )


def from_sglang(result: Mapping[str, Any]) -> RequestStats:
    """RequestStats of one SGLang ``/generate`` result dict (one completion)."""
    meta = result["meta_info"]
    reason = meta.get("finish_reason")
    reason = reason.get("type") if isinstance(reason, Mapping) else reason
    completion = int(meta.get("completion_tokens") or 0)
    latency = meta.get("e2e_latency")
    received, first = meta.get("request_received_ts"), meta.get("prefill_finished_ts")
    ttft = first - received if received is not None and first is not None else None
    decode = latency - ttft if latency is not None and ttft is not None else None
    return RequestStats(
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        output_tokens=[completion],
        finish_reasons=[_reason(reason)],
        latency=latency,
        ttft=ttft,
        tpot=_tpot(decode, completion),
    )


def request_stats(output: Any) -> RequestStats:
    """RequestStats of a vLLM RequestOutput, an SGLang result dict, or a RequestStats as is."""
    if isinstance(output, RequestStats):
        return output
    if hasattr(output, "outputs") and hasattr(output, "prompt_token_ids"):
        return from_vllm(output)
    if isinstance(output, (dict, Mapping)) and "meta_info" in output:  # dict first: ABC checks are slow
        return from_sglang(output)
    raise TypeError(f"not a vLLM RequestOutput, an SGLang result or a RequestStats: {type(output).__name__}")


def record_requests(stats: StepStats, outputs: Iterable[Any], *, timeout_s: float | None = None) -> dict[str, float]:
    """Record the rollout stage's request metrics from the step's engine outputs.

    - ``rl.rollout.tokens{gen_ai.token.type}``: prompt tokens as input (prefill), generated
      tokens as output (decode);
    - ``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token`` and
      ``gen_ai.server.time_per_output_token``: one value per request (TTFT / TPOT of successful
      requests only, as the upstream conventions define them);
    - ``rl.rollout.timeout_ratio`` / ``rl.rollout.abort_ratio``: share of completions that
      timed out (finish reason 'timeout', or a request slower than ``timeout_s``, whatever the
      engine then did with it) / otherwise aborted ('abort', 'error' or unfinished).
    Host data only: nothing here touches a device. Returns the ratios and token totals.
    """
    requests = [request_stats(o) for o in outputs]
    if not requests:
        return {}
    prompt = sum(r.prompt_tokens for r in requests)
    generated = sum(sum(r.output_tokens) for r in requests)
    stats.add(M.RL_ROLLOUT_TOKENS, prompt, {A.GEN_AI_TOKEN_TYPE: _INPUT})
    stats.add(M.RL_ROLLOUT_TOKENS, generated, {A.GEN_AI_TOKEN_TYPE: _OUTPUT})

    _histogram(stats, M.GEN_AI_SERVER_REQUEST_DURATION, [r.latency for r in requests])
    ok = [r for r in requests if r.succeeded]
    _histogram(stats, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, [r.ttft for r in ok])
    _histogram(stats, M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, [r.tpot for r in ok])

    completions = aborted = timed_out = 0
    for r in requests:
        slow = timeout_s is not None and r.latency is not None and r.latency > timeout_s
        for reason in r.finish_reasons:
            completions += 1
            if reason == TIMEOUT or slow:
                timed_out += 1
            elif reason in _FAILED:
                aborted += 1
    out = {
        "abort_ratio": aborted / completions,
        "timeout_ratio": timed_out / completions,
        "prompt_tokens": float(prompt),
        "output_tokens": float(generated),
    }
    stats.record(M.RL_ROLLOUT_ABORT_RATIO, out["abort_ratio"])
    stats.record(M.RL_ROLLOUT_TIMEOUT_RATIO, out["timeout_ratio"])
    return out


def _histogram(stats: StepStats, metric: str, values: list[float | None]) -> None:
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if present.size:
        stats.record(metric, present)


def _reason(reason: Any) -> str | None:
    """'stop', 'length', ... from a string or an enum (vLLM V1 FinishReason prints lower-case)."""
    if reason is None or type(reason) is str:
        return reason
    return (getattr(reason, "name", None) or str(reason)).lower()


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _tpot(decode_seconds: float | None, output_tokens: int) -> float | None:
    if decode_seconds is None or output_tokens < 2:
        return None
    return decode_seconds / (output_tokens - 1)
