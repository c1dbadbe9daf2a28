"""What a stage of a partition costs: per-interval times and memory of one profile under one setting.

Virtual stage ``j`` holding layers ``a..b`` runs, per micro-batch, a forward ``F = forward + checkpoint + send
out`` and a backward ``B = backward + recompute + send in`` (sends only between stages on different ranks, as
``output_bytes / link_gb_per_s``); ``recompute`` and ``checkpoint`` sum the profile's ``recompute_ms`` and
``checkpoint_forward_ms`` over the recomputed layers, and a recompute choice costs both. Under zero bubble
``B`` is the input-gradient part, ``(1 - weight_fraction)`` of the backward plus the recomputation, and ``W``
the rest. A rank holding stages with ``held_j``
micro-batches alive at their peaks needs ``static + sum_j held_j * kept_j`` bytes (an upper bound on the
simulated peak, which is exact when each rank holds one stage); ``kept`` is the activation bytes of the layers
that are not recomputed plus the input bytes of those that are.

Recompute modes: ``"plan"`` (the least recompute time that fits, per rank: a knapsack over its layers),
``"all"`` (every layer), ``"none"``; ``"uniform"`` is resolved by the caller (none if every rank fits, else all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ._frontier import recompute_matrix, solve
from .profile import ModelProfile
from .recompute import FRONTIER_POINTS, cover
from .schedule import ZERO_BUBBLE, held_micro_batches, stage_ranks

__all__ = ["RankChoice", "StageCosts"]

_GB = 1e9


@dataclass(frozen=True)
class RankChoice:
    """The recompute choice of one rank: ``chosen`` (global layer indices per virtual stage of the rank),
    ``recompute_ms`` (added to the backward) and ``kept_bytes`` per stage, ``memory_bytes`` (static + held *
    kept, summed), ``fits``, ``slack_bytes`` (0 when the choice is exactly optimal) and
    ``checkpoint_forward_ms`` per stage (added to the forward; empty: none)."""

    chosen: tuple[tuple[int, ...], ...]
    recompute_ms: tuple[float, ...]
    kept_bytes: tuple[float, ...]
    memory_bytes: float
    fits: bool
    slack_bytes: float
    checkpoint_forward_ms: tuple[float, ...] = ()


def _least_shares(rec_f: np.ndarray, rec_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L, L) each: over the layers a..b, the least share of a layer's recompute cost that lands in the forward
    and the least that lands in the backward (layers of no cost left out; 0 and 1 where every layer is). A
    choice of cost ``C`` among them adds at least ``share * C`` to each pass."""
    total = rec_f + rec_b
    costly = total > 0
    f = np.ones_like(total)
    b = np.ones_like(total)
    np.divide(rec_f, total, out=f, where=costly)
    np.divide(rec_b, total, out=b, where=costly)
    L = total.size
    out_f, out_b = np.zeros((L, L)), np.ones((L, L))
    for a in range(L):
        any_costly = np.logical_or.accumulate(costly[a:])
        out_f[a, a:] = np.where(any_costly, np.minimum.accumulate(f[a:]), 0.0)
        out_b[a, a:] = np.where(any_costly, np.minimum.accumulate(b[a:]), 1.0)
    return out_f, out_b


