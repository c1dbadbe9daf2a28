"""The contract of the patch-count bucket sort: argument checks and the result type, shared by the Triton op
(:mod:`omnibal_kernels.ops.bucket`), its CPU twin (:mod:`omnibal_kernels.cpu.bucket`) and the public
:func:`omnibal_kernels.vision.bucket_by_patches`.

Both implementations take int64 ``counts`` ``(N,)`` and non-decreasing int64 ``boundaries`` ``(K - 1,)``;
:func:`host_bucket_args` and :func:`device_bucket_args` turn the public arguments into these, on the host
(numpy) or on the counts' device (torch).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._checks import as_int_array

__all__ = ["PatchBuckets", "check_sort_tensors", "device_bucket_args", "host_bucket_args"]


class PatchBuckets(NamedTuple):
    """Images grouped by patch count (numpy arrays, or torch tensors on the input's device)."""

    perm: Any
    """``(N,)`` int64: image indices bucket by bucket, original order inside each bucket (stable)"""
    offsets: Any
    """``(K + 1,)`` int64: bucket ``b`` holds ``perm[offsets[b]:offsets[b + 1]]``; ``offsets[-1] == N``"""
    bucket_ids: Any
    """``(N,)`` int32: bucket of each image, in the original order"""
    boundaries: Any
    """``(K - 1,)`` int64: bucket ``b >= 1`` holds counts ``>= boundaries[b - 1]`` and ``< boundaries[b]``"""


def host_bucket_args(counts: Any, boundaries: Any, num_buckets: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, boundaries)`` as int64 numpy arrays: checked counts and the given, quantile or distinct-count
    boundaries (``num_buckets`` already checked)."""
    c = as_int_array(counts, "counts")
    if (c < 0).any():
        i = int(np.flatnonzero(c < 0)[0])
        raise ValueError(f"counts[{i}] = {int(c[i])} is negative")
    if boundaries is not None:
        bnd = as_int_array(boundaries, "boundaries") if np.size(boundaries) else np.zeros(0, np.int64)
        if (np.diff(bnd) < 0).any():
            raise ValueError("boundaries must be non-decreasing")
    elif num_buckets is not None:
        ranks = np.arange(1, num_buckets) * c.shape[0] // num_buckets
        bnd = np.sort(c)[ranks] if c.shape[0] else np.zeros(num_buckets - 1, np.int64)
    else:
        bnd = np.unique(c)[1:]
    return c, bnd


def device_bucket_args(counts: Any, boundaries: Any, num_buckets: int | None) -> tuple[Any, Any]:
    """:func:`host_bucket_args` for a torch ``counts`` tensor, computed on its device (the Triton path)."""
    import torch

    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"bucket_by_patches: backend='triton' needs a torch tensor, got {type(counts).__name__}")
    if counts.dim() != 1:
        raise ValueError(f"counts must be 1-D, got shape {tuple(counts.shape)}")
    if counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise TypeError(f"counts must be an integer tensor, got {counts.dtype}")
    c = counts.to(torch.int64)
    if c.numel() and bool((c < 0).any()):
        raise ValueError(f"counts[{int(torch.nonzero(c < 0)[0, 0])}] is negative")
    if boundaries is not None:
        bnd = torch.as_tensor(boundaries, device=c.device).to(torch.int64).reshape(-1)
        if bnd.numel() > 1 and bool((bnd[1:] < bnd[:-1]).any()):
            raise ValueError("boundaries must be non-decreasing")
    elif num_buckets is not None:
        ranks = torch.arange(1, num_buckets, device=c.device) * c.numel() // num_buckets
        if c.numel():
            bnd = torch.sort(c).values[ranks]
        else:
            bnd = torch.zeros(num_buckets - 1, dtype=torch.int64, device=c.device)
    else:
        bnd = torch.unique(c)[1:]
    return c, bnd


def check_sort_tensors(counts: Any, boundaries: Any) -> tuple[Any, Any]:
    """The Triton sort's inputs: 1-D torch tensors on one device, as contiguous int64."""
    import torch

    if not isinstance(counts, torch.Tensor) or not isinstance(boundaries, torch.Tensor):
        raise TypeError("counts and boundaries must be torch tensors")
    if counts.device != boundaries.device:
        raise ValueError(f"counts on {counts.device} but boundaries on {boundaries.device}")
    if counts.dim() != 1 or boundaries.dim() != 1:
        raise ValueError(f"counts {tuple(counts.shape)} and boundaries {tuple(boundaries.shape)} must be 1-D")
    return counts.to(torch.int64).contiguous(), boundaries.to(torch.int64).contiguous()
