"""The varlen fields of :mod:`omnibal_kernels.cpu.varlen_metadata` fused in one numba pass over the tokens.

:func:`varlen_fields_into` takes the arguments of :func:`omnibal_kernels.cpu.varlen_metadata.fill_varlen_fields`
as numpy arrays and writes the same values (``pack_batch``'s ``backend="numba"``). It is compiled on the first
call in a process, or loaded from numba's on-disk cache (``cache=True``); :func:`warmup` does it ahead of time,
e.g. in the main process before DataLoader workers fork.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def varlen_fields_into(
    seg_lens: np.ndarray,
    num_samples: int,
    mask_first_label: bool,
    ignore_index: int,
    labels: np.ndarray,
    position_ids: np.ndarray,
    seq_idx: np.ndarray,
    cu_seqlens: np.ndarray,
    seq_lens: np.ndarray,
) -> int:
    """Fill the per-token and per-segment fields in place; return the longest segment length.

    seg_lens: (num_segments,) int64, the sample lengths followed by any padding segment.
    num_samples: segments ``[0, num_samples)`` are samples whose first label is masked.
    labels: (total_tokens,) int64, written only at the first token of each sample segment.
    position_ids: (total_tokens,) int64; seq_idx: (total_tokens,) int32.
    cu_seqlens: (S + 1,) int32 and seq_lens: (S,) int32 with ``S >= num_segments``; entries past the
    real segments describe zero-length segments at the end.
    """
    num_segments = seg_lens.shape[0]
    start = 0
    max_len = 0
    cu_seqlens[0] = 0
    for s in range(num_segments):
        n = seg_lens[s]
        end = start + n
        # Loops over a contiguous slice vectorize; indexing the whole array with start + j does not, and
        # runs several times slower.
        pos = position_ids[start:end]
        for j in range(n):
            pos[j] = j
        idx = seq_idx[start:end]
        for j in range(n):
            idx[j] = s
        if mask_first_label and s < num_samples and n > 0:
            labels[start] = ignore_index
        seq_lens[s] = n
        cu_seqlens[s + 1] = end
        if n > max_len:
            max_len = n
        start = end
    for s in range(num_segments, seq_lens.shape[0]):
        seq_lens[s] = 0
        cu_seqlens[s + 1] = start
    return max_len


def warmup() -> None:
    """Compile (or load from numba's cache) the kernel for the dtypes ``pack_batch`` passes."""
    varlen_fields_into(
        np.array([2, 1], dtype=np.int64),
        1,
        True,
        -100,
        np.zeros(3, dtype=np.int64),
        np.empty(3, dtype=np.int64),
        np.empty(3, dtype=np.int32),
        np.empty(4, dtype=np.int32),
        np.empty(3, dtype=np.int32),
    )
