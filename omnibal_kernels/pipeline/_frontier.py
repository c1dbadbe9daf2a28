"""The compiled core of the recompute plans: Pareto frontiers of (bytes saved, recompute time) over layers.

Which layers to recompute so that a stage fits its budget at the least time is a min-cost cover (a 0/1
knapsack, NP-hard in general). A frontier holds every non-dominated ``(saved, cost)`` sum of a subset of the
layers, ``saved`` and ``cost`` strictly increasing; adding a layer merges the frontier with itself shifted by
the layer, in linear time. Saved bytes are clamped at ``cap`` (the most any query asks), so the sums past it
collapse to the cheapest one.

A frontier is exact while it has at most ``limit`` points, which is what happens when layers share a few
shapes. Past that the layers' saved bytes are floored to multiples of a grid ``g`` (so at most
``cap / g + 1`` points survive): every answer is then feasible (true bytes saved >= floored ones) and costs no
more than the exact optimum for a need larger by ``n * g`` (n layers), i.e. for a budget smaller by
``held * n * g`` bytes. The caller reports that slack; it is zero whenever the frontier stayed exact.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def add_item(
    w: np.ndarray, c: np.ndarray, n: int, item_w: float, item_c: float, cap: float, out_w: np.ndarray, out_c: np.ndarray
) -> int:
    """Merges the frontier ``(w[:n], c[:n])`` with itself plus one item into ``out_*``; returns its size."""
    return _merge(w, c, n, item_w, item_c, cap, out_w, out_c, np.zeros(0, np.bool_), np.zeros(0, np.int64))


@numba.njit(cache=True, nogil=True)
def _merge(
    w: np.ndarray,
    c: np.ndarray,
    n: int,
    item_w: float,
    item_c: float,
    cap: float,
    out_w: np.ndarray,
    out_c: np.ndarray,
    took: np.ndarray,
    parent: np.ndarray,
) -> int:
    """The merge of :func:`add_item`; with ``took`` and ``parent`` as long as the output it also records, per
    output point, whether it holds the item and its index in the input (empty arrays: not recorded).

    Both inputs are sorted by ``w``; the merge walks them from the largest ``w`` down and keeps a point only
    when it is cheaper than every point saving at least as much (equal ``w``: the cheaper first)."""
    track = took.shape[0] > 0
    i, j, k = n - 1, n - 1, 0
    best = np.inf
    while i >= 0 or j >= 0:
        wj = min(w[j] + item_w, cap) if j >= 0 else -1.0
        cj = c[j] + item_c if j >= 0 else np.inf
        wi = w[i] if i >= 0 else -1.0
        ci = c[i] if i >= 0 else np.inf
        if j >= 0 and (i < 0 or wj > wi or (wj == wi and cj < ci)):
            pw, pc, pt, pp = wj, cj, True, j
            j -= 1
        else:
            pw, pc, pt, pp = wi, ci, False, i
            i -= 1
        if pc < best:
            out_w[k], out_c[k] = pw, pc
            if track:
                took[k], parent[k] = pt, pp
            best = pc
            k += 1
    # reverse into ascending order
    for t in range(k // 2):
        u = k - 1 - t
        out_w[t], out_w[u] = out_w[u], out_w[t]
        out_c[t], out_c[u] = out_c[u], out_c[t]
        if track:
            took[t], took[u] = took[u], took[t]
            parent[t], parent[u] = parent[u], parent[t]
    return k


@numba.njit(cache=True, nogil=True)
def query(w: np.ndarray, c: np.ndarray, n: int, need: float) -> float:
    """Least cost of the frontier's points that save at least ``need`` (inf when none does)."""
    if need <= 0:
        return 0.0
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if w[mid] >= need:
            hi = mid
        else:
            lo = mid + 1
    return c[lo] if lo < n else np.inf


