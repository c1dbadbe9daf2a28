"""Pipeline partition search: contiguous stages of a layer chain, with per-stage recomputation.

Stage ``s`` holding layers ``a..b`` costs, per micro-batch, ``t = forward + backward + recompute + comm``:
the recompute time is that of the optimal per-stage knapsack (``recompute.stage_recompute``) for the stage's
budget when it holds ``held(s)`` micro-batches, and ``comm`` the time to send its output forward and its
input's gradient back (``output_bytes / link_gb_per_s``). Methods:

- ``"exact"``: the partition with the least bottleneck ``max_s t_s`` (which sets the steady-state step time of
  1F1B and GPipe), ties broken by the least ``sum_s t_s``: two dynamic programs over (stage, last layer),
  O(L^2 P) stage evaluations, with memory budgets and fixed stage starts; recompute searched jointly.
- ``"paper"``: OmniBal's search: a greedy anchor partition (cut where the running time passes ``s/P`` of the
  total), candidates moving every boundary by at most ``radius`` layers, ranked by the spread of stage compute
  and communication (squared deviations from the anchor's means, summed; a k-best dynamic program finds the
  ``top_k`` exactly), then scored by the schedule simulator; the fastest simulated step wins.
- ``"uniform"``: equal layer counts (the first ``L mod P`` stages one more), what users do by default.

Recompute modes: ``"plan"`` (optimal per stage, the memory balance), ``"uniform"`` (one setting for every stage:
none if every stage fits, else every layer), ``"all"``, ``"none"``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from .profile import ModelProfile, as_profile
from .recompute import _add_item, stage_recompute
from .schedule import SCHEDULES, held_micro_batches, simulate

__all__ = ["METHODS", "RECOMPUTE_MODES", "PipelinePlan", "partition", "evaluate_partition", "uniform_stages"]

METHODS = ("exact", "paper", "uniform")
RECOMPUTE_MODES = ("plan", "uniform", "all", "none")
_GB = 1e9


@dataclass(frozen=True)
class PipelinePlan:
    """A partition with its recompute choice and the simulated step.

    ``stages``: ``(first, last)`` layer indices per stage, inclusive, contiguous, covering the chain;
    ``recompute``: per stage, the (global) indices of recomputed layers; ``step_ms``, ``bubble``: the simulated
    step; ``peak_bytes``: per stage; ``stage_ms``: per stage and micro-batch, forward + backward + recompute +
    communication; ``activation_bytes``: per stage, the bytes one micro-batch keeps for backward under the
    recompute choice; ``fits``: every stage within its budget.
    """

    stages: tuple[tuple[int, int], ...]
    recompute: tuple[tuple[int, ...], ...]
    step_ms: float
    bubble: float
    peak_bytes: tuple[int, ...]
    stage_ms: tuple[float, ...]
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    comm_ms: tuple[float, ...]
    activation_bytes: tuple[int, ...]
    fits: bool
    method: str
    schedule: str
    micro_batches: int
    names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms)

    def layer_names(self, stage: int) -> list[str]:
        """Names of the layers of ``stage``."""
        first, last = self.stages[stage]
        return list(self.names[first:last + 1])

    def recompute_names(self, stage: int) -> list[str]:
        """Names of the recomputed layers of ``stage`` (for ``apply_recompute``)."""
        return [self.names[j] for j in self.recompute[stage]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method, "schedule": self.schedule, "micro_batches": self.micro_batches,
            "stages": [list(s) for s in self.stages], "recompute": [list(r) for r in self.recompute],
            "step_ms": self.step_ms, "bubble": self.bubble, "peak_bytes": list(self.peak_bytes),
            "stage_ms": list(self.stage_ms), "bottleneck_ms": self.bottleneck_ms,
            "activation_bytes": list(self.activation_bytes), "fits": self.fits,
        }


def uniform_stages(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Equal layer counts, the first ``num_layers % stages`` stages one layer more."""
    base, extra = divmod(num_layers, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n - 1))
        start += n
    return out


