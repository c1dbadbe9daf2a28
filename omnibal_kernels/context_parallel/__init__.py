"""Context parallelism: shards of a packed batch over CP ranks, and the attention across them.

A pack too long for one GPU is split over the ``P`` ranks of a context-parallel group. How it is split decides
each rank's time (linear work grows with the tokens a rank holds, causal attention with the query-key pairs)
and what the ranks exchange (a rank needs the keys and values that its queries attend to):

``zigzag``        every sequence in ``2P`` chunks, rank ``r`` holding chunks ``r`` and ``2P-1-r`` (Megatron THD,
                  ring-flash-attention); ``pad_sequences=True`` pads each sequence to a multiple of ``2P`` as
                  they require, the default deals the remainder without padding.
``per_document``  torch's per-document head-tail, boundaries ``floor(c * L / 2P)``.
``hybrid``        short sequences whole on one rank (no exchange), long ones cut head-tail over the ranks, every
                  rank's predicted time equal (:mod:`.hybrid`).
``contiguous``    the packed tokens in ``P`` equal ranges (no balancing; the baseline).
``auto``          per batch, the fixed strategy with the least predicted step time.

The predicted time (:mod:`.cost`) counts tokens, attention pairs in kernel tiles, and K/V rows received.

    shards = ok.shard_for_context_parallel(batch, cp_size=4)         # the same on every rank
    mine = shards[cp_rank].to("cuda")
    out = ok.context_parallel_attention(q, k, v, mine, group=cp_group)  # in each attention layer
    full = shards.restore([out_0, out_1, out_2, out_3])               # packed order again

:func:`context_parallel_rank_times` prices a batch from its sequence lengths alone (numpy only), for planners
and collators. In a DataLoader, ``PackCollator(context_parallel_size=P)`` returns each rank its shard of the
packed batch and ``BalancedBatchSampler(context_parallel_size=P)`` gives the ranks of a group the same pack.
:mod:`.adapters` gives Megatron THD and ring-flash-attention inputs and runs transformers models.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "ContextParallelCost": "cost",
    "RankTimes": "cost",
    "Layout": "layout",
    "STRATEGIES": "strategy",
    "context_parallel_rank_times": "strategy",
    "plan_layout": "strategy",
    "ContextParallelShard": "shard",
    "ContextParallelShards": "shard",
    "shard_for_context_parallel": "shard",
    "context_parallel_attention": "attention",
    "megatron_thd_params": "adapters",
    "ring_flash_attn_inputs": "adapters",
    "register_transformers_attention": "adapters",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
