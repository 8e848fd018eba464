"""Reductions that work on torch tensors (any device) and on numpy arrays / Python sequences.

A torch input gives a torch result on the same device and never leaves it: nothing here calls
``.item()``, ``.tolist()``, ``.cpu()`` or ``bool(tensor)``. The results are handed to
``StepStats.defer`` and reach the host in the step's single batched transfer. Any other input
is reduced with numpy on the host right away.

torch is never imported here: a torch tensor can only exist when the program imported torch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def torch_module() -> Any | None:
    """The program's torch, if it imported one."""
    return sys.modules.get("torch")


def loaded_torch() -> Any:
    """The program's torch where a torch tensor in hand (or a checked flag) shows it was imported."""
    torch = torch_module()
    assert torch is not None, "torch is not imported"
    return torch


def is_torch(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def host_array(x: Any) -> np.ndarray:
    """A numpy view of a host value (numpy array, list, number). Not for torch tensors."""
    return np.asarray(x)


def shape_of(x: Any) -> tuple[int, ...]:
    """Shape from metadata only (no device access)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = np.shape(x)
    return tuple(int(d) for d in shape)


def numel(x: Any) -> int:
    return int(np.prod(shape_of(x), dtype=np.int64))


def dtype_name(x: Any) -> str:
    """'float32', 'int64', 'bool', ... the same spelling for torch and numpy."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    return str(dtype).removeprefix("torch.")


def _is_floating(x: Any) -> bool:
    if is_torch(x):
        return bool(x.is_floating_point() or x.is_complex())
    return np.issubdtype(host_array(x).dtype, np.inexact)


def nan_inf_counts(x: Any) -> tuple[Any, Any]:
    """Number of NaN and of +-Inf values. Integer and bool data have none (no pass over the data)."""
    if not _is_floating(x):
        return 0, 0
    if is_torch(x):
        x = x.detach()
        torch = loaded_torch()
        count = torch.int32 if x.numel() < 2**31 else torch.int64  # int32 sums are cheaper where they fit
        return x.isnan().sum(dtype=count), x.isinf().sum(dtype=count)
    a = host_array(x)
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())


def total(x: Any) -> Any:
    """Sum of all values: integer / bool data exactly (int64), floats in at least float32."""
    if is_torch(x):
        x = x.detach()
        if x.is_floating_point() and x.element_size() < 4:
            return x.sum(dtype=loaded_torch().float32)  # a float16 sum of a large mask overflows
        return x.sum()
    return float(host_array(x).sum(dtype=np.float64))


def row_sums(x: Any) -> Any:
    """Sum over the last dimension: [B, T] -> [B] (exact for integer / bool masks)."""
    if is_torch(x):
        x = x.detach()
        if x.is_floating_point() and x.element_size() < 4:
            return x.sum(-1, dtype=loaded_torch().float32)
        return x.sum(-1)
    return host_array(x).sum(-1, dtype=np.float64)


def as_vector(x: Any) -> Any:
    """A flat 1-D view (torch stays on its device)."""
    if is_torch(x):
        return x.detach().reshape(-1)
    return host_array(x).reshape(-1).astype(np.float64, copy=False)


def count_not_equal(a: Any, b: Any) -> Any:
    """Positions where two equally long 1-D id sequences differ."""
    if is_torch(a) and is_torch(b) and a.device == b.device:
        return (a.detach().reshape(-1) != b.detach().reshape(-1)).sum()
    if is_torch(a) or is_torch(b):
        raise TypeError("compare ids on one device: both torch tensors on the same device, or both host arrays")
    return int((np.asarray(a).reshape(-1) != np.asarray(b).reshape(-1)).sum())


_weights_cache: dict[tuple[Any, Any, int], tuple[Any, Any]] = {}


def checksum(x: Any) -> Any:
    """A cheap, order-sensitive checksum: sum_i (i+1) * rowsum_i + sum_j (j+1) * colsum_j.

    The tensor is viewed as [d0, rest] in float64 (exact for integer data such as ids and
    masks). Equal data gives equal checksums; permuted rows (samples reordered between stages)
    or shifted columns (tokens shifted within a sample) change it, which a plain sum would not
    see. Computed as two matrix-vector products, X @ 1 and X @ (1..n), and a short dot product:
    BLAS reads the data at memory speed, where a strided column reduction would not.
    """
    if numel(x) == 0:
        return 0.0
    if is_torch(x):
        torch = loaded_torch()
        x = x.detach()
        m = x.reshape(x.shape[0] if x.dim() else 1, -1).to(_float64(x))
        ones, cols = _weights(m.shape[1], m)
        rows = torch.mv(m, ones)
        _, row_weights = _weights(m.shape[0], m)
        return torch.dot(rows, row_weights) + torch.mv(m, cols).sum()
    a = host_array(x)
    m = a.reshape(a.shape[0] if a.ndim else 1, -1).astype(np.float64, copy=False)
    return float(m.sum(1) @ np.arange(1, m.shape[0] + 1) + (m @ np.arange(1, m.shape[1] + 1)).sum())


def _weights(n: int, like: Any) -> tuple[Any, Any]:
    """(ones, 1..n) of like's dtype on like's device, cached: the checksum's weights."""
    key = (like.device, like.dtype, n)
    found = _weights_cache.get(key)
    if found is None:
        torch = loaded_torch()
        if len(_weights_cache) > 64:
            _weights_cache.clear()
        found = _weights_cache[key] = (
            torch.ones(n, dtype=like.dtype, device=like.device),
            torch.arange(1, n + 1, dtype=like.dtype, device=like.device),
        )
    return found


def _float64(x: Any) -> Any:
    """float64, except on devices that lack it (Apple MPS), where float32 is the widest."""
    torch = loaded_torch()
    return torch.float32 if x.device.type == "mps" else torch.float64
