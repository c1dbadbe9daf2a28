"""Attention for transformers models in which each packed sample attends only to itself, nothing padded.

transformers' ``sdpa`` and ``eager`` attention train a packed row under a ``(T, T)`` block-diagonal mask: their
cost grows with the square of the pack's length, ``(sum_i t_i)**2``, which no sum of per-sample costs describes,
and which flash-attention's varlen kernels (what packed training runs on GPUs) do not pay. Models that are timed
to fit a cost model therefore run this attention where flash-attention is not available (on the CPU): registered
as ``attn_implementation="omnibal_segments"``, it finds the samples of the row where the text positions restart at
0 and runs the package's varlen attention on them (:func:`omnibal_kernels.attention.varlen_attention`,
``backend="sdpa"``: one SDPA call per group of samples of equal length, nothing padded), so a pack costs what its
samples cost. transformers builds no mask for an implementation it does not know, and passes the text positions to
the attention of Llama, Qwen2, Qwen-VL and InternVL text models. The Qwen-VL vision towers call it once per image
(or window) already, without positions: one sequence, not causal. A plain ``(T, T)`` row without restarts is one
sequence too. Sliding windows are not supported.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..attention import varlen_attention

__all__ = ["ATTN_IMPLEMENTATION", "register_segment_attention", "segment_attention"]

ATTN_IMPLEMENTATION = "omnibal_segments"


def _segment_starts(position_ids: Optional[torch.Tensor], length: int) -> list[int]:
    """Where the samples of a packed row begin (positions restarting at 0), and ``length`` last."""
    if position_ids is None:
        return [0, length]
    positions = position_ids.reshape(-1, position_ids.shape[-1])[0]  # the text row of (1, T) or (rows, 1, T)
    if positions.shape[0] != length:
        return [0, length]
    starts = torch.nonzero(positions == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [*starts, length]


def segment_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: ``query (B, heads, T, head_dim)``, ``key``/``value`` ``(B, kv_heads, T,
    head_dim)``; returns ``(B, T, heads, head_dim)`` and no weights. Causal when the module is. A packed row
    (``B = 1`` with restarting ``position_ids``) is split into its samples; other batches (InternVL's tiles)
    are one sequence per row."""
    if attention_mask is not None:
        raise ValueError("segment attention runs without a mask: use it with packed rows (no padding)")
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
    batch, heads, length, head_dim = query.shape
    packed = causal and batch == 1
    if batch == 1:
        bounds = _segment_starts(kwargs.get("position_ids") if packed else None, length)
    else:
        bounds = list(range(0, (batch + 1) * length, length))  # one sequence per row
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=query.device)
    longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (B, heads, T, head_dim) -> (B * T, heads, head_dim)
        return x.transpose(1, 2).reshape(batch * length, x.shape[1], head_dim)

    out = varlen_attention(
        tokens(query),
        tokens(key),
        tokens(value),
        cu_seqlens,
        longest,
        causal=causal,
        softmax_scale=scaling,
        dropout_p=dropout,
        backend="sdpa",
        validate=False,
    )
    return out.view(batch, length, heads, head_dim), None


def register_segment_attention() -> str:
    """Registers :func:`segment_attention` with transformers (once per process); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, segment_attention)
    return ATTN_IMPLEMENTATION
