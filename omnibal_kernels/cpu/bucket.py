"""Numba twin of :mod:`omnibal_kernels.ops.bucket`: stable counting sort of patch counts into buckets.

Same name, arguments and outputs as the Triton op; matches
``omnibal_kernels.testing.references.bucket_sort_reference`` exactly.
"""

from __future__ import annotations

import numba
import numpy as np

from .._contracts.bucket import PatchBuckets


@numba.njit(nogil=True)
def _bucket_sort(
    counts: np.ndarray, boundaries: np.ndarray, perm: np.ndarray, offsets: np.ndarray, bucket_ids: np.ndarray
) -> None:
    n = counts.shape[0]
    k = boundaries.shape[0] + 1
    hist = np.zeros(k, dtype=np.int64)
    # histogram: bucket = number of boundaries <= count
    for i in range(n):
        b = np.searchsorted(boundaries, counts[i], side="right")
        bucket_ids[i] = b
        hist[b] += 1
    # exclusive scan
    total = 0
    for b in range(k):
        offsets[b] = total
        total += hist[b]
    offsets[k] = total
    # stable scatter: a running cursor per bucket
    cursor = offsets[:k].copy()
    for i in range(n):
        b = bucket_ids[i]
        perm[cursor[b]] = i
        cursor[b] += 1


def bucket_sort(counts: np.ndarray, boundaries: np.ndarray) -> PatchBuckets:
    """Stable counting sort of ``counts`` ``(N,)`` int64 into ``len(boundaries) + 1`` buckets.

    Bucket of a count = number of ``boundaries`` (``(K - 1,)`` int64, non-decreasing) that are ``<=`` it.
    """
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    boundaries = np.ascontiguousarray(boundaries, dtype=np.int64)
    perm = np.empty(counts.shape[0], dtype=np.int64)
    offsets = np.empty(boundaries.shape[0] + 2, dtype=np.int64)
    bucket_ids = np.empty(counts.shape[0], dtype=np.int32)
    _bucket_sort(counts, boundaries, perm, offsets, bucket_ids)
    return PatchBuckets(perm, offsets, bucket_ids, boundaries)
