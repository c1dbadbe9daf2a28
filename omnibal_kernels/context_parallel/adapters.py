"""The shards in other systems' forms: Megatron THD, ring-flash-attention's zigzag varlen, transformers models.

Megatron-LM (Transformer Engine attention, ``qkv_format="thd"``) and ring-flash-attention's
``zigzag_ring_flash_attn_varlen_func`` both take every sequence padded to a multiple of ``2 * C`` (``C`` the
context-parallel size) and cut into ``2 * C`` equal chunks, rank ``r`` holding chunk ``r`` and then chunk
``2 * C - 1 - r`` of each sequence, in sequence order: exactly the tokens and order of
``shard_for_context_parallel(batch, ContextParallelOptions(size=C, strategy="zigzag", pad_sequences=True))``.
They differ in the metadata:

* Megatron's ``PackedSeqParams`` describe the whole batch on every rank: ``cu_seqlens_q``/``_kv`` of the real
  lengths, ``cu_seqlens_q_padded``/``_kv_padded`` of the padded ones, ``max_seqlen_q``/``_kv`` the longest
  padded sequence (:func:`megatron_thd_params`).
* ring-flash-attention takes the rank's local boundaries: ``cu_seqlens`` = padded ``cu_seqlens // C`` (each
  sequence's two chunks form one local segment, first half chunk ``r``, second half chunk ``2 * C - 1 - r``),
  ``max_seqlen`` = longest padded sequence ``// C``, and ``causal=True`` (its default is ``False``)
  (:func:`ring_flash_attn_inputs`).

Labels for both: the shard's ``shift_labels`` are the next-token targets these systems' losses expect
(Megatron's ``labels`` are already shifted), with ``ignore_index`` on padding and at sequence ends.

transformers: :func:`register_transformers_attention` registers :func:`context_parallel_attention` as an
attention implementation; a rank then runs ``model(**shard.batch, context_parallel_shard=shard)`` with the
shard's ``position_ids`` (each token's position in its sequence, so rotary embeddings are those of the
unsharded batch) and ``shift_labels`` (so the loss pairs each token with its true successor).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .attention import context_parallel_attention
from .shard import ContextParallelShards

__all__ = [
    "TRANSFORMERS_ATTENTION",
    "megatron_thd_params",
    "register_transformers_attention",
    "ring_flash_attn_inputs",
]

TRANSFORMERS_ATTENTION = "omnibal_context_parallel"


def _check_thd(shards: Any, fn: str) -> np.ndarray:
    """The padded lengths of zigzag shards with Megatron padding, else a ValueError saying what to pass."""
    if not isinstance(shards, ContextParallelShards):
        raise TypeError(f"{fn}: shards must be shard_for_context_parallel's result, got {type(shards).__name__}")
    layout = shards.layout
    if layout.strategy != "zigzag" or bool((layout.padded % (2 * layout.context_parallel_size)).any()):
        raise ValueError(
            f"{fn}: needs every sequence in 2 * context_parallel_size equal chunks: shard with "
            f"strategy='zigzag', pad_sequences=True (these shards are {layout.strategy!r})"
        )
    return layout.padded


def _cu(lengths: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.r_[0, np.cumsum(lengths)].astype(np.int32)).to(device)


def megatron_thd_params(shards: ContextParallelShards) -> dict[str, Any]:
    """Megatron ``PackedSeqParams`` keyword arguments for the batch of ``shards`` (the same on every rank).

    ``PackedSeqParams(**megatron_thd_params(shards))`` with each rank's ``shards[r].batch["input_ids"]`` is the
    THD input Megatron's context parallelism expects.

    Returns:
        ``qkv_format="thd"``; ``cu_seqlens_q``, ``cu_seqlens_kv`` (int32 ``(S + 1,)``, real lengths);
        ``cu_seqlens_q_padded``, ``cu_seqlens_kv_padded`` (int32, lengths padded to ``2 * context_parallel_size``);
        ``max_seqlen_q``, ``max_seqlen_kv`` (longest padded sequence), tensors on the shards' device.

    Raises:
        ValueError: shards not made with ``strategy="zigzag", pad_sequences=True``.
    """
    padded = _check_thd(shards, "megatron_thd_params")
    device = shards[0].indices.device
    real, pad = _cu(shards.layout.seqlens, device), _cu(padded, device)
    longest = int(padded.max()) if padded.size else 0
    return {
        "qkv_format": "thd",
        "cu_seqlens_q": real,
        "cu_seqlens_kv": real,
        "cu_seqlens_q_padded": pad,
        "cu_seqlens_kv_padded": pad,
        "max_seqlen_q": longest,
        "max_seqlen_kv": longest,
    }


def ring_flash_attn_inputs(shards: ContextParallelShards, rank: int) -> dict[str, Any]:
    """Keyword arguments of ring-flash-attention's ``zigzag_ring_flash_attn_varlen_func`` for rank ``rank``.

    ``zigzag_ring_flash_attn_varlen_func(q, k, v, **ring_flash_attn_inputs(shards, rank), group=cp_group)``
    with ``q, k, v`` of ``shards[rank]``'s tokens (in its order) computes that rank's causal attention.

    Returns:
        ``cu_seqlens`` (int32 ``(S + 1,)``, local), ``max_seqlen`` (int), ``causal=True``.

    Raises:
        ValueError: shards not made with ``strategy="zigzag", pad_sequences=True``, or a bad rank.
    """
    padded = _check_thd(shards, "ring_flash_attn_inputs")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(shards):
        raise ValueError(f"ring_flash_attn_inputs: rank must be in [0, {len(shards)}), got {rank!r}")
    local = padded // len(shards)
    return {
        "cu_seqlens": _cu(local, shards[rank].indices.device),
        "max_seqlen": int(local.max()) if local.size else 0,
        "causal": True,
    }


def _transformers_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``(1, heads, n, head_dim)`` in, ``(1, n, heads, head_dim)`` out."""
    shard = kwargs.get("context_parallel_shard")
    if shard is None:
        raise ValueError(
            f"attention {TRANSFORMERS_ATTENTION!r} needs the rank's shard: call the model with "
            "context_parallel_shard=shard (and context_parallel_group=group unless it is the world)"
        )
    if dropout:
        raise ValueError(f"attention {TRANSFORMERS_ATTENTION!r} has no attention dropout (got {dropout})")
    if query.shape[0] != 1:
        raise ValueError(f"a context-parallel rank runs one packed row, got a batch of {query.shape[0]}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    out = context_parallel_attention(q, k, v, shard, kwargs.get("context_parallel_group"), softmax_scale=scaling)
    return out.unsqueeze(0), None


def register_transformers_attention(name: str = TRANSFORMERS_ATTENTION) -> str:
    """Registers :func:`context_parallel_attention` in transformers' ``AttentionInterface`` as ``name``.

    Then ``model.set_attn_implementation(name)``, and on every rank of the CP group::

        out = model(**shard.batch, context_parallel_shard=shard, context_parallel_group=cp_group,
                    num_items_in_batch=shards.num_items_in_batch)

    gives the rank's logits (in its token order) and its part of the batch's loss (summed over the rank's
    targets, divided by the batch's target count: the ranks' losses add up to the unsharded loss, and so do
    their gradients after the usual all-reduce). ``shards.restore`` puts the logits back in packed order.
    Custom attention implementations get no attention mask from transformers; the shard holds the causal
    structure.

    Returns:
        ``name``.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(name, _transformers_attention)
    return name
