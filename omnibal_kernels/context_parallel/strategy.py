"""Strategies by name, ``auto``'s choice, and the public per-rank time of a batch under a strategy.

:func:`context_parallel_rank_times` is the one function a planner or a collator needs to know what a pack
costs on a CP group: from the pack's sequence lengths alone (no tensors, no communication) it gives every
rank's predicted time, tokens, attention pairs and K/V exchange under the layout that
:func:`shard_for_context_parallel` builds for the same batch and arguments. It imports numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import as_int_array, check_positive_int
from .cost import ContextParallelCost, RankTimes, layout_times
from .hybrid import hybrid_layout
from .layout import Layout, contiguous_layout, per_document_layout, zigzag_layout

__all__ = ["STRATEGIES", "context_parallel_rank_times", "plan_layout"]

STRATEGIES = ("auto", "zigzag", "per_document", "hybrid", "contiguous")
# auto's candidates; on equal predicted time the earlier one wins (hybrid exchanges the least K/V)
_AUTO_CANDIDATES = ("hybrid", "zigzag", "per_document", "contiguous")
_DEFAULT_COST: ContextParallelCost | None = None


def default_cost() -> ContextParallelCost:
    """:meth:`ContextParallelCost.llama3_8b`, built once."""
    global _DEFAULT_COST
    if _DEFAULT_COST is None:
        _DEFAULT_COST = ContextParallelCost.llama3_8b()
    return _DEFAULT_COST


def check_strategy_args(
    cp_size: Any, strategy: Any, cost: Any, pad_sequences: Any, max_rank_tokens: Any = None
) -> ContextParallelCost:
    """Validates the arguments every strategy takes; returns the cost model (the default for ``None``)."""
    check_positive_int("cp_size", cp_size)
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not isinstance(pad_sequences, bool):
        raise TypeError(f"pad_sequences must be a bool, got {pad_sequences!r}")
    if pad_sequences and strategy != "zigzag":
        raise ValueError(f"pad_sequences=True is the zigzag strategy's Megatron padding; strategy is {strategy!r}")
    if max_rank_tokens is not None:
        check_positive_int("max_rank_tokens", max_rank_tokens)
    if cost is None:
        return default_cost()
    if not isinstance(cost, ContextParallelCost):
        raise TypeError(f"cost must be a ContextParallelCost or None, got {type(cost).__name__}")
    return cost


def check_seqlens(seqlens: Any) -> np.ndarray:
    """``seqlens`` as a 1-D int64 array of lengths >= 0."""
    lengths = as_int_array(seqlens, "seqlens")
    if lengths.size and int(lengths.min()) < 0:
        at = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(f"seqlens[{at}] = {int(lengths[at])} is negative")
    return lengths


def _fixed_layout(
    seqlens: np.ndarray,
    cp_size: int,
    strategy: str,
    cost: ContextParallelCost,
    pad_sequences: bool,
    max_rank_tokens: int | None,
) -> Layout:
    if strategy == "zigzag":
        return zigzag_layout(seqlens, cp_size, pad_sequences)
    if strategy == "per_document":
        return per_document_layout(seqlens, cp_size)
    if strategy == "contiguous":
        return contiguous_layout(seqlens, cp_size)
    return hybrid_layout(seqlens, cp_size, cost, max_rank_tokens)


def plan_layout(
    seqlens: Any,
    cp_size: int,
    strategy: str = "auto",
    *,
    cost: ContextParallelCost | None = None,
    pad_sequences: bool = False,
    max_rank_tokens: int | None = None,
) -> tuple[Layout, RankTimes]:
    """The layout of a batch's segments under ``strategy`` and its predicted per-rank times.

    ``auto`` builds every fixed strategy's layout and keeps the one with the least predicted step time among
    those that keep every rank within ``max_rank_tokens``, so it is never predicted slower than the best of
    them. Arguments as :func:`context_parallel_rank_times`.
    """
    cost = check_strategy_args(cp_size, strategy, cost, pad_sequences, max_rank_tokens)
    lengths = check_seqlens(seqlens)
    if strategy != "auto":
        layout = _fixed_layout(lengths, cp_size, strategy, cost, pad_sequences, max_rank_tokens)
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
        layout = _fixed_layout(lengths, cp_size, name, cost, False, max_rank_tokens)
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


def context_parallel_rank_times(
    seqlens: Any,
    cp_size: int,
    strategy: str = "auto",
    *,
    cost: ContextParallelCost | None = None,
    pad_sequences: bool = False,
    max_rank_tokens: int | None = None,
) -> RankTimes:
    """Predicted work of every rank of a CP group for one batch, from its sequence lengths.

    This is what :func:`shard_for_context_parallel` plans with (same lengths, same arguments, same layout),
    computed without building tensors: a planner can price a candidate pack with it, and a collator can
    report the imbalance of the batch it shards.

    Args:
        seqlens: ``(S,)`` lengths of the batch's segments in packed order (``batch["seq_lens"]``, or the
            LLM lengths of a pack's samples); zeros are allowed and hold nothing.
        cp_size: ranks of the CP group.
        strategy: ``"auto"`` (the fixed strategy with the least predicted step time), ``"zigzag"``,
            ``"per_document"``, ``"hybrid"`` or ``"contiguous"`` (see :mod:`omnibal_kernels.context_parallel`).
        cost: the cost terms (default :meth:`ContextParallelCost.llama3_8b`).
        pad_sequences: zigzag only: pad every sequence to a multiple of ``2 * cp_size`` (Megatron THD,
            ring-flash-attention).
        max_rank_tokens: the most tokens one rank may hold (its activation memory), or None. ``hybrid``
            keeps only layouts within it and places whole sequences where tokens have room; ``auto``
            chooses among the strategies within it; a fixed strategy over it is a ValueError.

    Returns:
        :class:`RankTimes`: ``times``, ``tokens``, ``pairs``, ``exact_pairs``, ``kv_received`` per rank, the
        ``padding`` added, and ``step_time`` (slowest rank), ``imbalance`` (slowest over mean), ``kv_exchanged``.

    Raises:
        TypeError/ValueError: a bad argument, named; ValueError when no layout of ``strategy`` keeps every
        rank within ``max_rank_tokens``.
    """
    return plan_layout(
        seqlens, cp_size, strategy, cost=cost, pad_sequences=pad_sequences, max_rank_tokens=max_rank_tokens
    )[1]
