"""The contract of ``unpad`` / ``pad`` / ``unpad_from_mask``: argument checks and the result type, shared by
the Triton op (:mod:`omnibal_kernels.ops.unpad`) and its CPU twin (:mod:`omnibal_kernels.cpu.unpad`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._csr import check_int32_total
from .segments import LengthsLike, Segments, batch_from, is_host, resolve_segments

__all__ = [
    "MaskSegments",
    "PackedTokens",
    "check_attention_mask",
    "check_fill_value",
    "check_packed",
    "check_padded",
    "mask_segments",
    "pad_segments",
    "unpad_segments",
]


def check_padded(padded: object, fn: str) -> torch.Tensor:
    """``padded`` is a tensor of at least 2 dims ``(batch, padded_len, ...)``."""
    if not isinstance(padded, torch.Tensor):
        raise TypeError(f"{fn}: padded must be a torch.Tensor, got {type(padded).__name__}")
    if padded.dim() < 2:
        raise ValueError(f"{fn}: padded must be (batch, padded_len, ...), got shape {tuple(padded.shape)}")
    return padded


def check_packed(packed: object, fn: str) -> torch.Tensor:
    """``packed`` is a tensor of at least 1 dim ``(total_tokens, ...)``."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{fn}: packed must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() < 1:
        raise ValueError(f"{fn}: packed must be (total_tokens, ...), got a 0-d tensor")
    return packed


def check_fill_value(fill_value: object, dtype: torch.dtype, fn: str) -> None:
    """A Python number that ``dtype`` holds exactly (no silent truncation of 0.5 into an integer tensor)."""
    if not isinstance(fill_value, (bool, int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: fill_value must be a Python number, got {type(fill_value).__name__}")
    if not (dtype.is_floating_point or dtype.is_complex) and isinstance(fill_value, (float, np.floating)):
        if not float(fill_value).is_integer():
            raise TypeError(f"{fn}: fill_value {fill_value} does not fit the integer dtype {dtype}")


class PackedTokens(NamedTuple):
    """What ``unpad_from_mask`` returns."""

    packed: torch.Tensor  # (total_tokens, *rest)
    cu_seqlens: torch.Tensor  # int32 (B + 1,), on the device of the data
    max_seqlen: int  # longest row
    seq_lens: torch.Tensor  # int32 (B,), on the device of the data


def unpad_segments(
    padded: torch.Tensor,
    seq_lens: LengthsLike | None,
    cu_seqlens: LengthsLike | None,
    total_tokens: int | None,
    fn: str,
) -> Segments:
    """Checks of ``unpad``'s lengths against ``padded (B, S, ...)``; the resulting ``Segments``."""
    return resolve_segments(
        seq_lens,
        cu_seqlens,
        total_tokens,
        batch=padded.shape[0],
        padded_len=padded.shape[1],
        device=padded.device,
        fn=fn,
    )


def pad_segments(
    packed: torch.Tensor,
    seq_lens: LengthsLike | None,
    cu_seqlens: LengthsLike | None,
    padded_len: int | None,
    fill_value: object,
    fn: str,
) -> Segments:
    """Checks of ``pad``'s lengths, ``padded_len`` and ``fill_value``; the resulting ``Segments``."""
    check_fill_value(fill_value, packed.dtype, fn)
    if padded_len is not None and (
        isinstance(padded_len, bool) or not isinstance(padded_len, (int, np.integer)) or padded_len < 0
    ):
        raise ValueError(f"{fn}: padded_len must be a non-negative int, got {padded_len!r}")
    batch = batch_from(seq_lens, cu_seqlens, fn)
    lengths = seq_lens if seq_lens is not None else cu_seqlens
    seg = resolve_segments(
        seq_lens,
        cu_seqlens,
        None if is_host(lengths) else packed.shape[0],
        batch=batch,
        padded_len=None if padded_len is None else int(padded_len),
        device=packed.device,
        fn=fn,
    )
    if seg.total_tokens != packed.shape[0]:
        raise ValueError(f"{fn}: packed has {packed.shape[0]} rows but the lengths add up to {seg.total_tokens}")
    return seg


def check_attention_mask(padded: torch.Tensor, attention_mask: object, fn: str) -> torch.Tensor:
    """Shape, dtype and device checks of a ``(B, S)`` ``attention_mask``; returns it as bool."""
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"{fn}: attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(padded.shape[:2]):
        raise ValueError(
            f"{fn}: attention_mask has shape {tuple(attention_mask.shape)}, expected {tuple(padded.shape[:2])}"
        )
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"{fn}: attention_mask must be bool or integer, got {attention_mask.dtype}")
    if attention_mask.device != padded.device:
        raise ValueError(f"{fn}: attention_mask is on {attention_mask.device} but padded is on {padded.device}")
    return attention_mask != 0


class MaskSegments(NamedTuple):
    """The segments a right-padded ``(B, S)`` mask describes, on the mask's device."""

    seq_lens: torch.Tensor  # int32 (B,)
    cu_seqlens: torch.Tensor  # int32 (B + 1,)
    total_tokens: int
    max_seqlen: int


def mask_segments(mask: torch.Tensor, fn: str) -> MaskSegments:
    """The segments of a bool ``(B, S)`` right-padded mask.

    Reads the total, the longest row and the first row that is not right-padded in one host transfer.
    """
    batch, padded_len = mask.shape
    seq_lens = mask.sum(1, dtype=torch.int32)
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(seq_lens, 0, dtype=torch.int32, out=cu_seqlens[1:])
    if batch == 0:
        return MaskSegments(seq_lens, cu_seqlens, 0, 0)
    prefix = torch.arange(padded_len, device=mask.device)[None, :] < seq_lens[:, None]
    rows = torch.arange(batch, device=mask.device)
    first_bad = torch.where((mask != prefix).any(1), rows, batch).min()
    stats = torch.stack([seq_lens.sum(dtype=torch.int64), seq_lens.max().long(), first_bad.long()])
    total, longest, first_bad_row = (int(v) for v in stats.cpu())  # the one host sync
    if first_bad_row < batch:
        raise ValueError(f"{fn}: attention_mask row {first_bad_row} is not right-padded (ones, then zeros)")
    check_int32_total("cu_seqlens", total, where=fn)
    return MaskSegments(seq_lens, cu_seqlens, total, longest)
