"""CPU twins of ``omnibal_kernels.ops.unpad``: same names, arguments and results, vectorized torch.

A boolean ``(B, S)`` prefix mask selects the valid tokens in row-major order, which is exactly the packed
order, so one masked gather (``unpad``) or one masked scatter (``pad``) does the work; torch's autograd
covers both. No triton is imported here.
"""

from __future__ import annotations

import torch

from .._checks import check_cpu_tensor
from .._contracts.segments import LengthsLike
from .._contracts.unpad import (
    PackedTokens,
    check_attention_mask,
    check_packed,
    check_padded,
    mask_segments,
    pad_segments,
    unpad_segments,
)


def _prefix_mask(cu_seqlens: torch.Tensor, padded_len: int) -> torch.Tensor:
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.arange(padded_len)[None, :] < lens[:, None]


def unpad(
    padded: torch.Tensor,
    seq_lens: LengthsLike | None = None,
    *,
    cu_seqlens: LengthsLike | None = None,
    total_tokens: int | None = None,
) -> torch.Tensor:
    """``padded (B, S, *rest)`` + lengths -> ``packed (T, *rest)``; see ``omnibal_kernels.ops.unpad.unpad``."""
    fn = "unpad"
    padded = check_padded(padded, fn)
    check_cpu_tensor(fn, padded)
    seg = unpad_segments(padded, seq_lens, cu_seqlens, total_tokens, fn)
    return padded[_prefix_mask(seg.cu_seqlens, padded.shape[1])]


def pad(
    packed: torch.Tensor,
    seq_lens: LengthsLike | None = None,
    *,
    cu_seqlens: LengthsLike | None = None,
    padded_len: int | None = None,
    fill_value: float | int | bool = 0,
) -> torch.Tensor:
    """``packed (T, *rest)`` + lengths -> ``(B, S, *rest)``; see ``omnibal_kernels.ops.unpad.pad``."""
    fn = "pad"
    packed = check_packed(packed, fn)
    check_cpu_tensor(fn, packed)
    seg = pad_segments(packed, seq_lens, cu_seqlens, padded_len, fill_value, fn)
    if padded_len is None:
        padded_len = seg.max_seqlen if seg.max_seqlen is not None else 0
    padded_len = int(padded_len)
    out = torch.full((seg.batch, padded_len, *packed.shape[1:]), fill_value, dtype=packed.dtype)
    return out.index_put((_prefix_mask(seg.cu_seqlens, padded_len),), packed)


def unpad_from_mask(padded: torch.Tensor, attention_mask: torch.Tensor) -> PackedTokens:
    """``unpad`` with lengths from a right-padded ``(B, S)`` mask; see ``omnibal_kernels.ops.unpad``."""
    fn = "unpad_from_mask"
    padded = check_padded(padded, fn)
    check_cpu_tensor(fn, padded)
    mask = check_attention_mask(padded, attention_mask, fn)
    seq_lens, cu_seqlens, _, longest = mask_segments(mask, fn)
    return PackedTokens(padded[mask], cu_seqlens, longest, seq_lens)
