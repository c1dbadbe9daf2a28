"""Images grouped by patch count, so a ViT without varlen attention can run each group as one dense batch."""
from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import as_int_array, check_positive_int, device_of, is_tensor, use_cpu_twin
from .._varlen import PatchBuckets

__all__ = ["PatchBuckets", "bucket_by_patches"]

def bucket_by_patches(counts: Any, boundaries: Any = None, *, num_buckets: int | None = None,
                      backend: str = "auto") -> PatchBuckets:
    """Group images by patch count with a stable counting sort (histogram, exclusive scan, scatter).

    A ViT without varlen attention can run each bucket as a dense batch; with the default (one bucket per
    distinct count) that batch has no padding at all. A balancer can spread whole buckets over ranks.

    Args:
        counts: ``(N,)`` non-negative patch (or tile) counts per image: list, numpy array or torch tensor.
            CUDA tensors run the Triton op (:mod:`omnibal_kernels.ops.bucket`), everything else the numba
            twin (:mod:`omnibal_kernels.cpu.bucket`).
        boundaries: ``(K - 1,)`` non-decreasing bucket edges: the bucket of a count is the number of
            boundaries ``<=`` it, so bucket 0 is ``[0, boundaries[0])`` and the last is
            ``[boundaries[-1], inf)``.
        num_buckets: instead of ``boundaries``, ``K`` buckets of about equal numbers of images: boundaries
            are the counts at ranks ``k * N // K`` of the sorted counts (equal counts never split, so some
            buckets can be empty).

    With neither, there is one bucket per distinct count, in increasing order.

        backend: ``"auto"`` (CUDA tensors -> Triton, anything else -> numba), ``"triton"`` or ``"cpu"``.

    Returns:
        :class:`PatchBuckets`.

    Raises:
        ValueError: both ``boundaries`` and ``num_buckets``, negative counts, decreasing boundaries.
    """
    if boundaries is not None and num_buckets is not None:
        raise ValueError("give boundaries or num_buckets, not both")
    if num_buckets is not None:
        num_buckets = check_positive_int("num_buckets", num_buckets)
    if not use_cpu_twin(backend, device_of(counts), "bucket_by_patches"):
        import torch

        from ..ops.bucket import bucket_sort as _gpu_sort

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
            sorted_counts = torch.sort(c).values
            ranks = torch.arange(1, num_buckets, device=c.device) * c.numel() // num_buckets
            bnd = sorted_counts[ranks] if c.numel() else torch.zeros(num_buckets - 1, dtype=torch.int64,
                                                                      device=c.device)
        else:
            bnd = torch.unique(c)[1:]
        return _gpu_sort(c, bnd)
    from ..cpu.bucket import bucket_sort as _cpu_sort

    c = as_int_array(counts, "counts")
    if (c < 0).any():
        raise ValueError(f"counts[{int(np.flatnonzero(c < 0)[0])}] = {int(c[np.flatnonzero(c < 0)[0]])} is negative")
    if boundaries is not None:
        bnd = as_int_array(boundaries, "boundaries") if np.size(boundaries) else np.zeros(0, np.int64)
        if (np.diff(bnd) < 0).any():
            raise ValueError("boundaries must be non-decreasing")
    elif num_buckets is not None:
        ranks = np.arange(1, num_buckets) * c.shape[0] // num_buckets
        bnd = np.sort(c)[ranks] if c.shape[0] else np.zeros(num_buckets - 1, np.int64)
    else:
        bnd = np.unique(c)[1:]
    out = _cpu_sort(c, bnd)
    if is_tensor(counts):
        import torch

        return PatchBuckets(*(torch.from_numpy(np.ascontiguousarray(x)) for x in out))
    return out


