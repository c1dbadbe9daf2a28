"""Causal varlen attention over a context-parallel group: exchange the K/V each rank needs, attend locally.

Each rank holds the queries, keys and values of its own tokens. Before attention, one all-to-all sends every
rank exactly the K/V rows of the other ranks that its queries attend to (per sequence, the rows below its
last held position: what the Llama-3 style all-gather of torchtitan and Megatron sends, minus the rows that
no query of the receiver sees, and nothing of the sequences a rank holds whole). Each rank then runs
:func:`~omnibal_kernels.varlen_attention` on its query segments over the gathered keys (causal, bottom-right
aligned), with any of its backends. In the backward pass the reverse all-to-all returns the gradients of the
exchanged K/V to the ranks that hold those rows, where they add to the local gradients. K and V travel in
one message. Works on any process group whose backend has ``all_to_all_single`` (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..attention import varlen_attention
from .exchange import exchange_rows
from .shard import ContextParallelShard

__all__ = ["context_parallel_attention"]


def _check_group(shard: ContextParallelShard, group: dist.ProcessGroup | None) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"context_parallel_attention: the shard is for {shard.context_parallel_size} ranks but torch.distributed "
            "is not initialized"
        )
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if size != shard.context_parallel_size or rank != shard.rank:
        raise ValueError(
            f"context_parallel_attention: the shard is rank {shard.rank} of {shard.context_parallel_size} but this "
            f"process is rank {rank} of a group of {size}"
        )


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: ContextParallelShard,
    group: dist.ProcessGroup | None = None,
    *,
    softmax_scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal attention of a rank's tokens over their whole sequences, across the CP group.

    Collective: every rank of ``group`` must call it with its own shard of the same batch (when the layout
    exchanges nothing, e.g. ``hybrid`` with every sequence whole, no collective runs on any rank).

    Args:
        q: ``(n, heads, head_dim)`` queries of the rank's tokens in local order (``n = shard.num_tokens``).
        k, v: ``(n, kv_heads, head_dim)``; ``heads`` a multiple of ``kv_heads`` (grouped-query attention).
        shard: this rank's :class:`~.shard.ContextParallelShard`, its tensors on q's device.
        group: the CP process group (default: the whole world), whose size and rank must be the shard's.
        softmax_scale: default ``1 / sqrt(head_dim)``.
        backend: :func:`~omnibal_kernels.varlen_attention`'s backend for the local attention.

    Returns:
        ``(n, heads, head_dim)``: for every held token, what unsharded causal varlen attention over the packed
        batch gives at that token. Gradients flow to q, k and v of every rank.
    """
    if not isinstance(shard, ContextParallelShard):
        raise TypeError(f"shard must be a ContextParallelShard, got {type(shard).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a (n, heads, head_dim) tensor")
        if x.shape[0] != shard.num_tokens:
            raise ValueError(f"{name} has {x.shape[0]} tokens but the shard holds {shard.num_tokens}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if shard.key_index.device != q.device:
        raise ValueError(
            f"the shard's tensors are on {shard.key_index.device} but q is on {q.device}: use shard.to(q.device)"
        )
    kv_heads = k.shape[1]
    kv = torch.cat([k, v], dim=1)
    if shard.context_parallel_size > 1:
        _check_group(shard, group)
    if shard.group_exchanges:
        sent = kv.index_select(0, shard.send_index)
        got = exchange_rows(sent, shard.send_counts, shard.recv_counts, group)
        kv = torch.cat([kv, got], dim=0)
    keys = kv.index_select(0, shard.key_index)
    return varlen_attention(
        q,
        keys[:, :kv_heads],
        keys[:, kv_heads:],
        shard.cu_seqlens_q,
        shard.max_seqlen_q,
        causal=True,
        softmax_scale=softmax_scale,
        cu_seqlens_k=shard.cu_seqlens_k,
        max_seqlen_k=shard.max_seqlen_k,
        backend=backend,
    )
