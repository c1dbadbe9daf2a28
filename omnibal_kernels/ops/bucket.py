"""Stable counting sort of per-image patch counts into buckets, on the GPU.

Three steps, as a counting sort does them: (1) ``_bucket_hist_kernel`` finds each item's bucket by binary
search in ``boundaries`` (bucket = number of boundaries ``<=`` the count), its rank among the earlier items of
the same bucket inside its block, and the block's histogram; (2) an exclusive scan (``torch.cumsum``) over the
histogram laid out bucket-major, block-minor gives every (bucket, block) its first output slot; (3)
``_bucket_scatter_kernel`` writes ``perm[base[bucket, block] + rank] = index``. No atomics: the result is
deterministic and stable. Inputs int64 on one CUDA device; outputs ``perm`` int64 ``(N,)``, ``offsets`` int64
``(K + 1,)``, ``bucket_ids`` int32 ``(N,)``. Matches ``omnibal_kernels.testing.references.bucket_sort_reference``
exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._contracts.bucket import PatchBuckets, check_sort_tensors
from . import _launch

# Items per program. The in-block rank compares all pairs (BLOCK x BLOCK booleans); 128 keeps that at 128
# values per thread with 4 warps, and the histogram at K * N / 128 int32 words.
BLOCK = 128


@triton.jit
def _bucket_of(x, bnd_ptr, num_bnd, mask, STEPS: tl.constexpr):
    """Number of boundaries <= x by binary search (STEPS = bit length of num_bnd)."""
    lo = tl.zeros_like(x)
    hi = tl.zeros_like(x) + num_bnd
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(bnd_ptr + mid, mask=mask & active, other=0)
        right = active & (v <= x)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    return lo


@triton.jit(do_not_specialize=["n", "num_bnd", "num_blocks"])
def _bucket_hist_kernel(
    # pointers: counts and boundaries in; bucket ids, in-block ranks and (bucket, block) histogram out
    counts_ptr,
    bnd_ptr,
    bucket_ptr,
    rank_ptr,
    hist_ptr,
    # sizes
    n,
    num_bnd,
    num_blocks,
    # constexprs
    STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    blk = tl.program_id(0)
    idx = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = tl.load(counts_ptr + idx, mask=mask, other=0)
    b = _bucket_of(x, bnd_ptr, num_bnd, mask, STEPS).to(tl.int32)
    b = tl.where(mask, b, -1)  # masked lanes match no real bucket
    lane = tl.arange(0, BLOCK)
    same = b[:, None] == b[None, :]
    rank = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    later = tl.sum((same & (lane[None, :] > lane[:, None])).to(tl.int32), axis=1)
    tl.store(bucket_ptr + idx, b, mask=mask)
    tl.store(rank_ptr + idx, rank, mask=mask)
    # the last item of each bucket in this block writes the block's count for that bucket
    slot = b.to(tl.int64) * num_blocks + blk
    tl.store(hist_ptr + slot, rank + 1, mask=mask & (later == 0))


@triton.jit(do_not_specialize=["n", "num_blocks"])
def _bucket_scatter_kernel(
    # pointers
    bucket_ptr,
    rank_ptr,
    base_ptr,
    perm_ptr,
    # sizes
    n,
    num_blocks,
    # constexprs
    BLOCK: tl.constexpr,
):
    blk = tl.program_id(0)
    idx = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    b = tl.load(bucket_ptr + idx, mask=mask, other=0)
    rank = tl.load(rank_ptr + idx, mask=mask, other=0)
    base = tl.load(base_ptr + b.to(tl.int64) * num_blocks + blk, mask=mask, other=0)
    tl.store(perm_ptr + base + rank, idx, mask=mask)


def bucket_sort(counts: torch.Tensor, boundaries: torch.Tensor) -> PatchBuckets:
    """Stable counting sort of ``counts`` ``(N,)`` into ``len(boundaries) + 1`` buckets (see the module doc).

    ``boundaries``: ``(K - 1,)`` non-decreasing, same device. Returns
    :class:`~omnibal_kernels.PatchBuckets` of torch tensors.
    """
    counts, boundaries = check_sort_tensors(counts, boundaries)
    _launch.check_launchable(counts, "bucket_sort")
    n = counts.numel()
    k = boundaries.numel() + 1
    num_blocks = max(1, triton.cdiv(n, BLOCK))
    device = counts.device
    bucket_ids = _launch.alloc((n,), torch.int32, device)
    rank = _launch.alloc((n,), torch.int32, device)
    # a (bucket, block) pair without items gets no store: its count stays 0
    hist = torch.zeros(k * num_blocks, dtype=torch.int64, device=device)
    perm = _launch.alloc((n,), torch.int64, device)
    if n:
        _bucket_hist_kernel[(num_blocks,)](
            counts_ptr=counts,
            bnd_ptr=boundaries,
            bucket_ptr=bucket_ids,
            rank_ptr=rank,
            hist_ptr=hist,
            n=n,
            num_bnd=k - 1,
            num_blocks=num_blocks,
            STEPS=(k - 1).bit_length(),
            BLOCK=BLOCK,
        )
    # exclusive scan, bucket-major: base[b, blk] = items before (b, blk)
    inclusive = torch.cumsum(hist, 0)
    base = inclusive - hist
    offsets = _launch.alloc((k + 1,), torch.int64, device)
    offsets[:k] = base.view(k, num_blocks)[:, 0]
    offsets[k] = n
    if n:
        _bucket_scatter_kernel[(num_blocks,)](
            bucket_ptr=bucket_ids,
            rank_ptr=rank,
            base_ptr=base,
            perm_ptr=perm,
            n=n,
            num_blocks=num_blocks,
            BLOCK=BLOCK,
        )
    return PatchBuckets(perm, offsets, bucket_ids, boundaries)