@numba.njit(cache=True, nogil=True)
def _sweep(
    save: np.ndarray,
    cost: np.ndarray,
    a: int,
    last: int,
    cap: float,
    grid: float,
    limit: int,
    needs: np.ndarray,
    out: np.ndarray,
    w0: np.ndarray,
    c0: np.ndarray,
    w1: np.ndarray,
    c1: np.ndarray,
) -> bool:
    """One start ``a``: layers a..b added one by one, out[q, a, b] = least cost for needs[q, b - a]. Returns
    False when the frontier outgrew ``limit`` (exact mode only)."""
    w0[0], c0[0] = 0.0, 0.0
    n = 1
    for b in range(a, last + 1):
        s = save[b]
        if s > 0:
            if grid > 0:
                s = np.floor(s / grid) * grid
            if s > 0:
                n = add_item(w0, c0, n, s, cost[b], cap, w1, c1)
                w0, w1 = w1, w0
                c0, c1 = c1, c0
                if n > limit:
                    return False
        for q in range(needs.shape[0]):
            out[q, a, b] = query(w0, c0, n, needs[q, b - a])
    return True


@numba.njit(cache=True, nogil=True)
def recompute_matrix(
    save: np.ndarray,
    cost: np.ndarray,
    c_static: np.ndarray,
    c_act: np.ndarray,
    held: np.ndarray,
    budget: np.ndarray,
    last: np.ndarray,
    limit: int,
    out: np.ndarray,
    grids: np.ndarray,
) -> None:
    """Least recompute time of every stage a..b (``b <= last[a]``) for each of Q (held, budget) settings.

    save, cost: (L,) bytes a layer saves when recomputed and what recomputing it costs; c_static, c_act: (L + 1,)
    prefix sums of static and activation bytes; held, budget: (Q,). A stage needs
    ``(static + held * act - budget) / held`` bytes saved per micro-batch. out: (Q, L, L), written for
    b in a..last[a] (inf where nothing fits); grids: (L,) the grid used per start (0: exact).
    """
    L = save.shape[0]
    Q = held.shape[0]
    w0, c0 = np.zeros(2 * limit + 2), np.zeros(2 * limit + 2)
    w1, c1 = np.zeros(2 * limit + 2), np.zeros(2 * limit + 2)
    for a in range(L):
        if last[a] < a:
            continue
        span = last[a] - a + 1
        needs = np.empty((Q, span))
        cap = 0.0
        for q in range(Q):
            for t in range(span):
                b = a + t
                needs[q, t] = (c_static[b + 1] - c_static[a] - budget[q]) / held[q] + c_act[b + 1] - c_act[a]
                cap = max(cap, needs[q, t])
        grids[a] = 0.0
        if cap <= 0:
            for q in range(Q):
                for t in range(span):
                    out[q, a, a + t] = 0.0
            continue
        if not _sweep(save, cost, a, last[a], cap, 0.0, limit, needs, out, w0, c0, w1, c1):
            grids[a] = cap / limit
            _sweep(save, cost, a, last[a], cap, grids[a], 2 * limit, needs, out, w0, c0, w1, c1)


@numba.njit(cache=True, nogil=True)
def solve(
    weights: np.ndarray, costs: np.ndarray, need: float, grid: float, limit: int, chosen: np.ndarray
) -> tuple[float, bool]:
    """Least cost of a subset of items whose (grid-floored) weights sum to at least ``need``, and whether the
    frontier stayed within ``limit`` points (False: nothing is returned, retry with a grid). Marks the subset
    in ``chosen`` (bool, per item); the cost is inf when no subset covers ``need``."""
    n_items = weights.shape[0]
    size = 2 * limit + 2
    fw = np.zeros((2, size))
    fc = np.zeros((2, size))
    took = np.zeros((n_items, size), np.bool_)
    parent = np.zeros((n_items, size), np.int64)
    n = 1
    cur = 0
    for t in range(n_items):
        s = weights[t]
        if grid > 0 and s > 0:
            s = np.floor(s / grid) * grid
        if s <= 0:
            for k in range(n):
                parent[t, k] = k
            continue
        n = _merge(fw[cur], fc[cur], n, s, costs[t], need, fw[1 - cur], fc[1 - cur], took[t], parent[t])
        cur = 1 - cur
        if n > limit:
            return np.inf, False
    best = query(fw[cur], fc[cur], n, need)
    if not np.isfinite(best):
        return best, True
    idx = 0
    while fw[cur, idx] < need:
        idx += 1
    for t in range(n_items - 1, -1, -1):
        if took[t, idx]:
            chosen[t] = True
        idx = parent[t, idx]
    return best, True
