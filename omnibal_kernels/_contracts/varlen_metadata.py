"""The contract of ``varlen_metadata``: argument checks and the result type, shared by the Triton op
(:mod:`omnibal_kernels.ops.varlen_metadata`) and its CPU twin (:mod:`omnibal_kernels.cpu.varlen_metadata`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._csr import check_int32_total
from .segments import check_host_lengths, check_total_tokens

__all__ = ["VarlenMetadata", "check_varlen_args"]


class VarlenMetadata(NamedTuple):
    """What ``varlen_metadata`` returns."""

    cu_seqlens: torch.Tensor  # int32 (B + 1,)
    position_ids: torch.Tensor  # int64 (T,), restarting at 0 in every sequence
    seq_idx: torch.Tensor  # int32 (T,), the sequence each token belongs to
    labels: torch.Tensor | None  # the input labels with ignore_index on each sequence's first token


def check_varlen_args(
    seq_lens: object,
    total_tokens: int | None,
    labels: object,
    ignore_index: object,
    fn: str,
) -> int:
    """Checks of ``varlen_metadata``'s arguments; returns the total token count.

    Everything is checked for CPU ``seq_lens``. For device ``seq_lens`` the total comes from
    ``total_tokens``, else from ``labels.numel()``, else from one host sync that also checks the lengths.
    """
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"{fn}: seq_lens must be a torch.Tensor, got {type(seq_lens).__name__}")
    if seq_lens.dim() != 1:
        raise ValueError(f"{fn}: seq_lens must be 1-D, got shape {tuple(seq_lens.shape)}")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: seq_lens must have dtype torch.int32 or torch.int64, got {seq_lens.dtype}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{fn}: ignore_index must be an int, got {type(ignore_index).__name__}")
    total_tokens = check_total_tokens(total_tokens, fn)
    if labels is not None:
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{fn}: labels must be a torch.Tensor or None, got {type(labels).__name__}")
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
            raise TypeError(f"{fn}: labels must hold integers, got dtype {labels.dtype}")
        if not (labels.dim() == 1 or (labels.dim() == 2 and labels.shape[0] == 1)):
            raise ValueError(f"{fn}: labels must be (T,) or (1, T), got shape {tuple(labels.shape)}")
        if labels.device != seq_lens.device:
            raise ValueError(f"{fn}: labels are on {labels.device} but seq_lens on {seq_lens.device}")
        if total_tokens is not None and labels.numel() != total_tokens:
            raise ValueError(f"{fn}: labels hold {labels.numel()} tokens but total_tokens={total_tokens}")
        total_tokens = labels.numel()
    if seq_lens.device.type == "cpu":
        lens = seq_lens.numpy().astype(np.int64)
        check_host_lengths(lens, fn, None)
        total = int(lens.sum())
        if total_tokens is not None and total_tokens != total:
            what = "labels hold" if labels is not None else "total_tokens is"
            raise ValueError(f"{fn}: {what} {total_tokens} tokens but seq_lens add up to {total}")
        return total
    if total_tokens is not None:
        return total_tokens
    if seq_lens.numel() == 0:
        return 0
    # the one host sync of this path: total and shortest length together
    stats = torch.stack([seq_lens.sum(dtype=torch.int64), seq_lens.min().long()])
    total, shortest = (int(v) for v in stats.cpu())
    if shortest < 0:
        raise ValueError(f"{fn}: seq_lens holds a negative length ({shortest})")
    check_int32_total("cu_seqlens", total, where=fn)
    return total
