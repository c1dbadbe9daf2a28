"""The ``hybrid`` layout: short sequences whole on one rank, long ones cut over the ranks, every rank's time equal.

A sequence held whole needs no K/V exchange and no kernel tiles cut in pieces; a long one held whole would make
its rank the slowest. For a number ``k`` of sharded sequences (the ``k`` costliest), a layout is built in two
ways, both deterministic (stable sorts, ties to the lower rank):

* *spread*: the other sequences are placed whole first, costliest first, each on the rank with the least
  time so far (longest processing time first); then the sharded sequences' work is water-filled onto the
  ranks, so that each rank's time reaches one level;
* *concentrated*: the sharded sequences' work first fills whole ranks, in rank order, at the level every rank
  should reach; then the whole sequences go, longest first, to the ranks with the least time. Fewer ranks take
  part in each cut sequence, so less K/V moves.

Either way the sharded sequences are laid one after another as a stream of work, each rank takes its share
as one stretch of that stream, and each sequence is cut among the ranks of its stretch head-tail: each rank
in turn takes ``n`` tokens from the front and ``n`` from the back of what is left, the last one the middle.
The causal pairs of a position grow linearly along a sequence, so such a pair of pieces costs the same per
token wherever it is cut: tokens in proportion to work give pairs in proportion to work. A rank takes part in
the one or two sequences its stretch covers, not in all. Cuts are rounded to multiples of the kernel tile
where one lies within half a tile, so that pieces do not end in a partial tile row.

The predicted times (tiles and exchange included, :func:`~.cost.layout_times`) then correct the shares for a
few rounds, for the candidates that screen fastest. ``k`` runs over a grid: none, all, and a geometric grid
from the smallest ``k`` that leaves no whole sequence costlier than a rank's mean share. The candidate with
the least predicted step time wins; times within ``_TIE`` of each other are a tie, won by the one that
exchanges fewer K/V rows. A short sequence in the stream is cut only where one rank's stretch ends in it.
"""

from __future__ import annotations

import heapq

import numpy as np

from .cost import ContextParallelCost, RankTimes, layout_times
from .layout import Layout, _normalized, tiled_pairs

__all__ = ["hybrid_layout"]

# Rounds of share correction per candidate. The shares' residual after water-filling is the exchange and the
# tile rounding, a few percent of a rank's time; each round removes most of it (benchmark: the cp part).
_ROUNDS = 8
# Candidates (of the screened ones, fastest first) whose shares are corrected.
_REFINED = 4
# Stop correcting once the slowest rank is this close to the mean.
_TOLERANCE = 1e-4
# Predicted step times this close are a tie, broken by the K/V exchanged: the tile rounding of a cut moves a
# rank's time by more than this, so a smaller difference is below what the model resolves.
_TIE = 1e-3
# Candidates past the first few sharded counts grow by this factor.
_GROWTH = 1.5


