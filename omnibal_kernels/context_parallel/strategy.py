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
    those that keep every rank within ``max_rank_tokens``, so it is never predicted slower than the best of
    them. Arguments as :func:`context_parallel_rank_times`.
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
    best: tuple[Layout, RankTimes] | None = None
    fewest = None
    for name in _AUTO_CANDIDATES:
        layout = _fixed_layout(lengths, size, name, cost, False, max_rank_tokens)
        times = layout_times(layout, cost)
        most = int(times.tokens.max())
        fewest = most if fewest is None else min(fewest, most)
        if max_rank_tokens is not None and most > max_rank_tokens:
            continue
        if best is None or times.step_time < best[1].step_time:
            best = (layout, times)
    if best is None:
        raise ValueError(
            f"no strategy keeps every rank within max_rank_tokens={max_rank_tokens}: the fewest "
            f"tokens any gives its fullest rank is {fewest}"
        )
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
