"""Correctness: non-finite values, shape checksums, token / id alignment, and the shape ledger.

- ``count_nonfinite``: NaN / Inf per tensor -> ``rl.tensor.nonfinite`` {tensor name, kind}.
- ``response_mask_ratio``: share of ones in a stage's response mask -> ``rl.response.mask_ratio``.
- ``token_alignment``: samples whose log-probs / engine token counts disagree with the response
  mask -> ``rl.batch.token_misaligned``.
- ``id_alignment``: samples whose sample / group id changed between stages -> ``rl.batch.id_misaligned``.
- ``ShapeLedger``: (name, shape, dtype, checksum) of every tensor of a batch at each worker
  boundary; a later stage or another rank seeing the same batch with a different entry is a
  mismatch -> ``rl.shape_ledger.mismatches`` plus a warning and an exception event on the current
  span naming the tensor and both entries; every checksum -> ``rl.tensor.checksum``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from opentelemetry import trace

import otel_rl.dfx._tensors as T
from otel_rl.dfx._collector import StepStats
from otel_rl.reporting import ReportOnce
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")

_NAN = A.RlNonfiniteKindValues.NAN.value
_INF = A.RlNonfiniteKindValues.INF.value
# Float checksums are float64 sums of the same data with the same kernels: equal in practice.
# The tolerance only absorbs a different reduction order (e.g. the same tensor on another device).
_CHECKSUM_RTOL = 1e-12


def count_nonfinite(stats: StepStats, tensors: Mapping[str, Any]) -> None:
    """Count NaN and Inf values of each named tensor into ``rl.tensor.nonfinite``.

    Both kinds are added for every tensor, 0 included, so a healthy run shows its zeros.
    """
    for name, tensor in tensors.items():
        nan, inf = T.nan_inf_counts(tensor)
        stats.defer([nan, inf], lambda v, name=name: _add_nonfinite(stats, name, v))


def _add_nonfinite(stats: StepStats, name: str, values: list[float]) -> None:
    nan, inf = values
    stats.add(M.RL_TENSOR_NONFINITE, nan, {A.RL_TENSOR_NAME: name, A.RL_NONFINITE_KIND: _NAN})
    stats.add(M.RL_TENSOR_NONFINITE, inf, {A.RL_TENSOR_NAME: name, A.RL_NONFINITE_KIND: _INF})


def response_mask_ratio(stats: StepStats, stage: str, response_mask: Any) -> None:
    """Share of ones in the response / loss mask a stage sees -> ``rl.response.mask_ratio{rl.stage}``."""
    size = T.numel(response_mask)
    if size == 0:
        return
    stats.defer([T.total(response_mask)], lambda v: stats.record(M.RL_RESPONSE_MASK_RATIO, v[0] / size, {A.RL_STAGE: stage}))


def token_alignment(stats: StepStats, stage: str, response_mask: Any, *, logprobs: Any = None, response_lengths: Any = None) -> None:
    """Count samples whose tokens, mask and log-probs disagree -> ``rl.batch.token_misaligned``.

    response_mask: [B, R], 1 on the response tokens the stage trains on.
    logprobs: either a padded [B, R] tensor (its shape must equal the mask's, else every sample
        is misaligned), or one 1-D sequence per sample (unpadded, as an inference engine returns
        them: each sample's length must equal its mask row sum).
    response_lengths: [B] token counts from the producer (e.g. ``len(output.token_ids)``); each
        must equal the mask row sum.
    A batch whose sample count differs from the mask's counts every sample as misaligned.
    """
    attrs = {A.RL_STAGE: stage}
    shape = T.shape_of(response_mask)
    batch = shape[0] if shape else 0
    checks: list[Any] = []
    if logprobs is not None:
        if _is_padded(logprobs):
            if T.shape_of(logprobs) != shape:
                stats.add(M.RL_BATCH_TOKEN_MISALIGNED, batch, attrs)
                return
        else:
            lengths = [T.numel(x) for x in logprobs]
            if len(lengths) != batch:
                stats.add(M.RL_BATCH_TOKEN_MISALIGNED, batch, attrs)
                return
            checks.append(lengths)
    if response_lengths is not None:
        if T.numel(response_lengths) != batch:
            stats.add(M.RL_BATCH_TOKEN_MISALIGNED, batch, attrs)
            return
        checks.append(response_lengths)
    if not checks:
        stats.add(M.RL_BATCH_TOKEN_MISALIGNED, 0, attrs)
        return
    row_sums = T.row_sums(response_mask)
    stats.defer([row_sums, *checks], lambda v: stats.add(M.RL_BATCH_TOKEN_MISALIGNED, _misaligned_rows(v), attrs))


def _is_padded(logprobs: Any) -> bool:
    return hasattr(logprobs, "shape") and len(T.shape_of(logprobs)) >= 2


def _misaligned_rows(values: list[Any]) -> int:
    row_sums, *lengths = values
    bad = None
    for other in lengths:
        differs = row_sums != other
        bad = differs if bad is None else (bad | differs)
    return int(bad.sum()) if bad is not None else 0


def id_alignment(stats: StepStats, stage: str, ids: Any, expected_ids: Any) -> None:
    """Count samples whose sample / group id differs from the expected order -> ``rl.batch.id_misaligned``.

    ids, expected_ids: 1-D ids (torch tensors on one device, numpy arrays, or lists of ints or
    strings such as uuids). Extra or missing samples count as misaligned.
    """
    attrs = {A.RL_STAGE: stage}
    n, m = T.numel(ids), T.numel(expected_ids)
    overlap = min(n, m)
    extra = abs(n - m)
    if overlap == 0:
        stats.add(M.RL_BATCH_ID_MISALIGNED, extra, attrs)
        return
    a, b = _head(ids, overlap), _head(expected_ids, overlap)
    if _is_text(a) or _is_text(b):
        stats.add(M.RL_BATCH_ID_MISALIGNED, sum(x != y for x, y in zip(a, b)) + extra, attrs)
        return
    stats.defer([T.count_not_equal(a, b)], lambda v: stats.add(M.RL_BATCH_ID_MISALIGNED, v[0] + extra, attrs))


def _head(ids: Any, n: int) -> Any:
    if T.is_torch(ids):
        return ids.reshape(-1)[:n]
    if isinstance(ids, (list, tuple)):
        return list(ids[:n])
    return T.host_array(ids).reshape(-1)[:n]


def _is_text(ids: Any) -> bool:
    return isinstance(ids, list) and bool(ids) and isinstance(ids[0], (str, bytes))


# --------------------------------------------------------------------------------------------
# Shape ledger


class BatchId(NamedTuple):
    """Identity of a batch at worker boundaries: the step and the micro-batch within it.

    Any hashable works as a batch id; this one says what the ledger compares: the same step's
    same micro-batch, seen by different stages (old log-probs, ref log-probs, actor update) or
    by different ranks that must hold the same data (tensor / pipeline-parallel peers).
    """

    step: int
    micro_batch: int = 0


def batch_id(step: int, micro_batch: int = 0) -> BatchId:
    return BatchId(int(step), int(micro_batch))


@dataclass
class LedgerEntry:
    """What the ledger knows of one tensor of one batch, as first seen."""

    name: str
    stage: str
    rank: int | None
    shape: tuple[int, ...]
    dtype: str
    checksum: float | None = None  # filled in at flush


@dataclass(frozen=True)
class Mismatch:
    """A tensor whose entry at ``stage`` differs from the ledger's first entry for the batch."""

    batch: Hashable
    name: str
    expected: LedgerEntry
    stage: str
    rank: int | None
    shape: tuple[int, ...]
    dtype: str
    checksum: float | None
    what: str  # "shape", "dtype", "checksum" or "ids"

    def describe(self) -> str:
        exp = self.expected
        if self.what == "checksum":
            got, want = f"checksum {self.checksum!r}", f"checksum {exp.checksum!r}"
        elif self.what == "ids":
            got, want = "different sample ids", "the first ids"
        else:
            got, want = f"{self.shape} {self.dtype}", f"{exp.shape} {exp.dtype}"
        return (
            f"batch {self.batch}: tensor {self.name!r} is {got} at {self.stage} (rank {self.rank}) "
            f"but was {want} at {exp.stage} (rank {exp.rank})"
        )


class ShapeLedgerMismatch(Exception):
    """Recorded (never raised) on the current span as an exception event describing a mismatch."""


class ShapeLedger:
    """A ledger of the tensors of each batch at worker boundaries, compared stage by stage.

    ``record(batch_id, stage, tensors)`` notes every tensor's shape, dtype and checksum. The
    first stage that records a tensor of a batch sets the reference; any later stage or rank
    recording the same tensor name for the same batch must match it. Shapes and dtypes are
    metadata and compared at once; checksums are computed on the device and compared at
    ``stats.flush()``. Each record adds to ``rl.shape_ledger.mismatches{rl.stage}`` (0 when
    clean) and sets ``rl.tensor.checksum{rl.tensor.name, rl.stage}``. In several processes,
    gather ``entries(batch_id)`` from the peers (``torch.distributed.all_gather_object``) and pass
    each to ``compare_entries``.
    """

    def __init__(self, stats: StepStats, *, keep_batches: int = 256, keep_mismatches: int = 100) -> None:
        self.stats = stats
        self._batches: OrderedDict[Hashable, dict[str, LedgerEntry]] = OrderedDict()
        self._ids: dict[Hashable, Any] = {}
        self._keep = keep_batches
        self.mismatches: deque[Mismatch] = deque(maxlen=keep_mismatches)
        self._report_once = ReportOnce(logger)

    def record(self, batch: Hashable, stage: str, tensors: Mapping[str, Any], *, sample_ids: Any = None, rank: int | None = None) -> None:
        """Note the batch's tensors as ``stage`` (and ``rank``) sees them; compare with the ledger."""
        book = self._book(batch)
        stats = self.stats
        stats.add(M.RL_SHAPE_LEDGER_MISMATCHES, 0, {A.RL_STAGE: stage})
        for name, tensor in tensors.items():
            entry = LedgerEntry(name, stage, rank, T.shape_of(tensor), T.dtype_name(tensor))
            reference = book.setdefault(name, entry)
            if reference is not entry:
                self._compare_meta(batch, reference, entry)
            stats.defer([T.checksum(tensor)], lambda v, b=batch, r=reference, e=entry: self._on_checksum(b, r, e, v[0]))
        if sample_ids is not None:
            self._record_ids(batch, stage, sample_ids)

    def entries(self, batch: Hashable) -> list[LedgerEntry]:
        """This process's reference entries of a batch (picklable, to gather from peers)."""
        return list(self._batches.get(batch, {}).values())

    def compare_entries(self, batch: Hashable, entries: Sequence[LedgerEntry]) -> None:
        """Compare entries another rank recorded for ``batch`` (after ``stats.flush()`` on both)."""
        book = self._book(batch)
        for entry in entries:
            self.stats.add(M.RL_SHAPE_LEDGER_MISMATCHES, 0, {A.RL_STAGE: entry.stage})
            reference = book.setdefault(entry.name, entry)
            if reference is entry:
                continue
            if self._compare_meta(batch, reference, entry):
                self._compare_checksum(batch, reference, entry)

    # -- internals ------------------------------------------------------------------------
    def _book(self, batch: Hashable) -> dict[str, LedgerEntry]:
        book = self._batches.get(batch)
        if book is None:
            book = self._batches[batch] = {}
            while len(self._batches) > self._keep:
                old, _ = self._batches.popitem(last=False)
                self._ids.pop(old, None)
        return book

    def _compare_meta(self, batch: Hashable, reference: LedgerEntry, entry: LedgerEntry) -> bool:
        """True when shape and dtype agree; else counts and reports the mismatch."""
        what = "shape" if entry.shape != reference.shape else "dtype" if entry.dtype != reference.dtype else None
        if what is not None:
            self._mismatch(Mismatch(batch, entry.name, reference, entry.stage, entry.rank, entry.shape, entry.dtype, entry.checksum, what))
        return what is None

    def _on_checksum(self, batch: Hashable, reference: LedgerEntry, entry: LedgerEntry, value: float) -> None:
        entry.checksum = value
        self.stats.record(M.RL_TENSOR_CHECKSUM, value, {A.RL_TENSOR_NAME: entry.name, A.RL_STAGE: entry.stage})
        if reference is not entry and entry.shape == reference.shape and entry.dtype == reference.dtype:
            self._compare_checksum(batch, reference, entry)

    def _compare_checksum(self, batch: Hashable, reference: LedgerEntry, entry: LedgerEntry) -> None:
        a, b = reference.checksum, entry.checksum
        if a is None or b is None or _same_checksum(a, b):
            return
        self._mismatch(Mismatch(batch, entry.name, reference, entry.stage, entry.rank, entry.shape, entry.dtype, b, "checksum"))

    def _record_ids(self, batch: Hashable, stage: str, ids: Any) -> None:
        first = self._ids.setdefault(batch, ids)
        id_alignment(self.stats, stage, ids, first)

    def _mismatch(self, mismatch: Mismatch) -> None:
        self.mismatches.append(mismatch)
        self.stats.add(M.RL_SHAPE_LEDGER_MISMATCHES, 1, {A.RL_STAGE: mismatch.stage})
        text = "otel-rl shape ledger: " + mismatch.describe()
        key = (mismatch.name, mismatch.stage, mismatch.what)
        self._report_once(key, "%s", text)  # every mismatch is counted; each kind is logged once
        span = trace.get_current_span()
        if span.is_recording():
            span.record_exception(ShapeLedgerMismatch(text), attributes={A.RL_TENSOR_NAME: mismatch.name, A.RL_STAGE: mismatch.stage})


def _same_checksum(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True  # NaN data: rl.tensor.nonfinite reports it; the ledger compares shapes only
    return a == b or abs(a - b) <= _CHECKSUM_RTOL * max(abs(a), abs(b))
