"""Partition searches over contiguous splits of a layer chain into virtual stages.

``search_step``: the split of least *simulated step time* under the schedule, by best-first branch and bound.
Stages are placed left to right; a node (the first ``s`` stages placed) gets a lower bound on the step of every
split that completes it, from :mod:`~omnibal_kernels.pipeline.bounds`: the ranks whose stages are all placed
give their exact bound, and the rest a bound computed for all completions at once by a dynamic program over
(stage, first layer) (one stage per rank: ``G(s, a) = min_b max(X_s(a, b), tau_s(a, b) + G(s + 1, b + 1))``,
where ``X_s`` is stage s's own bound without the time of the stages before it and ``tau_s = F_s + B_s`` what it
adds to the stages after; with several stages per rank the bottleneck stage and the average rank).
Complete splits are simulated. The search stops when no open node's bound is below the best simulated step:
that split is optimal. With ``node_limit`` reached first it returns the best split found and the least open
bound, so the gap is known.

``search_bottleneck``: the split of least bottleneck stage (ties: least total), two dynamic programs over
(stage, last layer); ``paper_candidates``: OmniBal's neighbourhood of a greedy anchor, ranked by spread.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .bounds import Windows, rank_bound, round_trips
from .costs import StageCosts

__all__ = ["SearchResult", "search_bottleneck", "search_step", "paper_candidates", "allowed_ends"]

Stages = list[tuple[int, int]]


@dataclass(frozen=True)
class SearchResult:
    """The best split found, its simulated ``step_ms``, the proven ``lower_bound_ms`` on every split's step
    (equal to the step when the split is optimal) and the ``nodes`` expanded."""

    stages: Stages
    step_ms: float
    lower_bound_ms: float
    nodes: int


def allowed_ends(
    L: int, S: int, s: int, a: int, fixed: dict[int, int], last: Optional[np.ndarray] = None
) -> np.ndarray:
    """Last layers ``b`` that stage ``s`` starting at ``a`` may take (every later stage keeps a layer, and
    ``b <= last[a]`` when given)."""
    top = L - 1 if last is None else int(last[a])
    if s in fixed and fixed[s] != a:
        return np.zeros(0, np.int64)
    if s == S - 1:
        return np.array([L - 1]) if a <= L - 1 <= top else np.zeros(0, np.int64)
    if s + 1 in fixed:
        b = fixed[s + 1] - 1
        return np.array([b]) if a <= b <= top else np.zeros(0, np.int64)
    return np.arange(a, min(L - (S - s), top) + 1)


class _OneStagePerRank:
    """Vectorized bounds when every rank holds one stage (``X_s`` and ``G`` of the module docstring)."""

    def __init__(self, costs: StageCosts, mats: np.ndarray, windows: Windows, fixed: dict[int, int]) -> None:
        self.c, self.mats, self.fixed = costs, mats, fixed
        self.m = windows.micro_batches
        self.win = windows.ranks
        L, S = costs.L, costs.S
        self.G = np.full((S + 1, L + 1), np.inf)
        self.arg = np.full((S, L), -1, np.int64)
        for s in range(S - 1, -1, -1):
            for a in range(s, L):
                b = allowed_ends(L, S, s, a, fixed, costs.last)
                if b.size == 0:
                    continue
                x, tau = self.stage(s, a, b)
                val = x if s == S - 1 else np.maximum(x, tau + self.G[s + 1, b + 1])
                k = int(np.argmin(val))
                if math.isfinite(val[k]):
                    self.G[s, a], self.arg[s, a] = val[k], b[k]

    def stage(self, s: int, a: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(X_s(a, b), tau_s(a, b))`` for the ends ``b`` (inf where the stage cannot be)."""
        rec = self.mats[s, a, b]
        ok = np.isfinite(rec)
        f, bb, w = self.c.least_parts(s, a, b, np.where(ok, rec, 0.0))
        win = self.win[s]
        dur = (f, bb, w)
        trip = self.c.rest[b + 1]
        gains = [np.maximum(0.0, trip - sum(n[k, s] * dur[k] for k in range(3) if n[k, s])) for n in win.between]
        if len(gains) == 2:
            disjoint = win.y[0] <= win.x[1] or win.y[1] <= win.x[0]
            idle = gains[0] + gains[1] if disjoint else np.maximum(gains[0], gains[1])
        else:
            idle = gains[0]
        after = sum(win.after[k, s] * dur[k] for k in range(3) if win.after[k, s])
        x = self.m * (f + bb + w) + idle - after
        return np.where(ok, x, np.inf), np.where(ok, f + bb, np.inf)

    def seed(self) -> Optional[Stages]:
        """The split the dynamic program picks (the least bound)."""
        return _split_of(self.arg, self.G)