def _longest_first(
    costs: np.ndarray, initial: np.ndarray, tokens: np.ndarray, room: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Ranks of items already sorted by decreasing cost, each to the rank with the least ``initial`` + placed
    cost among those whose ``room`` still holds its ``tokens`` (any rank when none does);
    ``(owner, placed cost per rank)``."""
    heap = [(float(load), r) for r, load in enumerate(initial.tolist())]
    heapq.heapify(heap)
    room = room.astype(np.float64).copy()
    owner = np.empty(costs.size, np.int64)
    for i, (c, n) in enumerate(zip(costs.tolist(), tokens.tolist())):
        skipped = []
        while len(heap) > 1 and room[heap[0][1]] < n:
            skipped.append(heapq.heappop(heap))
        if room[heap[0][1]] < n:  # no rank has room: the least loaded of all takes it
            heap += skipped
            heapq.heapify(heap)
            skipped = []
        load, r = heapq.heappop(heap)
        for item in skipped:
            heapq.heappush(heap, item)
        owner[i] = r
        room[r] -= n
        heapq.heappush(heap, (load + c, r))
    return owner, np.bincount(owner, weights=costs, minlength=initial.size)


def _water_fill(loads: np.ndarray, work: float) -> np.ndarray:
    """Shares ``d >= 0`` with ``sum(d) == work`` that bring ``loads + d`` to one level where they can."""
    order = np.argsort(loads, kind="stable")
    low = loads[order]
    level = low[-1]
    for i in range(low.size):
        # fill the i + 1 lowest ranks up to the next load, or as far as the work goes
        room = (low[i + 1] if i + 1 < low.size else np.inf) * (i + 1) - low[: i + 1].sum()
        if room >= work:
            level = (work + low[: i + 1].sum()) / (i + 1)
            break
    shares = np.zeros_like(loads)
    shares[order] = np.maximum(level - low, 0.0)
    return shares * (work / shares.sum()) if shares.sum() > 0 else shares


def _aligned(position: int, tile: int, low: int, high: int) -> int:
    """``position`` rounded to a multiple of ``tile`` within ``[low, high]`` (as it is when none lies near)."""
    rounded = round(position / tile) * tile
    return rounded if low <= rounded <= high and abs(rounded - position) <= tile // 2 else position


def _head_tail_pieces(length: int, take: np.ndarray, tile: int) -> list[tuple[int, int, int]]:
    """``(start, stop, rank)`` pieces of one sequence whose ranks hold ``take[r]`` tokens, cut head-tail: each
    rank in rank order takes the front and the back of what is left, the last one the middle."""
    front, back = 0, length
    holders = np.flatnonzero(take > 0).tolist()
    pieces = []
    for j, r in enumerate(holders):
        if j == len(holders) - 1:
            pieces.append((front, back, r))
            break
        # earlier ranks' rounding may have left less than this rank's share
        n = min(int(take[r]), back - front)
        head = min(_aligned(front + (n + 1) // 2, tile, front, back) - front, n)
        tail = back - _aligned(back - (n - head), tile, front + head, back)
        pieces += [(front, front + head, r), (back - tail, back, r)]
        front, back = front + head, back - tail
    return pieces


def _stream_cut(lengths: np.ndarray, per_token: np.ndarray, shares: np.ndarray, tile: int) -> tuple[np.ndarray, ...]:
    """Chunks ``(item, start, stop, rank)`` of the sharded sequences for rank work ``shares`` (see step 3)."""
    seq_bounds = np.r_[0.0, np.cumsum(lengths * per_token)]
    rank_bounds = np.r_[0.0, np.cumsum(shares)]
    rank_bounds[-1] = seq_bounds[-1]  # float sums of the shares may stop short of the last token
    # (sequences, ranks + 1): where each rank's stretch ends inside each sequence, in tokens
    inside = (rank_bounds[None, :] - seq_bounds[:-1, None]) / per_token[:, None]
    cuts = np.rint(np.clip(inside, 0.0, lengths[:, None])).astype(np.int64)
    cuts[:, 0], cuts[:, -1] = 0, lengths
    take = np.diff(np.maximum.accumulate(cuts, axis=1), axis=1)
    holders = np.count_nonzero(take, axis=1)
    one = np.flatnonzero(holders == 1)
    items, starts, stops = [one], [np.zeros_like(one)], [lengths[one].astype(np.int64)]
    ranks = [np.argmax(take[one], axis=1)]
    for i in np.flatnonzero(holders > 1).tolist():
        pieces = np.asarray(_head_tail_pieces(int(lengths[i]), take[i], tile), dtype=np.int64)
        items.append(np.full(len(pieces), i))
        starts.append(pieces[:, 0])
        stops.append(pieces[:, 1])
        ranks.append(pieces[:, 2])
    return tuple(np.concatenate(x).astype(np.int64) for x in (items, starts, stops, ranks))


def _better(a: RankTimes, b: RankTimes, max_rank_tokens: int | None) -> bool:
    """``a`` beats ``b``: within ``max_rank_tokens`` when ``b`` is not (or fuller than ``b`` less), else faster
    beyond the tie margin, or as fast and exchanging fewer K/V rows."""
    if max_rank_tokens is not None:
        over_a = max(0, int(a.tokens.max()) - max_rank_tokens)
        over_b = max(0, int(b.tokens.max()) - max_rank_tokens)
        if over_a != over_b:
            return over_a < over_b
    if a.step_time < b.step_time * (1.0 - _TIE):
        return True
    return a.step_time <= b.step_time * (1.0 + _TIE) and a.kv_exchanged < b.kv_exchanged


def _candidate(
    seqlens: np.ndarray,
    sharded: np.ndarray,
    whole: np.ndarray,
    whole_costs: np.ndarray,
    context_parallel_size: int,
    cost: ContextParallelCost,
    concentrate: bool,
    rounds: int,
    max_rank_tokens: int | None,
) -> tuple[Layout, RankTimes]:
    """The best layout found with ``sharded`` cut and ``whole`` (sorted by decreasing cost) kept whole.

    ``concentrate``: the sharded stream first fills whole ranks at the mean level and the whole sequences go
    around it (fewer ranks take part in each sharded sequence, so less exchange); else the whole sequences
    are placed first and the stream is water-filled over every rank. With ``max_rank_tokens``, whole
    sequences go where that many tokens still have room.
    """
    lengths = seqlens[sharded].astype(np.float64)
    # exact causal pairs of a head-tail piece: (L + 1) / 2 per token on average, wherever it is cut
    per_token = cost.token + cost.pair * (lengths + 1.0) / 2.0
    total = float((lengths * per_token).sum())
    level = (total + float(whole_costs.sum())) / context_parallel_size
    initial = (
        np.clip(total - level * np.arange(context_parallel_size), 0.0, level)
        if concentrate
        else np.zeros(context_parallel_size)
    )
    room = np.full(context_parallel_size, np.inf if max_rank_tokens is None else float(max_rank_tokens))
    if concentrate and sharded.size:
        _, start, stop, rank = _stream_cut(seqlens[sharded], per_token, initial, cost.tile)
        room -= np.bincount(rank, weights=stop - start, minlength=context_parallel_size)
    owner, loads = _longest_first(whole_costs, initial, seqlens[whole], room)
    shares = initial if concentrate else _water_fill(loads, total)

    def build(shares: np.ndarray) -> tuple[Layout, RankTimes]:
        parts = [(whole, np.zeros_like(whole), seqlens[whole], owner)]
        if sharded.size:
            item, start, stop, rank = _stream_cut(seqlens[sharded], per_token, shares, cost.tile)
            parts.append((sharded[item], start, stop, rank))
        seq, start, stop, rank = (np.concatenate([p[j] for p in parts]) for j in range(4))
        layout = _normalized("hybrid", context_parallel_size, seqlens, seqlens, seq, start, stop, rank)
        return layout, layout_times(layout, cost)

    best = current = build(shares)
    for _ in range(rounds if sharded.size else 0):
        if current[1].imbalance <= 1.0 + _TOLERANCE:
            break
        times = current[1].times
        shares = np.maximum(shares - (times - times.mean()), 0.0)
        if shares.sum() <= 0:
            break
        shares *= total / shares.sum()
        current = build(shares)
        if (
            current[1].step_time < best[1].step_time
            if max_rank_tokens is None
            else _better(current[1], best[1], max_rank_tokens)
        ):
            best = current
    return best


def _counts(costs: np.ndarray, context_parallel_size: int) -> list[int]:
    """Candidate numbers of sharded sequences for costs sorted decreasingly."""
    n = costs.size
    smallest = int(np.count_nonzero(costs > costs.sum() / context_parallel_size))
    counts = {0, n, *range(smallest, min(n, smallest + 8) + 1)}
    step = 8.0
    while smallest + step < n:
        counts.add(smallest + int(step))
        step *= _GROWTH
    return sorted(counts)


def hybrid_layout(
    seqlens: np.ndarray, context_parallel_size: int, cost: ContextParallelCost, max_rank_tokens: int | None = None
) -> Layout:
    """The hybrid layout of segments ``seqlens`` (int64 ``(S,)``) over ``context_parallel_size`` ranks (module
    docstring); with ``max_rank_tokens``, the fastest layout found within it, else the one whose fullest rank
    holds fewest."""
    live = np.flatnonzero(seqlens > 0)
    lengths = seqlens[live]
    costs = cost.token * lengths + cost.pair * tiled_pairs(lengths, lengths, cost.tile)
    order = np.argsort(-costs, kind="stable")
    ranked, ranked_costs = live[order], costs[order]
    screened = []
    for k in _counts(ranked_costs, context_parallel_size) if context_parallel_size > 1 else [0]:
        for concentrate in (False, True) if k else (False,):
            args = (seqlens, ranked[:k], ranked[k:], ranked_costs[k:], context_parallel_size, cost, concentrate)
            screened.append((_candidate(*args, 0, max_rank_tokens), args))
    best: tuple[Layout, RankTimes] | None = None
    for found, _ in screened:
        if best is None or _better(found[1], best[1], max_rank_tokens):
            best = found

    def rank(item: tuple) -> tuple:
        times = item[0][1]
        over = 0 if max_rank_tokens is None else max(0, int(times.tokens.max()) - max_rank_tokens)
        return over, times.step_time

    # the share correction rounds only for the candidates that screen fastest
    for _, args in sorted(screened, key=rank)[:_REFINED]:
        found = _candidate(*args, _ROUNDS, max_rank_tokens)
        if best is None or _better(found[1], best[1], max_rank_tokens):
            best = found
    assert best is not None
    return best[0]