class _Costs:
    """Stage costs t(a, b, s) of one profile under one setting (budgets, schedule, recompute mode)."""

    def __init__(self, profile: ModelProfile, stages: int, micro_batches: int, schedule: str,
                 budgets: Optional[list[float]], mode: str, link_gb_per_s: float) -> None:
        self.profile = profile
        self.L = len(profile)
        self.P = stages
        self.m = micro_batches
        self.schedule = schedule
        self.budgets = budgets
        self.mode = mode
        self.fwd = profile.forward_ms
        self.bwd = profile.backward_ms
        self.act = profile.activation_bytes
        self.inp = profile.input_bytes_per_layer
        self.static = profile.static_bytes
        self.out = profile.output_bytes
        self.send_ms = self.out / (link_gb_per_s * _GB) * 1e3 if link_gb_per_s else np.zeros(self.L)
        z = np.zeros(1)
        self.c_fwd = np.concatenate([z, np.cumsum(self.fwd)])
        self.c_train = np.concatenate([z, np.cumsum(self.fwd + self.bwd)])
        self.c_act = np.concatenate([z, np.cumsum(self.act)])
        self.c_inp = np.concatenate([z, np.cumsum(self.inp)])
        self.c_static = np.concatenate([z, np.cumsum(self.static)])
        self._fronts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._matrix: dict[int, np.ndarray] = {}

    def held(self, s: int) -> int:
        return held_micro_batches(self.schedule, self.P, self.m, s)

    def budget(self, s: int) -> Optional[float]:
        return None if self.budgets is None else self.budgets[s]

    def comm(self, a: int, b: int) -> float:
        """Send time of a stage a..b: its output forward, its input's gradient back."""
        return (self.send_ms[b] if b < self.L - 1 else 0.0) + (self.send_ms[a - 1] if a > 0 else 0.0)

    def _front(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        row = self._fronts.get(a)
        if row is None:
            row = []
            w, c = np.zeros(1), np.zeros(1)
            for j in range(a, self.L):
                save = self.act[j] - self.inp[j]
                if save > 0:
                    w, c = _add_item(w, c, save, self.fwd[j])
                row.append((w, c))
            self._fronts[a] = row
        return row[b - a]

    def recompute_ms(self, a: int, b: int, s: int) -> float:
        """Least recompute time for stage s = a..b to fit (inf when it cannot)."""
        k = self.held(s)
        static = self.c_static[b + 1] - self.c_static[a]
        act = self.c_act[b + 1] - self.c_act[a]
        budget = self.budget(s)
        fits = budget is None or static + k * act <= budget
        if self.mode == "none":
            return 0.0 if fits else math.inf
        if self.mode == "all":
            kept = self.c_inp[b + 1] - self.c_inp[a]
            ok = budget is None or static + k * kept <= budget
            return self.c_fwd[b + 1] - self.c_fwd[a] if ok else math.inf
        if fits:
            return 0.0
        need = (static + k * act - budget) / k
        w, c = self._front(a, b)
        i = int(np.searchsorted(w, need, side="left"))
        return float(c[i]) if i < w.size else math.inf

    def matrix(self, s: int) -> np.ndarray:
        """(L, L) stage times for stage s (inf where a > b or the stage cannot fit)."""
        k = self.held(s)
        key = k if self.budgets is None or len(set(self.budgets)) == 1 else (k, s)
        cached = self._matrix.get(key)
        if cached is not None:
            return cached
        L = self.L
        a_idx, b_idx = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
        valid = a_idx <= b_idx
        train = self.c_train[b_idx + 1] - self.c_train[a_idx]
        comm = np.where(b_idx < L - 1, self.send_ms[np.minimum(b_idx, L - 1)], 0.0) + \
            np.where(a_idx > 0, self.send_ms[np.maximum(a_idx - 1, 0)], 0.0)
        t = np.where(valid, train + comm, np.inf)
        if (self.budgets is not None and self.mode != "none") or self.mode == "all":
            for a in range(L):
                for b in range(a, L):
                    t[a, b] += self.recompute_ms(a, b, s)
        elif self.budgets is not None:
            static = self.c_static[b_idx + 1] - self.c_static[a_idx]
            act = self.c_act[b_idx + 1] - self.c_act[a_idx]
            t = np.where(static + k * act <= self.budget(s), t, np.inf)
        self._matrix[key] = t
        return t

    def stage_time(self, a: int, b: int, s: int) -> float:
        return float(self.matrix(s)[a, b])


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_choices(recompute: str, schedule: str, link_gb_per_s: float) -> None:
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not link_gb_per_s >= 0:
        raise ValueError(f"link_gb_per_s must be >= 0, got {link_gb_per_s}")


def _budgets(memory_bytes: Union[None, float, Sequence[float]], stages: int) -> Optional[list[float]]:
    if memory_bytes is None:
        return None
    if isinstance(memory_bytes, (int, float, np.integer, np.floating)) and not isinstance(memory_bytes, bool):
        values = [float(memory_bytes)] * stages
    else:
        values = [float(v) for v in memory_bytes]
        if len(values) != stages:
            raise ValueError(f"memory_bytes: {len(values)} per-stage budgets for {stages} stages")
    for s, v in enumerate(values):
        if not v > 0:
            raise ValueError(f"memory_bytes: the budget of stage {s} must be > 0, got {v}")
    return values


def _fixed(fixed_starts: Optional[Mapping[int, int]], stages: int, layers: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, first in dict(fixed_starts or {}).items():
        s = _check_int("fixed_starts stage", s, 0)
        first = _check_int("fixed_starts layer", first, 0)
        if s >= stages or first >= layers:
            raise ValueError(f"fixed_starts: stage {s} at layer {first} is outside {stages} stages / {layers} layers")
        if (s == 0) != (first == 0):
            raise ValueError(f"fixed_starts: stage {s} cannot start at layer {first} (only stage 0 starts at 0)")
        out[s] = first
    starts = sorted(out.items())
    for (s0, f0), (s1, f1) in zip(starts, starts[1:]):
        if f1 - f0 < s1 - s0:
            raise ValueError(f"fixed_starts: stages {s0}..{s1} cannot fit between layers {f0} and {f1}")
    return out


def _check_layers_fit(costs: _Costs) -> None:
    """A layer that cannot fit any stage even alone and recomputed makes every partition infeasible."""
    if costs.budgets is None:
        return
    for j in range(costs.L):
        if all(not math.isfinite(costs.recompute_ms(j, j, s)) for s in range(costs.P)):
            layer = costs.profile.layers[j]
            raise ValueError(
                f"layer {j} ({layer.name!r}) does not fit any stage's memory budget even alone with recomputation "
                f"(static {layer.static_bytes / 2**30:.2f} GiB, recompute mode {costs.mode!r})")


def _exact(costs: _Costs, fixed: dict[int, int]) -> Optional[list[tuple[int, int]]]:
    L, P = costs.L, costs.P
    mats = [costs.matrix(s) for s in range(P)]

    def allowed_starts(s: int, b: int) -> np.ndarray:
        # stage s = a..b: a >= s (earlier stages non-empty), a <= b
        a = np.arange(s, b + 1)
        if s in fixed:
            a = a[a == fixed[s]]
        if s + 1 in fixed and b != fixed[s + 1] - 1:
            return a[:0]
        return a

    def run(combine: str, cap: float) -> tuple[np.ndarray, np.ndarray]:
        best = np.full((P, L), np.inf)
        arg = np.full((P, L), -1, dtype=np.int64)
        for s in range(P):
            for b in range(s, L - (P - 1 - s)):
                a = allowed_starts(s, b)
                if a.size == 0:
                    continue
                t = mats[s][a, b]
                t = np.where(t <= cap, t, np.inf)
                prev = np.zeros(a.size) if s == 0 else best[s - 1, a - 1]
                if s == 0:
                    t = np.where(a == 0, t, np.inf)
                val = np.maximum(prev, t) if combine == "max" else prev + t
                i = int(np.argmin(val))
                if math.isfinite(val[i]):
                    best[s, b] = val[i]
                    arg[s, b] = a[i]
        return best, arg

    best, _ = run("max", math.inf)
    tau = best[P - 1, L - 1]
    if not math.isfinite(tau):
        return None
    best, arg = run("sum", tau * (1 + 1e-12))
    stages, b = [], L - 1
    for s in range(P - 1, -1, -1):
        a = int(arg[s, b])
        stages.append((a, b))
        b = a - 1
    return stages[::-1]


def _anchor(costs: _Costs) -> list[int]:
    """Greedy: stage s starts where the running train time first passes s/P of the total (closest cut)."""
    L, P = costs.L, costs.P
    c = costs.c_train
    starts = [0]
    for s in range(1, P):
        target = c[-1] * s / P
        j = int(np.searchsorted(c, target))
        if j > 0 and abs(c[j - 1] - target) <= abs(c[min(j, L)] - target):
            j -= 1
        j = min(max(j, starts[-1] + 1), L - (P - s))
        starts.append(j)
    return starts


def _paper_candidates(costs: _Costs, fixed: dict[int, int], radius: int, top_k: int) -> list[list[int]]:
    """The ``top_k`` stage-start lists around the anchor with the least spread (k-best DP, exact)."""
    L, P = costs.L, costs.P
    anchor = _anchor(costs)
    anchor_stages = list(zip(anchor, anchor[1:] + [L]))
    compute = [costs.c_train[b] - costs.c_train[a] for a, b in anchor_stages]
    comm = [costs.comm(a, b - 1) for a, b in anchor_stages]
    mean_t, mean_c = float(np.mean(compute)), float(np.mean(comm))

    def spread(a: int, b: int, s: int) -> float:  # stage a..b inclusive
        rec = costs.recompute_ms(a, b, s)
        if not math.isfinite(rec):
            return math.inf
        t = costs.c_train[b + 1] - costs.c_train[a] + rec
        return (t - mean_t) ** 2 + (costs.comm(a, b) - mean_c) ** 2

    options = [[0]]
    for s in range(1, P):
        if s in fixed:
            options.append([fixed[s]])
        else:
            options.append([j for j in range(anchor[s] - radius, anchor[s] + radius + 1) if s <= j <= L - (P - s)])
    # frontier[j] = up to top_k (score, starts) with stage s starting at j
    frontier: dict[int, list[tuple[float, tuple[int, ...]]]] = {0: [(0.0, (0,))]}
    for s in range(1, P + 1):
        nxt: dict[int, list[tuple[float, tuple[int, ...]]]] = {}
        for j in (options[s] if s < P else [L]):
            cands = []
            for i, paths in frontier.items():
                if i >= j:
                    continue
                add = spread(i, j - 1, s - 1)
                if math.isfinite(add):
                    cands.extend((score + add, starts + ((j,) if s < P else ())) for score, starts in paths)
            if cands:
                nxt[j] = heapq.nsmallest(top_k, cands)
        frontier = nxt
    return [list(starts) for _, starts in frontier.get(L, [])]


def _plan_for(costs: _Costs, stages: list[tuple[int, int]], method: str, link_gb_per_s: float) -> PipelinePlan:
    prof = costs.profile
    fwd, bwd, comm_out, recs, stage_ms, act, static = [], [], [], [], [], [], []
    fits = True
    for s, (a, b) in enumerate(stages):
        k = costs.held(s)
        st = float(costs.c_static[b + 1] - costs.c_static[a])
        budget = costs.budget(s)
        if costs.mode == "none" or (costs.mode == "plan" and budget is None):
            chosen, rec_ms = [], 0.0
        elif costs.mode == "all":
            chosen, rec_ms = list(range(b - a + 1)), float(costs.c_fwd[b + 1] - costs.c_fwd[a])
        else:
            found = stage_recompute(costs.act[a:b + 1], costs.inp[a:b + 1], costs.fwd[a:b + 1], st, k, budget)
            if found is None:  # cannot fit: recompute everything worth it and report the overflow
                chosen = [j for j in range(b - a + 1) if costs.act[a + j] > costs.inp[a + j]]
                rec_ms = float(sum(costs.fwd[a + j] for j in chosen))
            else:
                rec_ms, chosen, _ = found
        kept = float(costs.c_act[b + 1] - costs.c_act[a]) - sum(costs.act[a + j] - costs.inp[a + j] for j in chosen)
        recs.append(tuple(a + j for j in chosen))
        f = float(costs.c_fwd[b + 1] - costs.c_fwd[a])
        bw = float(costs.c_train[b + 1] - costs.c_train[a]) - f + rec_ms
        fwd.append(f)
        bwd.append(bw)
        act.append(kept)
        static.append(st)
        stage_ms.append(f + bw + costs.comm(a, b))
        if b < costs.L - 1:
            comm_out.append(float(costs.send_ms[b]))
        if budget is not None and st + k * kept > budget * (1 + 1e-9):
            fits = False
    sim = simulate(fwd, bwd, costs.m, schedule=costs.schedule, comm_ms=comm_out, activation_bytes=act,
                   static_bytes=static)
    return PipelinePlan(
        stages=tuple((int(a), int(b)) for a, b in stages), recompute=tuple(recs), step_ms=sim.step_ms,
        bubble=sim.bubble, peak_bytes=sim.peak_bytes, stage_ms=tuple(stage_ms), forward_ms=tuple(fwd),
        backward_ms=tuple(bwd), comm_ms=tuple(comm_out), activation_bytes=tuple(int(round(k)) for k in act),
        fits=fits, method=method, schedule=costs.schedule,
        micro_batches=costs.m, names=tuple(prof.names))


def _modes(mode: str) -> list[str]:
    return ["none", "all"] if mode == "uniform" else [mode]


def evaluate_partition(
    profile: Any,
    stages: Sequence[Sequence[int]],
    *,
    micro_batches: int,
    memory_bytes: Union[None, float, Sequence[float]] = None,
    schedule: str = "1f1b",
    recompute: str = "plan",
    link_gb_per_s: float = 25.0,
    method: str = "given",
) -> PipelinePlan:
    """The recompute choice and simulated step of a given partition (``stages`` as ``(first, last)`` pairs)."""
    profile = as_profile(profile)
    micro_batches = _check_int("micro_batches", micro_batches, 1)
    _check_choices(recompute, schedule, link_gb_per_s)
    stage_list = [(int(a), int(b)) for a, b in stages]
    L = len(profile)
    if not stage_list or stage_list[0][0] != 0 or stage_list[-1][1] != L - 1 or any(
            b < a or (i and a != stage_list[i - 1][1] + 1) for i, (a, b) in enumerate(stage_list)):
        raise ValueError(f"stages must be contiguous non-empty (first, last) pairs covering layers 0..{L - 1}, "
                         f"got {stage_list}")
    P = len(stage_list)
    budgets = _budgets(memory_bytes, P)
    plans = [_plan_for(_Costs(profile, P, micro_batches, schedule, budgets, m, link_gb_per_s), stage_list,
                       method, link_gb_per_s) for m in _modes(recompute)]
    fitting = [p for p in plans if p.fits]
    return fitting[0] if fitting else plans[-1]


def partition(
    profile: Any,
    stages: int,
    *,
    micro_batches: int,
    memory_bytes: Union[None, float, Sequence[float]] = None,
    method: str = "exact",
    recompute: str = "plan",
    schedule: str = "1f1b",
    fixed_starts: Optional[Mapping[int, int]] = None,
    link_gb_per_s: float = 25.0,
    radius: int = 2,
    top_k: int = 8,
) -> PipelinePlan:
    """Splits a layer chain into ``stages`` pipeline stages with a per-stage recomputation plan.

    Args:
        profile: a ``ModelProfile`` (or its dict form).
        stages: P, the number of pipeline stages (1 <= P <= layers).
        micro_batches: m, micro-batches per step (sets how many each stage holds under 1F1B).
        memory_bytes: one budget for every stage or one per stage; ``None``: memory is no constraint.
        method: ``"exact"``, ``"paper"`` or ``"uniform"`` (module docstring).
        recompute: ``"plan"``, ``"uniform"``, ``"all"`` or ``"none"`` (module docstring).
        schedule: ``"1f1b"`` or ``"gpipe"``.
        fixed_starts: ``{stage: first layer}`` boundaries the search must keep (e.g. ``{1: n_vit}`` puts the
            whole ViT on stage 0).
        link_gb_per_s: GB/s between consecutive stages (0: communication is free).
        radius, top_k: the paper search's neighbourhood and number of candidates simulated.

    Raises ``ValueError`` when no partition fits the budgets (naming a layer that fits no stage when there is
    one). The uniform split is returned even when it does not fit (``fits`` tells).
    """
    profile = as_profile(profile)
    L = len(profile)
    P = _check_int("stages", stages, 1)
    m = _check_int("micro_batches", micro_batches, 1)
    if P > L:
        raise ValueError(f"stages ({P}) must not exceed the number of layers ({L})")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    _check_choices(recompute, schedule, link_gb_per_s)
    radius = _check_int("radius", radius, 0)
    top_k = _check_int("top_k", top_k, 1)
    budgets = _budgets(memory_bytes, P)
    fixed = _fixed(fixed_starts, P, L)
    if method == "uniform":
        return evaluate_partition(profile, uniform_stages(L, P), micro_batches=m, memory_bytes=budgets,
                                  schedule=schedule, recompute=recompute, link_gb_per_s=link_gb_per_s,
                                  method="uniform")
    best: Optional[PipelinePlan] = None
    errors = []
    for mode in _modes(recompute):
        costs = _Costs(profile, P, m, schedule, budgets, mode, link_gb_per_s)
        try:
            _check_layers_fit(costs)
        except ValueError as exc:
            errors.append(exc)
            continue
        if method == "exact":
            found = _exact(costs, fixed)
            cands = [] if found is None else [_plan_for(costs, found, "exact", link_gb_per_s)]
        else:
            starts = _paper_candidates(costs, fixed, radius, top_k)
            cands = [_plan_for(costs, list(zip(st, [x - 1 for x in st[1:]] + [L - 1])), "paper", link_gb_per_s)
                     for st in starts]
        for plan in cands:
            if not plan.fits:
                continue
            key = (plan.bottleneck_ms, sum(plan.stage_ms)) if method == "exact" else (plan.step_ms,)
            if best is None or key < ((best.bottleneck_ms, sum(best.stage_ms)) if method == "exact"
                                      else (best.step_ms,)):
                best = plan
    if best is None:
        if errors and len(errors) == len(_modes(recompute)):
            raise errors[-1]
        where = "" if method == "exact" else f" within radius {radius} of the anchor"
        raise ValueError(f"no partition into {P} stages fits the memory budget{where} "
                         f"(recompute mode {recompute!r}, schedule {schedule!r}, {m} micro-batches)")
    return best
