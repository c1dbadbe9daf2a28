"""Plain, slow, obviously correct references, shared by tests and benchmarks.

Each fast path of the library is checked against one of these. They favour clarity over speed: Python
loops, numpy and plain torch only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------------
# Balance: grouping references (the C++ engine's shuffles are reused, so outputs match exactly)
# ---------------------------------------------------------------------------------------------------------

# Stream ids of csrc/grouping.cpp.
_STREAM_ISF_ROUND = 1
_STREAM_NEXT_FIT = 2


def next_fit_reference(order: Sequence[int], vit: np.ndarray, llm: np.ndarray, vit_capacity: int,
                       llm_capacity: int) -> list[list[int]]:
    """Next-fit over ``order``: a new pack whenever the next sample would overflow a capacity."""
    packs: list[list[int]] = []
    current: list[int] = []
    v_sum = t_sum = 0
    for i in order:
        v, t = int(vit[i]), int(llm[i])
        if current and (v_sum + v > vit_capacity or t_sum + t > llm_capacity):
            packs.append(current)
            current, v_sum, t_sum = [], 0, 0
        current.append(int(i))
        v_sum += v
        t_sum += t
    if current:
        packs.append(current)
    return packs


def isf_reference(vit: np.ndarray, llm: np.ndarray, items: np.ndarray, vit_capacity: int, llm_capacity: int,
                  vit_threshold: int, llm_threshold: int, iterations: int, seed: int) -> list[list[int]]:
    """The OmniBal Iterative Sampling and Filtering, step by step, with the engine's shuffles."""
    from . import _ext

    C = _ext.load()

    def shuffled(ids: Sequence[int], round_index: int) -> np.ndarray:
        return C.shuffle(np.asarray(ids, dtype=np.int64), C.derive_seed(seed, _STREAM_ISF_ROUND, round_index))

    out: list[list[int]] = []
    groups = next_fit_reference(shuffled(items, 0), vit, llm, vit_capacity, llm_capacity)
    for r in range(1, iterations):
        pool: list[int] = []
        for g in groups:
            if sum(int(vit[i]) for i in g) >= vit_threshold or sum(int(llm[i]) for i in g) >= llm_threshold:
                out.append(g)
            else:
                pool.extend(g)
        if not pool:
            groups = []
            break
        groups = next_fit_reference(shuffled(pool, r), vit, llm, vit_capacity, llm_capacity)
    out.extend(groups)
    return out


def random_next_fit_reference(vit: np.ndarray, llm: np.ndarray, items: np.ndarray, vit_capacity: int,
                              llm_capacity: int, seed: int) -> list[list[int]]:
    """Random next-fit with the engine's shuffle."""
    from . import _ext

    C = _ext.load()
    order = C.shuffle(np.asarray(items, dtype=np.int64), C.derive_seed(seed, _STREAM_NEXT_FIT, 0))
    return next_fit_reference(order, vit, llm, vit_capacity, llm_capacity)


def dist_ratio_reference(step_loads: Sequence[Sequence[float]], min_denominator: float = 0.0) -> float:
    """The paper's Dist Ratio, loop by loop as the authors' script computes it."""
    ratios = []
    for loads in step_loads:
        peak = max(loads)
        waste = sum(peak - x for x in loads)
        denom = max(peak * len(loads), min_denominator)
        ratios.append(waste / denom if denom > 0 else 0.0)
    return sum(ratios) / len(ratios) if ratios else 0.0


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