def search_step(
    costs: StageCosts,
    mats: np.ndarray,
    windows: Windows,
    fixed: dict[int, int],
    evaluate: Callable[[Stages], Optional[float]],
    seeds: Sequence[Optional[Stages]],
    node_limit: int,
    polish: bool = True,
) -> Optional[SearchResult]:
    """The split of least simulated step (module docstring). ``mats``: (S, L, L) recompute times (lower bounds
    with several stages per rank; inf where a stage cannot be); ``evaluate``: the simulated step of a complete
    split, ``None`` when it does not fit; ``seeds``: splits to start from, to which ``polish`` adds the
    searches' own and the moves of one boundary at a time (without them the bounds alone find the split).
    ``None`` when no split fits."""
    if costs.v == 1:
        return _search_one(costs, mats, windows, fixed, evaluate, seeds, node_limit, polish)
    return _search_many(costs, mats, windows, fixed, evaluate, seeds, node_limit, polish)


def _best_of(
    seeds: Sequence[Optional[Stages]], evaluate: Callable[[Stages], Optional[float]], fixed: dict[int, int], rounds: int
) -> tuple[float, Optional[Stages]]:
    """The best seed, then improved by moving one boundary by one or two layers at a time while that helps (at
    most ``rounds`` moves, the best move first): a good split to prune against before the search starts."""
    best, best_stages = math.inf, None
    for st in seeds:
        if st is None:
            continue
        step = evaluate(list(st))
        if step is not None and step < best:
            best, best_stages = step, list(st)
    if best_stages is None:
        return best, None
    starts = [a for a, _ in best_stages]
    L = best_stages[-1][1] + 1
    for _ in range(rounds):
        move, move_step = None, best
        for k in range(1, len(starts)):
            if k in fixed:
                continue
            for d in (-2, -1, 1, 2):
                x = starts[k] + d
                if x <= starts[k - 1] or x >= (starts[k + 1] if k + 1 < len(starts) else L):
                    continue
                trial = starts[:k] + [x] + starts[k + 1 :]
                step = evaluate(_stages_of(tuple(y - 1 for y in trial[1:]) + (L - 1,)))
                if step is not None and step < move_step * (1 - 1e-12):
                    move, move_step = trial, step
        if move is None:
            break
        starts, best = move, move_step
    return best, _stages_of(tuple(y - 1 for y in starts[1:]) + (L - 1,))


def _search_one(costs, mats, windows, fixed, evaluate, seeds, node_limit, polish):
    L, S = costs.L, costs.S
    one = _OneStagePerRank(costs, mats, windows, fixed)
    root = float(one.G[0, 0])
    if not math.isfinite(root):
        return None
    seeds = [one.seed(), *seeds] if polish else seeds
    best, best_stages = _best_of(seeds, evaluate, fixed, 50 * S if polish else 0)
    # node: (bound, seq, s, a, pre, placed, path) with path a tuple of ends
    heap = [(root, 0, 0, 0, 0.0, -math.inf, ())]
    seq, nodes = 1, 0
    tol = 1e-12
    while heap and nodes < node_limit:
        bound, _, s, a, pre, placed, path = heapq.heappop(heap)
        if bound >= best * (1 - tol):
            heap.clear()
            break
        nodes += 1
        b = allowed_ends(L, S, s, a, fixed, costs.last)
        if b.size == 0:
            continue
        x, tau = one.stage(s, a, b)
        placed_c = np.maximum(placed, pre + x)
        pre_c = pre + tau
        if s == S - 1:
            if math.isfinite(placed_c[0]) and placed_c[0] < best * (1 - tol):
                st = _stages_of(path + (int(b[0]),))
                step = evaluate(st)
                if step is not None and step < best:
                    best, best_stages = step, st
            continue
        lb = np.maximum(placed_c, pre_c + one.G[s + 1, b + 1])
        for k in np.flatnonzero(lb < best * (1 - tol)):
            heapq.heappush(
                heap,
                (float(lb[k]), seq, s + 1, int(b[k]) + 1, float(pre_c[k]), float(placed_c[k]), path + (int(b[k]),)),
            )
            seq += 1
    if best_stages is None:
        return None
    lower = min(best, heap[0][0]) if heap else best
    return SearchResult(best_stages, best, min(lower, best), nodes)


