"""Images grouped by patch count, so a ViT without varlen attention can run each group as one dense batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import check_positive_int, is_tensor, use_cpu_twin
from .._contracts.bucket import PatchBuckets, device_bucket_args, host_bucket_args

__all__ = ["PatchBuckets", "bucket_by_patches"]


def bucket_by_patches(
    counts: Any, boundaries: Any = None, *, num_buckets: int | None = None, backend: str = "auto"
) -> PatchBuckets:
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
            buckets can be empty). With neither, there is one bucket per distinct count, in increasing order.
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
    if not use_cpu_twin("bucket_by_patches", backend, counts):
        from ..ops.bucket import bucket_sort

        return bucket_sort(*device_bucket_args(counts, boundaries, num_buckets))
    from ..cpu.bucket import bucket_sort as bucket_sort_cpu

    out = bucket_sort_cpu(*host_bucket_args(counts, boundaries, num_buckets))
    if is_tensor(counts):
        import torch

        return PatchBuckets(*(torch.from_numpy(np.ascontiguousarray(x)) for x in out))
    return out
