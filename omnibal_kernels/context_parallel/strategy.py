"""Strategies by name, ``auto``'s choice, and the public per-rank time of a batch under a strategy.

:func:`context_parallel_rank_times` is the one function a planner or a collator needs to know what a pack
costs on a CP group: from the pack's sequence lengths alone (no tensors, no communication) it gives every
rank's predicted time, tokens, attention pairs and K/V exchange under the layout that
:func:`shard_for_context_parallel` builds for the same batch and arguments. It imports numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import as_int_array
from .cost import ContextParallelCost, RankTimes, layout_times
from .hybrid import hybrid_layout
from .layout import Layout, contiguous_layout, per_document_layout, zigzag_layout
from .options import STRATEGIES, ContextParallelOptions, check_options

__all__ = ["STRATEGIES", "context_parallel_rank_times", "plan_layout"]

# auto's candidates; on equal predicted time the earlier one wins (hybrid exchanges the least K/V)
_AUTO_CANDIDATES = ("hybrid", "zigzag", "per_document", "contiguous")


def check_seqlens(seqlens: Any) -> np.ndarray:
    """``seqlens`` as a 1-D int64 array of lengths >= 0."""
    lengths = as_int_array(seqlens, "seqlens")
    if lengths.size and int(lengths.min()) < 0:
        at = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(f"seqlens[{at}] = {int(lengths[at])} is negative")
    return lengths


def _fixed_layout(
    seqlens: np.ndarray,
    size: int,
    strategy: str,
    cost: ContextParallelCost,
    pad_sequences: bool,
    max_rank_tokens: int | None,
) -> Layout:
    if strategy == "zigzag":
        return zigzag_layout(seqlens, size, pad_sequences)
    if strategy == "per_document":
        return per_document_layout(seqlens, size)
    if strategy == "contiguous":
        return contiguous_layout(seqlens, size)
    return hybrid_layout(seqlens, size, cost, max_rank_tokens)


def plan_layout(seqlens: Any, options: ContextParallelOptions) -> tuple[Layout, RankTimes]:
    """The layout of a batch's segments under ``options`` and its predicted per-rank times.

    ``auto`` builds every fixed strategy's layout and keeps the one with the least predicted step time among
    those that exchange no more K/V rows than ``zigzag`` and keep every rank within ``max_rank_tokens``: it is
    never predicted slower than zigzag nor than any strategy exchanging no more, and never exchanges more than
    zigzag. (Where zigzag itself is over ``max_rank_tokens``, the fastest layout within it.) Arguments as
    :func:`context_parallel_rank_times`.
    """
    options = check_options(options, "options")
    size, strategy, cost = options.size, options.strategy, options.cost
    pad_sequences, max_rank_tokens = options.pad_sequences, options.max_rank_tokens
    lengths = check_seqlens(seqlens)
    if strategy != "auto":
        layout = _fixed_layout(lengths, size, strategy, cost, pad_sequences, max_rank_tokens)
        times = layout_times(layout, cost)
        if max_rank_tokens is not None and int(times.tokens.max()) > max_rank_tokens:
            raise ValueError(
                f"strategy {strategy!r} gives a rank {int(times.tokens.max())} tokens, more than "
                f"max_rank_tokens={max_rank_tokens}"
            )
        return layout, times
    built = []
    for name in _AUTO_CANDIDATES:
        layout = _fixed_layout(lengths, size, name, cost, False, max_rank_tokens)
        built.append((layout, layout_times(layout, cost)))
    within = [b for b in built if max_rank_tokens is None or int(b[1].tokens.max()) <= max_rank_tokens]
    if not within:
        fewest = min(int(b[1].tokens.max()) for b in built)
        raise ValueError(
            f"no strategy keeps every rank within max_rank_tokens={max_rank_tokens}: the fewest "
            f"tokens any gives its fullest rank is {fewest}"
        )
    # a layout faster than zigzag by moving more K/V rows is not taken: the exchange is what the cost model
    # knows least (the links' speed and overlap vary), so auto never trades more of it for predicted time
    zigzag = built[_AUTO_CANDIDATES.index("zigzag")]
    frugal = [b for b in within if b[1].kv_exchanged <= zigzag[1].kv_exchanged] if zigzag in within else within
    best = frugal[0]
    for candidate in frugal[1:]:
        if candidate[1].step_time < best[1].step_time:
            best = candidate
    return best


def context_parallel_rank_times(seqlens: Any, options: ContextParallelOptions) -> RankTimes:
    """Predicted work of every rank of a CP group for one batch, from its sequence lengths.

    This is what :func:`shard_for_context_parallel` plans with (same lengths, same options, same layout),
    computed without building tensors: a planner can price a candidate pack with it, and a collator can
    report the imbalance of the batch it shards.

    Args:
        seqlens: ``(S,)`` lengths of the batch's segments in packed order (``batch["seq_lens"]``, or the
            LLM lengths of a pack's samples); zeros are allowed and hold nothing.
        options: the :class:`~omnibal_kernels.context_parallel.ContextParallelOptions`: the group's ``size``,
            the ``strategy``, the ``cost`` terms, zigzag's ``pad_sequences`` and ``max_rank_tokens`` (``hybrid``
            keeps only layouts within it and places whole sequences where tokens have room; ``auto`` chooses
            among the strategies within it; a fixed strategy over it is a ValueError).

    Returns:
        :class:`RankTimes`: ``times``, ``tokens``, ``pairs``, ``exact_pairs``, ``kv_received`` per rank, the
        ``padding`` added, and ``step_time`` (slowest rank), ``imbalance`` (slowest over mean), ``kv_exchanged``.

    Raises:
        TypeError/ValueError: a bad argument, named; ValueError when no layout of the strategy keeps every
            rank within ``max_rank_tokens``.
    """
    return plan_layout(seqlens, options)[1]