class StageCosts:
    """Interval costs of ``profile`` on ``ranks * virtual_stages`` virtual stages under one setting.

    ``budgets``: per rank bytes (``None``: memory is no constraint). Prefix sums make every interval sum O(1).
    """

    def __init__(
        self,
        profile: ModelProfile,
        ranks: int,
        virtual_stages: int,
        micro_batches: int,
        schedule: str,
        budgets: Optional[list[float]],
        mode: str,
        link_gb_per_s: float,
        weight_fraction: float,
    ) -> None:
        self.profile = profile
        self.L, self.P, self.v = len(profile), ranks, virtual_stages
        self.S = ranks * virtual_stages
        self.m, self.schedule, self.budgets, self.mode = micro_batches, schedule, budgets, mode
        self.rank_of = np.asarray(stage_ranks(schedule, ranks, virtual_stages), dtype=np.int64)
        self.held = np.array(
            [
                held_micro_batches(schedule, ranks, micro_batches, j, virtual_stages=virtual_stages)
                for j in range(self.S)
            ],
            dtype=np.float64,
        )
        self.cross_out = np.append(self.rank_of[:-1] != self.rank_of[1:], False)
        self.cross_in = np.insert(self.rank_of[1:] != self.rank_of[:-1], 0, False)
        self.wf = weight_fraction if schedule in ZERO_BUBBLE else 0.0
        self.fwd, self.bwd = profile.forward_ms, profile.backward_ms
        # what recomputing each layer adds to its backward and to its forward; a choice pays both
        self.rec_b, self.rec_f = profile.recompute_ms, profile.checkpoint_forward_ms
        self.rec = self.rec_f + self.rec_b
        self.act, self.inp = profile.activation_bytes, profile.input_bytes_per_layer
        self.static = profile.static_bytes
        self.send_ms = profile.output_bytes / (link_gb_per_s * _GB) * 1e3 if link_gb_per_s else np.zeros(self.L)
        z = np.zeros(1)
        self.c_fwd = np.concatenate([z, np.cumsum(self.fwd)])
        self.c_bwd = np.concatenate([z, np.cumsum(self.bwd)])
        self.c_rec = np.concatenate([z, np.cumsum(self.rec)])
        self.shares = _least_shares(self.rec_f, self.rec_b)
        self.c_act = np.concatenate([z, np.cumsum(self.act)])
        self.c_inp = np.concatenate([z, np.cumsum(self.inp)])
        # the least a stage can keep: a layer is recomputed only where its input is smaller than what it saves
        self.c_least = np.concatenate([z, np.cumsum(np.minimum(self.act, self.inp))])
        self.c_static = np.concatenate([z, np.cumsum(self.static)])
        # Lower bound of what the layers from b + 1 on add to a round trip (forward and input gradient).
        self.rest = (self.c_fwd[-1] - self.c_fwd) + (1.0 - self.wf) * (self.c_bwd[-1] - self.c_bwd)
        self._rank_cache: dict[tuple, RankChoice] = {}
        self.grids: Optional[np.ndarray] = None  # set by recompute_matrices: the grid per start it used
        self.last: Optional[np.ndarray] = None  # and the last layer a stage from each start may end at

    # ---- sums over an interval a..b (inclusive) --------------------------------------------------------
    def span(self, c: np.ndarray, a, b):
        return c[np.asarray(b) + 1] - c[a]

    def budget(self, rank: int) -> Optional[float]:
        return None if self.budgets is None else self.budgets[rank]

    def send_out(self, j: Union[int, np.ndarray], b):
        """Send time after stage j ending at layer b (0 at the chain's end or to the same rank)."""
        b = np.asarray(b)
        return np.where((b < self.L - 1) & self.cross_out[j], self.send_ms[np.minimum(b, self.L - 1)], 0.0)

    def send_in(self, j: Union[int, np.ndarray], a):
        """Send time of the input gradient of stage j starting at layer a."""
        a = np.asarray(a)
        return np.where((a > 0) & self.cross_in[j], self.send_ms[np.maximum(a - 1, 0)], 0.0)

    def parts(self, j: Union[int, np.ndarray], a, b, recompute_ms=0.0, checkpoint_ms=0.0):
        """``(F, B, W)`` of stage j = a..b per micro-batch (arrays broadcast over a and b), ``recompute_ms``
        added to B and ``checkpoint_ms`` to F."""
        f = self.span(self.c_fwd, a, b) + checkpoint_ms
        bt = self.span(self.c_bwd, a, b)
        return (f + self.send_out(j, b), (1.0 - self.wf) * bt + recompute_ms + self.send_in(j, a), self.wf * bt)

    def least_parts(self, j: Union[int, np.ndarray], a, b, least_ms):
        """``(F, B, W)`` of stage j = a..b, each at most its value under every recompute choice that costs at
        least ``least_ms`` (a recompute matrix's entry): the least share of each layer's cost that lands in the
        forward (or the backward) over the layers a..b, times ``least_ms``."""
        share_f, share_b = self.shares[0][a, b], self.shares[1][a, b]
        least_ms = np.asarray(least_ms, dtype=np.float64)
        # an infinite cost (nothing fits) stays in the backward, as ``parts`` takes it
        inf = ~np.isfinite(least_ms)
        finite = np.where(inf, 0.0, least_ms)
        rec_b = np.where(inf | (share_b >= 1.0), least_ms, share_b * finite)
        return self.parts(j, a, b, rec_b, share_f * finite)

    # ---- memory ---------------------------------------------------------------------------------------
    def lone_recompute(self, j: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A lower bound on stage j's recompute time as one stage of its rank: 0 where it can fit with
        ``mode`` (alone, the other stages of the rank taking nothing), inf where it cannot."""
        budget = self.budget(int(self.rank_of[j]))
        if self.mode == "all":
            rec = self.span(self.c_rec, a, b)
            kept = self.span(self.c_inp, a, b)
        else:
            rec = np.zeros(np.broadcast(a, b).shape)
            kept = self.span(self.c_least if self.mode == "plan" else self.c_act, a, b)
        if budget is None:
            return rec
        ok = self.span(self.c_static, a, b) + self.held[j] * kept <= budget
        return np.where(ok, rec, np.inf)

    def recompute_matrices(self, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(S, L, L) least recompute ms per stage for b <= last[a] (inf elsewhere and where nothing fits), and
        (L,) the grid of each start (0: exact). With one stage per rank they are the recompute times
        ``rank_choice`` gives from then on; with several, lower bounds (``lone_recompute``)."""
        L = self.L
        out = np.full((self.S, L, L), np.inf)
        grids = np.zeros(L)
        self.last = np.asarray(last, dtype=np.int64)
        if self.mode != "plan" or self.budgets is None or self.v > 1:
            a, b = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
            for j in range(self.S):
                out[j] = np.where((a <= b) & (b <= last[:, None]), self.lone_recompute(j, a, b), np.inf)
            return out, grids
        keys = sorted({(self.held[j], self.budgets[int(self.rank_of[j])]) for j in range(self.S)})
        held = np.array([k for k, _ in keys])
        budget = np.array([bb for _, bb in keys])
        mats = np.full((len(keys), L, L), np.inf)
        recompute_matrix(
            self.act - self.inp,
            self.rec.copy(),
            self.c_static,
            self.c_act,
            held,
            budget,
            np.asarray(last, dtype=np.int64),
            FRONTIER_POINTS,
            mats,
            grids,
        )
        for j in range(self.S):
            out[j] = mats[keys.index((self.held[j], self.budgets[int(self.rank_of[j])]))]
        self.grids = grids
        self._rank_cache.clear()
        return out, grids

    def rank_choice(self, intervals: Sequence[tuple[int, int, int]]) -> RankChoice:
        """The recompute choice of one rank holding ``(stage j, a, b)`` for each of its stages."""
        key = tuple(intervals)
        found = self._rank_cache.get(key)
        if found is None:
            found = self._rank_choice(key)
            if len(self._rank_cache) > 100_000:
                self._rank_cache.clear()
            self._rank_cache[key] = found
        return found

    def _rank_choice(self, intervals: tuple[tuple[int, int, int], ...]) -> RankChoice:
        rank = int(self.rank_of[intervals[0][0]])
        budget = self.budget(rank)
        layers = [np.arange(a, b + 1) for _, a, b in intervals]
        held = [self.held[j] for j, _, _ in intervals]
        static = sum(float(self.span(self.c_static, a, b)) for _, a, b in intervals)
        act = [float(self.span(self.c_act, a, b)) for _, a, b in intervals]
        inp = [float(self.span(self.c_inp, a, b)) for _, a, b in intervals]
        n = len(intervals)
        if self.mode == "all":
            chosen = [tuple(int(x) for x in ls) for ls in layers]
            rec = [float(self.rec_b[ls].sum()) for ls in layers]
            rec_f = [float(self.rec_f[ls].sum()) for ls in layers]
            kept = inp
        elif self.mode == "none" or budget is None or static + sum(h * x for h, x in zip(held, act)) <= budget:
            chosen, rec, rec_f, kept = [()] * n, [0.0] * n, [0.0] * n, act
        else:
            items = np.concatenate(layers)
            if n == 1:
                # per micro-batch, the arithmetic of recompute_matrix, so both give one answer
                _, a, b = intervals[0]
                weights = self.act[items] - self.inp[items]
                need = (self.c_static[b + 1] - self.c_static[a] - budget) / held[0] + self.c_act[b + 1] - self.c_act[a]
                scale = held[0]
            else:
                weights = np.concatenate([h * (self.act[ls] - self.inp[ls]) for h, ls in zip(held, layers)])
                need = static + sum(h * x for h, x in zip(held, act)) - budget
                scale = 1.0
            if n == 1 and self.grids is not None:
                mask = np.zeros(items.size, np.bool_)
                found: Optional[tuple[Union[np.ndarray, list[int]], float]]
                cost, _ = solve(weights, self.rec[items], float(need), float(self.grids[a]), 2 * FRONTIER_POINTS, mask)
                found = None if not math.isfinite(cost) else (np.flatnonzero(mask), float(self.grids[a]))
            else:
                got = cover(weights, self.rec[items], need)
                found = None if got is None else (got.chosen, got.grid)
            if found is None:  # cannot fit: recompute every layer worth it and report the overflow
                take = {int(items[t]) for t in np.flatnonzero(weights > 0)}
                slack = 0.0
            else:
                take = {int(items[t]) for t in found[0]}
                slack = scale * found[1] * int((weights > 0).sum())
            chosen = [tuple(int(x) for x in ls if int(x) in take) for ls in layers]
            rec, rec_f, kept, memory = self._priced(chosen, act, held, static)
            return RankChoice(
                tuple(chosen),
                tuple(rec),
                tuple(kept),
                memory,
                bool(memory <= budget * (1 + 1e-9) and found is not None),
                float(slack),
                tuple(rec_f),
            )
        memory = static + sum(h * k for h, k in zip(held, kept))
        fits = budget is None or memory <= budget * (1 + 1e-9)
        return RankChoice(
            tuple(chosen), tuple(rec), tuple(float(k) for k in kept), float(memory), bool(fits), 0.0, tuple(rec_f)
        )

    def given_choice(self, intervals: Sequence[tuple[int, int, int]], chosen: Sequence[tuple[int, ...]]) -> RankChoice:
        """One rank holding ``(stage j, a, b)`` for each of its stages with the layers ``chosen`` (global
        indices, per stage) recomputed: what that choice costs and keeps, and whether it fits."""
        budget = self.budget(int(self.rank_of[intervals[0][0]]))
        held = [self.held[j] for j, _, _ in intervals]
        static = sum(float(self.span(self.c_static, a, b)) for _, a, b in intervals)
        act = [float(self.span(self.c_act, a, b)) for _, a, b in intervals]
        rec, rec_f, kept, memory = self._priced(chosen, act, held, static)
        fits = budget is None or memory <= budget * (1 + 1e-9)
        return RankChoice(
            tuple(tuple(c) for c in chosen), tuple(rec), tuple(kept), memory, bool(fits), 0.0, tuple(rec_f)
        )

    def _priced(
        self, chosen: Sequence[Sequence[int]], act: Sequence[float], held: Sequence[float], static: float
    ) -> tuple[list[float], list[float], list[float], float]:
        """Per stage what recomputing ``chosen`` adds to the backward and to the forward and the kept activation
        bytes (of stages keeping ``act`` without it, ``held`` micro-batches of each), and the rank's memory."""
        rec = [float(self.rec_b[list(c)].sum()) if c else 0.0 for c in chosen]
        rec_f = [float(self.rec_f[list(c)].sum()) if c else 0.0 for c in chosen]
        kept = [float(a - sum(self.act[x] - self.inp[x] for x in c)) for a, c in zip(act, chosen)]
        return rec, rec_f, kept, float(static + sum(h * k for h, k in zip(held, kept)))

    def layer_fits_alone(self, j: int) -> bool:
        """Whether layer ``j`` fits some rank even alone and recomputed under ``mode``."""
        if self.budgets is None:
            return True
        for s in range(self.S):
            if math.isfinite(float(self.lone_recompute(s, np.array(j), np.array(j)))):
                return True
        return False
