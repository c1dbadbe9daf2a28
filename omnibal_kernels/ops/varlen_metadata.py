"""Varlen metadata from per-sequence lengths on the device, in one kernel launch.

From ``seq_lens: (B,)`` (int32/int64) builds ``cu_seqlens`` int32 ``(B + 1,)`` starting at 0,
``position_ids`` int64 ``(T,)`` restarting at 0 in every sequence, ``seq_idx`` int32 ``(T,)`` (the sequence
of each token) and, given ``labels``, a copy with ``ignore_index`` on the first token of every sequence, so
that the shifted next-token loss never predicts across a boundary. ``T`` is the total token count: pass
it (or ``labels``, whose length is it) to keep the host out of the loop.

One program per (sequence, split): it sums the lengths before its sequence (the prefix sum, read from L2;
``B`` is in the thousands at most) and writes a strided share of its sequence's tokens, so long sequences
are spread over several programs.

Reference: ``omnibal_kernels.testing.varlen_metadata_reference``; CPU twin:
``omnibal_kernels.cpu.varlen_metadata``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_backend, use_cpu_twin
from .._contracts.varlen_metadata import VarlenMetadata, check_varlen_args
from . import _launch

# tokens per inner step of one program: 1024 int64 positions = 8 KiB of stores per step
BLOCK_T = 1024
# lengths summed per step of the prefix sum
BLOCK_B = 1024
NUM_WARPS = 4
# programs per sequence are capped so grid axis 1 stays far under its 65535 limit
MAX_SPLIT = 1024


@triton.jit
def _varlen_metadata_kernel(
    # pointers: lengths (batch,), labels in/out (total_tokens,), outputs
    seq_lens_ptr,
    labels_ptr,
    cu_seqlens_ptr,
    position_ids_ptr,
    seq_idx_ptr,
    labels_out_ptr,
    # sizes and values
    total_tokens,
    ignore_index,
    # meta
    HAS_LABELS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)

    # start of sequence b = sum of the lengths before it; int32 is enough because the total fits
    # cu_seqlens (checked on the host), and keeps every loop bound below one integer type
    acc = tl.zeros([BLOCK_B], dtype=tl.int32)
    for i0 in range(0, b, BLOCK_B):
        idx = i0 + tl.arange(0, BLOCK_B)
        acc += tl.load(seq_lens_ptr + idx, mask=idx < b, other=0).to(tl.int32)
    start = tl.sum(acc, axis=0)
    length = tl.load(seq_lens_ptr + b).to(tl.int32)

    if split == 0:
        tl.store(cu_seqlens_ptr + b + 1, start + length)
        if b == 0:
            tl.store(cu_seqlens_ptr, 0)

    # this program's share of the sequence: blocks split, split + n_split, ...
    for p0 in range(split * BLOCK_T, length, n_split * BLOCK_T):
        pos = p0 + tl.arange(0, BLOCK_T)
        tok = start + pos
        # stores past total_tokens are dropped, so a wrong total cannot write out of bounds
        ok = (pos < length) & (tok < total_tokens)
        tl.store(position_ids_ptr + tok, pos, mask=ok)
        tl.store(seq_idx_ptr + tok, tl.zeros([BLOCK_T], dtype=tl.int32) + b, mask=ok)
        if HAS_LABELS:
            lab = tl.load(labels_ptr + tok, mask=ok)
            lab = tl.where(pos == 0, ignore_index, lab)
            tl.store(labels_out_ptr + tok, lab, mask=ok)


def launch_varlen_metadata(
    seq_lens: torch.Tensor,
    total_tokens: int,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> VarlenMetadata:
    """Kernel call without value checks; ``seq_lens`` is 1-D contiguous int32/int64 on the kernel's device."""
    _launch.check_launchable(seq_lens, "varlen_metadata")
    device = seq_lens.device
    batch = seq_lens.numel()
    if batch == 0:
        cu_seqlens = torch.zeros(1, dtype=torch.int32, device=device)
        empty = labels.clone() if labels is not None else None
        no_tokens = (_launch.alloc((0,), torch.int64, device), _launch.alloc((0,), torch.int32, device))
        return VarlenMetadata(cu_seqlens, *no_tokens, empty)
    # the kernel writes every element of these (cu_seqlens[0] included)
    cu_seqlens = _launch.alloc((batch + 1,), torch.int32, device)
    position_ids = _launch.alloc((total_tokens,), torch.int64, device)
    seq_idx = _launch.alloc((total_tokens,), torch.int32, device)
    labels_out = None if labels is None else _launch.alloc(tuple(labels.shape), labels.dtype, device)
    labels_flat = None if labels is None else labels.reshape(-1).contiguous()
    # splits sized for the average sequence: about one BLOCK_T step per program
    n_split = max(1, min(MAX_SPLIT, triton.cdiv(triton.cdiv(max(total_tokens, 1), batch), BLOCK_T)))
    _varlen_metadata_kernel[(batch, n_split)](
        seq_lens_ptr=seq_lens,
        labels_ptr=labels_flat if labels_flat is not None else seq_idx,
        cu_seqlens_ptr=cu_seqlens,
        position_ids_ptr=position_ids,
        seq_idx_ptr=seq_idx,
        labels_out_ptr=labels_out if labels_out is not None else seq_idx,
        total_tokens=total_tokens,
        ignore_index=ignore_index,
        HAS_LABELS=labels is not None,
        BLOCK_B=BLOCK_B,
        BLOCK_T=BLOCK_T,
        num_warps=NUM_WARPS,
    )
    return VarlenMetadata(cu_seqlens, position_ids, seq_idx, labels_out)


def varlen_metadata(
    seq_lens: torch.Tensor,
    *,
    total_tokens: int | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    backend: str = "auto",
) -> VarlenMetadata:
    """Build ``cu_seqlens``, ``position_ids``, ``seq_idx`` and boundary labels from ``seq_lens``.

    Args:
        seq_lens: ``(B,)`` int32/int64 tensor, lengths >= 0 (zero-length sequences are allowed).
        total_tokens: ``T = seq_lens.sum()``. When None, ``labels.numel()`` is used if labels are given,
            else it is read back with one host sync (which also checks the lengths). A value passed in is
            trusted on CUDA (checking it would sync); stores past ``T`` are dropped, never out of bounds.
        labels: ``(T,)`` or ``(1, T)`` integer tensor on the device of ``seq_lens``, or None.
        ignore_index: written over the first label of every sequence.
        backend: ``"auto"`` (CUDA -> Triton kernel, CPU -> ``omnibal_kernels.cpu.varlen_metadata``),
            ``"triton"`` or ``"cpu"``.

    Returns:
        ``VarlenMetadata(cu_seqlens int32 (B + 1,), position_ids int64 (T,), seq_idx int32 (T,),
        labels (shape and dtype of the input labels) or None)``.
    """
    fn = "varlen_metadata"
    check_backend(fn, backend)
    total_tokens = check_varlen_args(seq_lens, total_tokens, labels, ignore_index, fn)
    if use_cpu_twin(fn, backend, seq_lens):
        from ..cpu.varlen_metadata import varlen_metadata as varlen_metadata_cpu

        return varlen_metadata_cpu(seq_lens, total_tokens=total_tokens, labels=labels, ignore_index=ignore_index)
    return launch_varlen_metadata(seq_lens.contiguous(), total_tokens, labels, ignore_index)
