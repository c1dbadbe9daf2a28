"""Lower bounds on the simulated step of a partition, from the schedule's order on each rank.

A rank runs its operations one after another, so the step lasts at least as long as one rank's timeline plus
what must happen before its first operation and after its last. For rank ``r``:

- its first operation, ``F`` of its lowest stage ``j0`` on micro-batch 0, starts after ``F`` of the stages
  before: at least ``sum_{k < j0} F_k``;
- it is busy ``m * sum_{j on r} (F_j + B_j + W_j)``;
- it idles in a *window* between ``F(j, i)`` and ``B(j, i)`` of one of its stages: ``B(j, i)`` waits for the
  round trip of micro-batch ``i`` through the stages after ``j`` (``D = sum_{k > j} (F_k + B_k)``, a path in
  the dependency graph), while the rank can only run the operations its order puts between the two; the idle
  time there is at least ``D - (their time)``. Windows that do not overlap in the order add up (the best
  disjoint set is chosen); the windows are ``i = 0`` and ``i = m - 1`` of every stage of the rank;
- after its last ``B`` (stage ``j``), the gradient still crosses the stages before ``j``:
  ``sum_{k < j} B_k``, of which the operations the rank still runs after that ``B`` may hide part.

The bound is the largest over ranks. Stage times are per micro-batch (F, B: input-gradient part under zero
bubble, W: weight gradient), sends included, as the simulator takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schedule import representative_micro_batches, schedule_order

__all__ = ["RankWindows", "Windows", "step_lower_bound"]


@dataclass(frozen=True)
class RankWindows:
    """The order of one rank reduced to what the bound needs. ``stages``: its virtual stages; per window:
    ``x``, ``y`` positions of ``F(j, i)`` and ``B(j, i)``, ``stage`` j and ``between`` (3, S) counts of the
    F / B / W operations of each stage strictly between; ``first``: the stage of the first operation;
    ``last_b`` the stage of the last B and ``after`` (3, S) the counts after it."""

    stages: tuple[int, ...]
    x: tuple[int, ...]
    y: tuple[int, ...]
    stage: tuple[int, ...]
    between: tuple[np.ndarray, ...]
    first: int
    last_b: int
    after: np.ndarray


@dataclass(frozen=True)
class Windows:
    """:class:`RankWindows` of every rank of one schedule, ``ranks`` and ``micro_batches``."""

    ranks: tuple[RankWindows, ...]
    micro_batches: int
    num_stages: int

    @classmethod
    def of(cls, schedule: str, ranks: int, micro_batches: int, virtual_stages: int) -> Windows:
        # the windows and the counts between them are those of a count with the same warm-up and cool-down: only
        # the busy time grows with the micro-batches, and rank_bound takes it from ``micro_batches``
        shown = representative_micro_batches(schedule, ranks, micro_batches, virtual_stages)
        order = schedule_order(schedule, ranks, shown, virtual_stages)
        S = ranks * virtual_stages
        code = {"F": 0, "B": 1, "W": 2}
        out = []
        for ops in order:
            counts = np.zeros((len(ops) + 1, 3, S), np.int64)
            pos = {}
            for p, (kind, j, i) in enumerate(ops):
                counts[p + 1] = counts[p]
                counts[p + 1, code[kind], j] += 1
                pos[(kind, j, i)] = p
            stages = tuple(sorted({j for _, j, _ in ops}))
            xs, ys, js, between = [], [], [], []
            for j in stages:
                for i in sorted({0, shown - 1}):
                    x, y = pos[("F", j, i)], pos[("B", j, i)]
                    xs.append(x)
                    ys.append(y)
                    js.append(j)
                    between.append(counts[y] - counts[x + 1])
            z = max(p for p, (kind, _, _) in enumerate(ops) if kind == "B")
            out.append(
                RankWindows(
                    stages,
                    tuple(xs),
                    tuple(ys),
                    tuple(js),
                    tuple(between),
                    ops[0][1],
                    ops[z][1],
                    counts[-1] - counts[z + 1],
                )
            )
        return cls(tuple(out), micro_batches, S)


def _best_disjoint(x: tuple[int, ...], y: tuple[int, ...], gain: list[np.ndarray]) -> np.ndarray:
    """Largest total gain of windows [x, y] pairwise disjoint in the order (one may end where one starts),
    elementwise over the rows of the gains."""
    order = sorted(range(len(x)), key=lambda t: y[t])
    best = [np.zeros_like(gain[0])]
    for n, t in enumerate(order):
        prev = max((k + 1 for k in range(n) if y[order[k]] <= x[t]), default=0)
        best.append(np.maximum(best[n], best[prev] + gain[t]))
    return best[-1]


def rank_bound(
    w: RankWindows, m: int, f: np.ndarray, b: np.ndarray, wt: np.ndarray, trip: np.ndarray, tail: bool = True
) -> np.ndarray:
    """The bound of one rank for the times in the rows of ``f``, ``b``, ``wt`` (each (n, S)); ``trip[:, j]``
    is (a lower bound of) ``sum_{k > j} (F_k + B_k)``. ``tail=False`` leaves out the tail (when the times
    of the operations after the last B are not known yet)."""
    dur = (f, b, wt)
    own = list(w.stages)
    busy = m * (f[:, own] + b[:, own] + wt[:, own]).sum(axis=1)
    gains = []
    for j, between in zip(w.stage, w.between):
        inside = sum(dur[k][:, q] * between[k, q] for k in range(3) for q in np.flatnonzero(between[k]))
        gains.append(np.maximum(0.0, trip[:, j] - inside))
    idle = _best_disjoint(w.x, w.y, gains)
    start = f[:, : w.first].sum(axis=1)
    out = start + busy + idle
    if tail:
        after = sum(dur[k][:, q] * w.after[k, q] for k in range(3) for q in np.flatnonzero(w.after[k]))
        out = out + np.maximum(0.0, b[:, : w.last_b].sum(axis=1) - after)
    return out


def round_trips(f: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``trip[:, j] = sum_{k > j} (F_k + B_k)`` for each row."""
    t = f + b
    return np.concatenate([np.cumsum(t[:, ::-1], axis=1)[:, ::-1][:, 1:], np.zeros((t.shape[0], 1))], axis=1)


def step_lower_bound(windows: Windows, f: np.ndarray, b: np.ndarray, wt: np.ndarray) -> float:
    """A lower bound on the simulated step for per-stage times ``f``, ``b``, ``wt`` (each (S,))."""
    f, b, wt = (np.asarray(x, dtype=np.float64)[None, :] for x in (f, b, wt))
    trip = round_trips(f, b)
    return max(float(rank_bound(w, windows.micro_batches, f, b, wt, trip)[0]) for w in windows.ranks)
