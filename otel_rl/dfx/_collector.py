"""StepStats: the per-step collector every DFX helper writes through.

Helpers that read tensors compute their small results (NaN counts, mask sums, statistics,
checksums) on the tensor's own device and queue them here with a callback. ``flush()`` then
concatenates everything queued on one device and moves it to the host in a single
``.cpu()`` call, and runs the callbacks with plain floats / numpy arrays. So a training step
pays at most one device-to-host transfer per device for all of DFX, at a point the trainer
chooses (the end of the step), instead of one hidden synchronize per metric.

Host values (numpy arrays, numbers, Python lists) are queued the same way and cost no transfer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import otel_rl.dfx._tensors as T
from otel_rl.reporting import ReportOnce

logger = logging.getLogger("otel_rl")

OnReady = Callable[[list[Any]], None]


@dataclass
class _Deferred:
    """One helper's queued values and what to do with them once they are on the host."""

    on_ready: OnReady
    # per value: ("host", value) or ("device", device key, offset, length, was_scalar)
    slots: list[tuple] = field(default_factory=list)


class StepStats:
    """Collects a step's DFX values and records them with one batched device-to-host transfer.

    Create one per trainer (it is reused step after step) and call ``flush()`` once per step,
    inside ``tel.step(...)``, after the step's helpers ran::

        stats = dfx.StepStats(tel)
        for step in ...:
            with tel.step(step):
                ...
                dfx.count_nonfinite(stats, {"old_log_probs": old_logp})
                dfx.response_mask_ratio(stats, "compute_log_probs", mask)
                stats.flush()

    ``transfers`` counts the batched reads ``flush()`` made (one per device that had values).
    """

    def __init__(self, tel: Any) -> None:
        self.tel = tel
        self.transfers = 0
        self._deferred: list[_Deferred] = []
        self._device_parts: dict[Any, list[Any]] = {}
        self._device_sizes: dict[Any, int] = {}
        self._hooks: list[Callable[[], None]] = []
        self._report_once = ReportOnce(logger)

    # -- queueing -------------------------------------------------------------------------
    def defer(self, values: Sequence[Any], on_ready: OnReady) -> None:
        """Queue ``values`` (torch tensors on any device, numpy arrays, numbers); at ``flush()``
        ``on_ready`` gets them in order as host values: a float for a 0-d tensor or a number,
        a 1-D float64 numpy array for anything with dimensions."""
        item = _Deferred(on_ready)
        for value in values:
            if T.is_torch(value):
                item.slots.append(self._queue_on_device(value))
            elif isinstance(value, (int, float)):
                item.slots.append(("host", float(value)))
            else:
                arr = np.asarray(value, dtype=np.float64)
                item.slots.append(("host", float(arr) if arr.ndim == 0 else arr.reshape(-1)))
        self._deferred.append(item)

    def _queue_on_device(self, value: Any) -> tuple:
        torch = T.loaded_torch()
        value = value.detach()
        key = value.device
        dtype = torch.float32 if key.type == "mps" else torch.float64
        flat = value.reshape(-1).to(dtype)
        parts = self._device_parts.setdefault(key, [])
        offset = self._device_sizes.get(key, 0)
        parts.append(flat)
        self._device_sizes[key] = offset + flat.shape[0]
        return ("device", key, offset, flat.shape[0], value.dim() == 0)

    def on_flush(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` at every ``flush()``, before the queued values are read (timers use it)."""
        self._hooks.append(hook)

    # -- recording ------------------------------------------------------------------------
    def record(self, metric: str, value: Any, attributes: Mapping[str, Any] | None = None) -> None:
        """Record a registry metric now (host value): gauge set, histogram array, counter add."""
        self.tel.record(metric, value, attributes)

    def add(self, metric: str, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a registry counter now. Adding 0 creates the series, so a clean run shows 0."""
        self.tel.add(metric, amount, attributes)

    def report_once(self, key: str, message: str, *args: Any, level: int = logging.INFO) -> None:
        """Log a message the first time ``key`` is seen (absent probes, unknown devices)."""
        self._report_once(key, message, *args, level=level)

    # -- flushing -------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """How many helper results wait for ``flush()``."""
        return len(self._deferred)

    def flush(self) -> int:
        """Move everything queued to the host (one ``.cpu()`` per device) and record it.

        Returns the number of batched reads made (0 when nothing was queued on a device).
        A callback that fails is reported once and never reaches the training loop.
        """
        for hook in self._hooks:
            self._safely(hook)
        deferred, self._deferred = self._deferred, []
        host = self._read_devices()
        for item in deferred:
            values = [self._resolve(slot, host) for slot in item.slots]
            self._safely(lambda: item.on_ready(values))
        return len(host)

    def _read_devices(self) -> dict[Any, np.ndarray]:
        host: dict[Any, np.ndarray] = {}
        for key, parts in self._device_parts.items():  # device parts exist only where torch does
            flat = parts[0] if len(parts) == 1 else T.loaded_torch().cat(parts)
            host[key] = flat.cpu().numpy()  # the one transfer for this device
            self.transfers += 1
        self._device_parts, self._device_sizes = {}, {}
        return host

    @staticmethod
    def _resolve(slot: tuple, host: dict[Any, np.ndarray]) -> Any:
        if slot[0] == "host":
            return slot[1]
        _, key, offset, length, was_scalar = slot
        chunk = host[key][offset : offset + length]
        return float(chunk[0]) if was_scalar else chunk.astype(np.float64, copy=False)

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # telemetry must never break training
            self.report_once(
                f"flush:{type(exc).__name__}:{exc}", "otel-rl dfx: a metric could not be recorded: %r", exc, level=logging.WARNING
            )
