"""Old / ref log-prob stage and actor update.

- ``logprob_stage``: log-prob shape, response-mask ratio and micro-batch token counts.
- ``ComputeTimer``: forward / backward / optimizer_step / communication time of a stage, with
  CUDA events on the stream (resolved at ``stats.flush()`` once they completed, never waited
  for) or ``time.perf_counter`` on CPU.
- ``grad_norm`` and ``losses``: the update's gradient norm and loss decomposition.
The activation peak of the forward pass is ``memory.activation_peak_from_stage``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.dfx.correctness import response_mask_ratio
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

_OPS = tuple(op.value for op in A.RlComputeOpValues)
_COMMUNICATION = A.RlComputeOpValues.COMMUNICATION.value
_LOSS_TYPES = tuple(t.value for t in A.RlLossTypeValues)


def logprob_stage(
    stats: StepStats, stage: str, logprobs: Any, response_mask: Any = None, *, micro_batch_tokens: Sequence[Any] | None = None
) -> None:
    """Metrics of an old / ref log-prob stage.

    logprobs: the stage's [B, R] output -> ``rl.logprob.shape{rl.stage, rl.tensor.dim}`` (one
    gauge per dimension; shape metadata, no device access); response_mask ->
    ``rl.response.mask_ratio{rl.stage}``; micro_batch_tokens: tokens of each micro batch of the
    forward (numbers or device scalars such as ``mb["attention_mask"].sum()``) -> one
    ``rl.logprob.micro_batch_tokens{rl.stage}`` measurement each.
    """
    for dim, size in enumerate(T.shape_of(logprobs)):
        stats.record(M.RL_LOGPROB_SHAPE, size, {A.RL_STAGE: stage, A.RL_TENSOR_DIM: dim})
    if response_mask is not None:
        response_mask_ratio(stats, stage, response_mask)
    if micro_batch_tokens:
        attrs = {A.RL_STAGE: stage}
        stats.defer(list(micro_batch_tokens), lambda v: stats.record(M.RL_LOGPROB_MICRO_BATCH_TOKENS, [float(x) for x in v], attrs))


def grad_norm(stats: StepStats, value: Any, *, role: str = A.RlModelRoleValues.ACTOR.value) -> None:
    """Gradient norm (a device scalar from clip_grad_norm_, or a number) -> ``rl.grad_norm{rl.model.role}``."""
    stats.defer([value], lambda v: stats.record(M.RL_GRAD_NORM, v[0], {A.RL_MODEL_ROLE: role}))


def losses(stats: StepStats, parts: Mapping[str, Any], *, role: str = A.RlModelRoleValues.ACTOR.value) -> None:
    """Loss decomposition -> ``rl.loss{rl.model.role, rl.loss.type}``.

    parts: loss type (policy, kl, entropy, total, value, ...: ``rl.loss.type`` values) -> a
    device scalar or a number. A non-finite loss is not recorded as a gauge (the core rejects
    NaN / Inf and counts it in ``rl.telemetry.rejected``).
    """
    unknown = set(parts) - set(_LOSS_TYPES)
    if unknown:
        raise ValueError(f"loss types {sorted(unknown)} are not rl.loss.type values {_LOSS_TYPES}")
    names = list(parts)

    def on_ready(values: list[float]) -> None:
        for name, value in zip(names, values):
            stats.record(M.RL_LOSS, value, {A.RL_MODEL_ROLE: role, A.RL_LOSS_TYPE: name})

    stats.defer([parts[n] for n in names], on_ready)


class ComputeTimer:
    """Wall time of compute operations inside a stage, without synchronizing the device.

    ::

        timer = dfx.ComputeTimer(stats, "train_step")          # once
        for mb in micro_batches:
            with timer.op("forward"):   loss = model(mb)
            with timer.op("backward"):  loss.backward()
        with timer.op("optimizer_step"): optimizer.step()
        stats.flush()                                           # records the step's totals

    Each op's time is summed over the step and recorded at flush as one
    ``rl.compute.duration{rl.compute.op, rl.stage}`` measurement; ``communication`` also sets
    ``rl.rank.communication_time{rl.measured_rank}`` for this process's rank. On a CUDA device (default:
    when the program initialized CUDA) each op is a pair of CUDA events recorded on the current
    stream; flush reads the ones that completed (``Event.query()``, no wait) and carries the rest
    to the next flush, so a step's totals are recorded once all its events completed. On CPU the
    ops are timed with ``time.perf_counter``.
    """

    def __init__(self, stats: StepStats, stage: str, *, device: Any = None) -> None:
        self.stats = stats
        self.stage = stage
        self.use_events = _wants_cuda_events(device)
        self._open: dict[str, float] = {}  # op -> seconds, current step (perf_counter mode)
        self._events: list[tuple[int, str, Any, Any]] = []  # (generation, op, start, end)
        self._generation = 0
        self.last_totals: dict[str, float] = {}
        stats.on_flush(self._flush)

    @contextmanager
    def op(self, name: str) -> Iterator[None]:
        """Time one operation: forward, backward, optimizer_step or communication."""
        if name not in _OPS:
            raise ValueError(f"compute op {name!r} is not one of {_OPS}")
        if self.use_events:
            torch = T.loaded_torch()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((self._generation, name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._open[name] = self._open.get(name, 0.0) + time.perf_counter() - t0

    def _flush(self) -> None:
        if self.use_events:
            self._flush_events()
        elif self._open:
            totals, self._open = self._open, {}
            self._record(totals)
        self._generation += 1

    def _flush_events(self) -> None:
        pending: dict[int, list[tuple[str, Any, Any]]] = {}
        for generation, name, start, end in self._events:
            pending.setdefault(generation, []).append((name, start, end))
        self._events = []
        for generation in sorted(pending):
            ops = pending[generation]
            if not all(end.query() for _, _, end in ops):  # not finished on the device yet: next flush
                self._events.extend((generation, name, start, end) for name, start, end in ops)
                continue
            totals: dict[str, float] = {}
            for name, start, end in ops:
                totals[name] = totals.get(name, 0.0) + start.elapsed_time(end) / 1000.0
            self._record(totals)

    def _record(self, totals: dict[str, float]) -> None:
        self.last_totals = totals
        for name, seconds in totals.items():
            self.stats.record(M.RL_COMPUTE_DURATION, [seconds], {A.RL_COMPUTE_OP: name, A.RL_STAGE: self.stage})
        if _COMMUNICATION in totals:
            self.stats.record(
                M.RL_RANK_COMMUNICATION_TIME, totals[_COMMUNICATION], {A.RL_MEASURED_RANK: int(getattr(self.stats.tel, "rank", 0) or 0)}
            )


def _wants_cuda_events(device: Any) -> bool:
    torch = T.torch_module()
    if torch is None:
        return False
    if device is None:
        return bool(torch.cuda.is_initialized())
    return torch.device(device).type == "cuda"