def _stages_of(ends: tuple[int, ...]) -> Stages:
    out, a = [], 0
    for b in ends:
        out.append((a, b))
        a = b + 1
    return out


def _min_max_table(
    costs: StageCosts,
    t: Callable[[int, int, np.ndarray], np.ndarray],
    fixed: dict[int, int],
    squares: bool = False,
    cap: Optional[float] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``beta[s, a]``: least over splits of layers a.. into stages s.. of the largest ``t``; with ``squares``,
    of the sum of the squares of ``t`` (stages as equal as the layers allow); with ``cap``, of the sum of ``t``
    over splits whose every stage is within ``cap``. Returns it and its argmin (last layer per stage)."""
    L, S = costs.L, costs.S
    summed = squares or cap is not None
    beta = np.full((S + 1, L + 1), np.inf)
    beta[S, L] = 0.0 if summed else -np.inf
    arg = np.full((S, L), -1, np.int64)
    for s in range(S - 1, -1, -1):
        for a in range(s, L):
            b = allowed_ends(L, S, s, a, fixed, costs.last)
            if b.size == 0:
                continue
            ts = t(s, a, b)
            if cap is not None:
                val = np.where(ts <= cap, ts + beta[s + 1, b + 1], np.inf)
            elif squares:
                val = ts * ts + beta[s + 1, b + 1]
            else:
                val = np.maximum(ts, beta[s + 1, b + 1])
            k = int(np.argmin(val))
            if math.isfinite(val[k]):
                beta[s, a], arg[s, a] = val[k], b[k]
    return beta, arg


def _split_of(arg: np.ndarray, table: np.ndarray) -> Optional[Stages]:
    """The split an argmin table of :func:`_min_max_table` (or of ``G``) picks from layer 0."""
    if not math.isfinite(table[0, 0]):
        return None
    out, a = [], 0
    for s in range(arg.shape[0]):
        out.append((a, int(arg[s, a])))
        a = out[-1][1] + 1
    return out


def _water_level(base: np.ndarray, open_: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """Per row, the least ``max_r (base_r + x_r)`` over ``x >= 0`` summing to ``fill`` on the open ranks
    (closed ranks keep ``base_r``): the level ``min_k max(W_k, beta_k)``, ``W_k`` the level that fills the k
    lowest open bases."""
    closed = np.where(open_, -np.inf, base).max(axis=1)
    beta = np.sort(np.where(open_, base, np.inf), axis=1)
    k = np.arange(1, beta.shape[1] + 1)
    with np.errstate(invalid="ignore"):
        level = (fill[:, None] + np.cumsum(np.where(np.isfinite(beta), beta, 0.0), axis=1)) / k
        level = np.where(np.isfinite(beta), np.maximum(level, beta), np.inf).min(axis=1)
    return np.maximum(level, closed)


class _ManyStagesPerRank:
    """Vectorized bounds when ranks hold several stages: a rank's own bound once its stages are all placed
    (recompute at its lower bound), and for the rest the water level of the ranks' loads plus what must come
    before and after each rank (``sum_{k < r} (F_k + B_k)``), and the least bottleneck stage of the rest."""

    def __init__(self, costs: StageCosts, mats: np.ndarray, windows: Windows, fixed: dict[int, int]) -> None:
        self.c, self.mats, self.win, self.fixed = costs, mats, windows.ranks, fixed
        S, P = costs.S, costs.P

        def lone(s, a, b):
            f, bb, w = costs.parts(s, a, b, mats[s, a, b])
            return f + bb + w

        self.beta, self.arg = _min_max_table(costs, lone, fixed)
        self.even = _split_of(*reversed(_min_max_table(costs, lone, fixed, squares=True)))
        self.last = np.array([max(j for j in range(S) if costs.rank_of[j] == r) for r in range(P)])
        self.first = np.array([w.first for w in self.win])
        self.last_b = np.array([w.last_b for w in self.win])
        self.zero_bubble = any(w.after.any() for w in self.win)
        self.train_rest = (costs.c_fwd[-1] - costs.c_fwd) + (costs.c_bwd[-1] - costs.c_bwd)

    def children(
        self, s: int, a: int, b: np.ndarray, prefix: tuple[np.ndarray, np.ndarray, np.ndarray], placed: float
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Bounds of the children ending stage s at each of ``b`` and their (n, S) stage times."""
        c, m = self.c, self.c.m
        rec = self.mats[s, a, b]
        ok = np.isfinite(rec)
        fs, bs, ws = c.least_parts(s, a, b, np.where(ok, rec, 0.0))
        f, bb, w = (np.repeat(x[None, :], b.size, axis=0) for x in prefix)
        f[:, s], bb[:, s], w[:, s] = fs, bs, ws
        t = f + bb + w
        rank = c.rank_of[: s + 1]
        load = np.stack([t[:, : s + 1][:, rank == r].sum(axis=1) for r in range(c.P)], axis=1)
        # unplaced stages are zero in f and bb, so these sums are over the placed stages before each rank
        start = np.concatenate([np.zeros((b.size, 1)), np.cumsum(f, axis=1)], axis=1)[:, self.first]
        tail = np.concatenate([np.zeros((b.size, 1)), np.cumsum(bb, axis=1)], axis=1)[:, self.last_b]
        if self.zero_bubble:
            tail = np.zeros_like(tail)  # the weight gradients after the last B may hide it
        base = start + tail + m * load
        closed = self.last <= s
        bound = np.maximum(
            placed, _water_level(base, np.repeat(~closed[None, :], b.size, 0), m * self.train_rest[b + 1])
        )
        if s < c.S - 1:
            bound = np.maximum(bound, m * self.beta[s + 1, b + 1])
        done = np.flatnonzero(self.last == s)
        if done.size:
            trip = round_trips(f, bb)
            trip[:, : s + 1] += c.rest[b + 1][:, None]
            for r in done:
                bound = np.maximum(bound, rank_bound(self.win[r], m, f, bb, w, trip))
        return np.where(ok, bound, np.inf), (f, bb, w)

    def seeds(self, extra: Sequence[Optional[Stages]]) -> list[Optional[Stages]]:
        """The split of least bottleneck stage, the one of stages as equal as possible and ``extra``, each also
        with its ranks' loads evened out (:meth:`rebalance`, then :meth:`level`)."""
        out: list[Optional[Stages]] = []
        for st in (_split_of(self.arg, self.beta), self.even, *extra):
            if st is not None:
                out += [st, self.level(self.rebalance(st))]
        return out

    def level(self, stages: Stages) -> Stages:
        """Moves one layer across one boundary at a time while that lowers the sum of the squared rank loads
        (a layer goes from a rank to the rank of the next or previous stage, so load spreads rank by rank)."""
        c = self.c
        st = list(stages)
        t = [float(self.lone(j, a, np.array([b]))[0]) for j, (a, b) in enumerate(st)]
        load = np.zeros(c.P)
        for j, x in enumerate(t):
            load[c.rank_of[j]] += x
        for _ in range(c.L * c.S):
            best, move = 0.0, None
            for k in range(1, c.S):
                if k in self.fixed:
                    continue
                for d in (-1, 1):
                    a = st[k][0] + d
                    if not (st[k - 1][0] < a <= st[k][1]):
                        continue
                    t0 = float(self.lone(k - 1, st[k - 1][0], np.array([a - 1]))[0])
                    t1 = float(self.lone(k, a, np.array([st[k][1]]))[0])
                    if not math.isfinite(t0 + t1 + t[k - 1] + t[k]):
                        continue  # a stage over its memory: no squared load to compare
                    r0, r1 = c.rank_of[k - 1], c.rank_of[k]
                    new = load.copy()
                    new[r0] += t0 - t[k - 1]
                    new[r1] += t1 - t[k]
                    gain = float((load * load).sum() - (new * new).sum())
                    if math.isfinite(gain) and gain > best * (1 + 1e-12) + 1e-12:
                        best, move = gain, (k, a, t0, t1, new)
            if move is None:
                break
            k, a, t[k - 1], t[k], load = move
            st[k - 1], st[k] = (st[k - 1][0], a - 1), (a, st[k][1])
        return st

    def weighted_bound(self, lam: np.ndarray) -> float:
        """A bound on every split's step: ``sum_r lam_r (start_r + tail_r + m load_r)`` (weights summing to 1)
        is at most the largest rank's bound, and is linear in the stage times, so its least value over all
        splits is a min-sum dynamic program."""
        c, m = self.c, self.c.m
        L, S = c.L, c.S
        own = m * lam[c.rank_of]
        cf = own + np.array([lam[self.first > j].sum() for j in range(S)])
        cb = own + (0.0 if self.zero_bubble else np.array([lam[self.last_b > j].sum() for j in range(S)]))
        best = np.full((S + 1, L + 1), np.inf)
        best[S, L] = 0.0
        for s in range(S - 1, -1, -1):
            for a in range(s, L):
                b = allowed_ends(L, S, s, a, self.fixed, c.last)
                if b.size == 0:
                    continue
                f, bb, w = c.least_parts(s, a, b, self.mats[s, a, b])
                best[s, a] = float(np.min(cf[s] * f + cb[s] * bb + own[s] * w + best[s + 1, b + 1]))
        return float(best[0, 0])

    def lone(self, s: int, a: int, b: np.ndarray) -> np.ndarray:
        f, bb, w = self.c.parts(s, a, b, self.mats[s, a, b])
        return f + bb + w

    def rebalance(self, stages: Stages, sweeps: int = 8) -> Stages:
        """Coordinate descent on the largest rank load: each round of P stages (one per rank) split anew over its
        layers by a min-max dynamic program, the other rounds' loads of each rank held fixed."""
        c, P = self.c, self.c.P
        st = list(stages)
        for _ in range(sweeps):
            moved = False
            for rnd in range(c.v):
                js = range(rnd * P, (rnd + 1) * P)
                load = np.zeros(P)
                for j, (a, b) in enumerate(st):
                    if j not in js:
                        load[c.rank_of[j]] += float(self.lone(j, a, np.array([b]))[0])
                split = self._round(js, st[js[0]][0], st[js[-1]][1], load)
                if split is not None and split != st[js[0] : js[-1] + 1]:
                    old = max(
                        load[c.rank_of[j]] + float(self.lone(j, a, np.array([b]))[0])
                        for j, (a, b) in zip(js, st[js[0] : js[-1] + 1])
                    )
                    new = max(
                        load[c.rank_of[j]] + float(self.lone(j, a, np.array([b]))[0]) for j, (a, b) in zip(js, split)
                    )
                    if new < old * (1 - 1e-12):
                        st[js[0] : js[-1] + 1] = split
                        moved = True
            if not moved:
                break
        return st

    def _round(self, js: range, first: int, last: int, load: np.ndarray) -> Optional[Stages]:
        """Layers first..last into the stages js, least ``max_j (load[rank j] + t_j)`` (fixed starts kept)."""
        c = self.c
        n = len(js)
        best = np.full((n + 1, last + 2), np.inf)
        best[n, last + 1] = -np.inf
        arg = np.full((n, last + 2), -1, np.int64)
        for k in range(n - 1, -1, -1):
            j = js[k]
            for a in range(first + k, last + 1):
                if j in self.fixed and self.fixed[j] != a:
                    continue
                b = np.array([last]) if k == n - 1 else np.arange(a, last - (n - 1 - k) + 1)
                if j + 1 in self.fixed and k < n - 1:
                    b = b[b == self.fixed[j + 1] - 1]
                if b.size == 0:
                    continue
                val = np.maximum(load[c.rank_of[j]] + self.lone(j, a, b), best[k + 1, b + 1])
                i = int(np.argmin(val))
                if math.isfinite(val[i]):
                    best[k, a], arg[k, a] = val[i], b[i]
        if not math.isfinite(best[0, first]):
            return None
        out, a = [], first
        for k in range(n):
            out.append((a, int(arg[k, a])))
            a = out[-1][1] + 1
        return out


def _search_many(costs, mats, windows, fixed, evaluate, seeds, node_limit, polish):
    """Several stages per rank (the bounds of :class:`_ManyStagesPerRank`)."""
    L, S = costs.L, costs.S
    many = _ManyStagesPerRank(costs, mats, windows, fixed)
    if not math.isfinite(many.beta[0, 0]):
        return None
    seeds = many.seeds(seeds) if polish else seeds
    best, best_stages = _best_of(seeds, evaluate, fixed, 50 * S if polish else 0)
    zero = np.zeros(S)
    heap = [(0.0, 0, (), (zero, zero, zero))]
    seq, nodes, tol = 1, 0, 1e-12
    while heap and nodes < node_limit:
        bound, _, path, prefix = heapq.heappop(heap)
        if bound >= best * (1 - tol):
            heap.clear()
            break
        nodes += 1
        s = len(path)
        a = path[-1] + 1 if path else 0
        b = allowed_ends(L, S, s, a, fixed, costs.last)
        if b.size == 0:
            continue
        if s == S - 1:
            st = _stages_of(path + (int(b[0]),))
            step = evaluate(st)
            if step is not None and step < best:
                best, best_stages = step, st
            continue
        lb, (f, bb, w) = many.children(s, a, b, prefix, bound)
        for k in np.flatnonzero(lb < best * (1 - tol)):
            heapq.heappush(heap, (float(lb[k]), seq, path + (int(b[k]),), (f[k], bb[k], w[k])))
            seq += 1
    if best_stages is None:
        return None
    lower = min(best, heap[0][0]) if heap else best
    if lower < best:
        lower = min(best, max(lower, many.weighted_bound(np.full(costs.P, 1.0 / costs.P))))
    return SearchResult(best_stages, best, lower, nodes)


def search_bottleneck(costs: StageCosts, mats: np.ndarray, fixed: dict[int, int]) -> Optional[Stages]:
    """The split of least bottleneck ``max_s (F_s + B_s + W_s)``, ties broken by the least total (one stage per
    rank): a min-max then a min-sum dynamic program under the bottleneck."""

    def t(s, a, b):
        f, bb, w = costs.parts(s, a, b, mats[s, a, b])
        return f + bb + w

    beta, _ = _min_max_table(costs, t, fixed)
    if not math.isfinite(beta[0, 0]):
        return None
    total, arg = _min_max_table(costs, t, fixed, cap=beta[0, 0] * (1 + 1e-12))
    return _split_of(arg, total)


def _anchor(costs: StageCosts) -> list[int]:
    """Greedy: stage s starts where the running train time first passes s/S of the total (closest cut)."""
    L, S = costs.L, costs.S
    c = costs.c_fwd + costs.c_bwd
    starts = [0]
    for s in range(1, S):
        target = c[-1] * s / S
        j = int(np.searchsorted(c, target))
        if j > 0 and abs(c[j - 1] - target) <= abs(c[min(j, L)] - target):
            j -= 1
        starts.append(min(max(j, starts[-1] + 1), L - (S - s)))
    return starts


def paper_candidates(
    costs: StageCosts, mats: np.ndarray, fixed: dict[int, int], radius: int, top_k: int
) -> list[Stages]:
    """The ``top_k`` splits around the greedy anchor (every boundary moved by at most ``radius`` layers) with
    the least spread: squared deviations of stage time and communication from the anchor's means, summed
    (a k-best dynamic program, exact)."""
    L, S = costs.L, costs.S
    anchor = _anchor(costs)
    bounds = list(zip(anchor, [x - 1 for x in anchor[1:]] + [L - 1]))
    compute = [float(costs.span(costs.c_fwd + costs.c_bwd, a, b)) for a, b in bounds]
    comm = [float(costs.send_out(s, b) + costs.send_in(s, a)) for s, (a, b) in enumerate(bounds)]
    mean_t, mean_c = float(np.mean(compute)), float(np.mean(comm))

    def spread(a: int, b: int, s: int) -> float:
        rec = mats[s, a, b]
        if not math.isfinite(rec):
            return math.inf
        t = float(costs.span(costs.c_fwd + costs.c_bwd, a, b)) + rec
        c = float(costs.send_out(s, b) + costs.send_in(s, a))
        return (t - mean_t) ** 2 + (c - mean_c) ** 2

    options = [[0]] + [
        [fixed[s]]
        if s in fixed
        else [j for j in range(anchor[s] - radius, anchor[s] + radius + 1) if s <= j <= L - (S - s)]
        for s in range(1, S)
    ]
    frontier: dict[int, list[tuple[float, tuple[int, ...]]]] = {0: [(0.0, (0,))]}
    for s in range(1, S + 1):
        nxt: dict[int, list[tuple[float, tuple[int, ...]]]] = {}
        for j in options[s] if s < S else [L]:
            cands: list[tuple[float, tuple[int, ...]]] = []
            for i, paths in frontier.items():
                if i >= j:
                    continue
                add = spread(i, j - 1, s - 1)
                if math.isfinite(add):
                    cands.extend((score + add, starts + ((j,) if s < S else ())) for score, starts in paths)
            if cands:
                nxt[j] = heapq.nsmallest(top_k, cands)
        frontier = nxt
    return [list(zip(st, [x - 1 for x in st[1:]] + [L - 1])) for _, st in frontier.get(L, [])]
