"""CPU twin of ``omnibal_kernels.ops.varlen_metadata``: same name, arguments and result, vectorized torch."""
from __future__ import annotations

import torch

from .._contracts.varlen_metadata import VarlenMetadata, check_varlen_args


def varlen_metadata(
    seq_lens: torch.Tensor,
    *,
    total_tokens: int | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> VarlenMetadata:
    """``cu_seqlens``, ``position_ids``, ``seq_idx`` and boundary labels of CPU ``seq_lens``.

    See ``omnibal_kernels.ops.varlen_metadata.varlen_metadata`` for shapes and dtypes.
    """
    fn = "varlen_metadata"
    if isinstance(seq_lens, torch.Tensor) and seq_lens.device.type != "cpu":
        raise ValueError(f"{fn}: the CPU twin needs CPU tensors, got a tensor on {seq_lens.device}")
    total = check_varlen_args(seq_lens, total_tokens, labels, ignore_index, fn)
    lens = seq_lens.long()
    batch = lens.numel()
    cu = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=cu[1:])
    seq_idx = torch.repeat_interleave(torch.arange(batch), lens, output_size=total)
    position_ids = torch.arange(total, dtype=torch.int64) - cu[seq_idx]
    labels_out = None
    if labels is not None:
        labels_out = labels.clone(memory_format=torch.contiguous_format)
        starts = cu[:-1][lens > 0]
        labels_out.view(-1)[starts] = ignore_index
    return VarlenMetadata(cu.to(torch.int32), position_ids, seq_idx.to(torch.int32), labels_out)
