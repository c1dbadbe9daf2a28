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
``auto``          per batch, the fixed strategy with the least predicted step time among those that exchange
                  no more K/V rows than ``zigzag``.

The predicted time (:mod:`.cost`) counts tokens, attention pairs in kernel tiles, and K/V rows received.

Every setting lives in one :class:`ContextParallelOptions` (size, strategy, cost, padding, token cap). In a
training run it is a planning option, ``PlanOptions(context_parallel=ContextParallelOptions(size=P))``: the
sampler gives the ranks of a group the same pack and its batches tell ``PackCollator`` each rank's shard;
:func:`context_parallel_report` prices a plan per CP rank. By hand:

    options = ContextParallelOptions(size=4)
    shards = shard_for_context_parallel(batch, options)                  # the same on every rank
    mine = shards[cp_rank].to("cuda")
    out = context_parallel_attention(q, k, v, mine, group=cp_group)      # in each attention layer
    full = shards.restore([out_0, out_1, out_2, out_3])                  # packed order again

:func:`context_parallel_rank_times` prices a batch from its sequence lengths alone (numpy only), for planners
and collators. :mod:`.adapters` gives Megatron THD and ring-flash-attention inputs and runs transformers models.

=============  ======================================================================================
``options``    :class:`ContextParallelOptions`
``layout``     which tokens each rank holds (the strategies' layouts); ``hybrid`` its balanced layout
``cost``       :class:`ContextParallelCost` and each rank's predicted time
``strategy``   a layout by strategy name, ``auto``'s choice, :func:`context_parallel_rank_times`
``tokens``     the token indices and K/V exchange of each rank
``shard``      :func:`shard_for_context_parallel`: a packed batch -> its shards
``attention``  :func:`context_parallel_attention` over a process group
``adapters``   Megatron THD, ring-flash-attention and transformers
``collate``    the collator's side: a packed batch -> this rank's shard, weighted as the whole pack
``exchange``   the all-to-all of rows with its gradient (K/V rows, embedding rows)
``vision``     a vision-language pack's images divided among the ranks, their embedding rows routed
``models``     :func:`apply_context_parallel`: a transformers model (text or vision-language) on CP shards
``report``     :func:`context_parallel_report`: every CP rank's time for every step of a plan
=============  ======================================================================================

Vision-language models (Qwen2-VL, Qwen2.5-VL, InternVL): ``PackCollator.for_model(model, context_parallel=...)``
gives each rank its tokens and a balanced share of the pack's images to encode, and
``apply_context_parallel(model, cp_group)`` makes ``model(**batch)`` route the embedding rows to the ranks
holding their placeholders (docs/guides/vlm-context-parallel.md).
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "ContextParallelOptions": "options",
    "ContextParallelCost": "cost",
    "RankTimes": "cost",
    "Layout": "layout",
    "STRATEGIES": "options",
    "context_parallel_rank_times": "strategy",
    "plan_layout": "strategy",
    "ContextParallelShard": "shard",
    "ContextParallelShards": "shard",
    "shard_for_context_parallel": "shard",
    "context_parallel_attention": "attention",
    "megatron_thd_params": "adapters",
    "ring_flash_attn_inputs": "adapters",
    "register_transformers_attention": "adapters",
    "VisionShard": "vision",
    "VisionWork": "vision",
    "exchange_vision_rows": "vision",
    "apply_context_parallel": "models",
    "ContextParallelReport": "report",
    "context_parallel_report": "report",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
