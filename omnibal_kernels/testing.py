"""Plain torch/numpy references shared by tests and benchmarks: slow, simple, obviously correct."""
from __future__ import annotations

from collections.abc import Sequence

import torch

# ------------------------------------------------------------------------------------ pack / unpack


def pack_reference(padded: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
    """``padded (B, S, *rest)`` -> ``(sum(seq_lens), *rest)``: the first ``seq_lens[b]`` rows of each ``b``."""
    rows = [padded[b, : int(n)] for b, n in enumerate(seq_lens)]
    if not rows:
        return padded.new_empty((0, *padded.shape[2:]))
    return torch.cat(rows, dim=0)


def unpack_reference(
    packed: torch.Tensor, seq_lens: Sequence[int], padded_len: int, fill_value: float | int | bool = 0
) -> torch.Tensor:
    """``packed (T, *rest)`` -> ``(B, padded_len, *rest)`` with ``fill_value`` after each sequence."""
    out = torch.full((len(seq_lens), padded_len, *packed.shape[1:]), fill_value, dtype=packed.dtype)
    start = 0
    for b, n in enumerate(seq_lens):
        out[b, : int(n)] = packed[start : start + int(n)]
        start += int(n)
    return out


def unpad_input_reference(
    hidden: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """flash-attention's ``unpad_input`` way: ``(packed, indices, cu_seqlens, max_seqlen)``.

    ``indices`` come from ``nonzero`` and ``max_seqlen`` from ``.item()``: both wait for the device. The
    benchmarks use this as the baseline that ``pack`` must beat.
    """
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden.reshape(hidden.shape[0] * hidden.shape[1], *hidden.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen


def pad_input_reference(packed: torch.Tensor, indices: torch.Tensor, batch: int, padded_len: int) -> torch.Tensor:
    """flash-attention's ``pad_input`` way: scatter ``packed`` rows to ``indices`` of a zero ``(B * S, ...)``."""
    out = packed.new_zeros((batch * padded_len, *packed.shape[1:]))
    out[indices] = packed
    return out.view(batch, padded_len, *packed.shape[1:])


# ---------------------------------------------------------------------------------- varlen metadata


def varlen_metadata_reference(
    seq_lens: Sequence[int], labels: torch.Tensor | None = None, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(cu_seqlens int32, position_ids int64, seq_idx int32, labels)`` by a loop over sequences.

    ``labels`` (any shape holding ``sum(seq_lens)`` values) comes back with ``ignore_index`` on the first
    token of every non-empty sequence.
    """
    cu = [0]
    positions: list[int] = []
    seq_idx: list[int] = []
    for b, n in enumerate(seq_lens):
        n = int(n)
        positions.extend(range(n))
        seq_idx.extend([b] * n)
        cu.append(cu[-1] + n)
    labels_out = None
    if labels is not None:
        labels_out = labels.clone()
        flat = labels_out.view(-1)
        for b, n in enumerate(seq_lens):
            if int(n) > 0:
                flat[cu[b]] = ignore_index
    return (
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(seq_idx, dtype=torch.int32),
        labels_out,
    )
