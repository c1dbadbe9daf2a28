"""Pipeline partition search: contiguous stages of a layer chain, with per-rank recomputation.

``P`` ranks run ``S = P * virtual_stages`` virtual stages (chunks), placed as the schedule places them
(:func:`~omnibal_kernels.pipeline.schedule.stage_ranks`); stage and memory costs are those of
:mod:`~omnibal_kernels.pipeline.costs`, the step that of :func:`~omnibal_kernels.pipeline.schedule.simulate`.
Methods:

- ``"exact"``, ``objective="step"`` (default): the split of least simulated step time under the schedule,
  with memory budgets and fixed stage starts, proven optimal by branch and bound
  (:mod:`~omnibal_kernels.pipeline.search`); ``lower_bound_ms`` says how close a search stopped by
  ``node_limit`` came. ``objective="bottleneck"``: the split of least bottleneck stage, ties broken by the
  least total (one stage per rank), which sets the steady state but not the fill and drain.
- ``"paper"``: OmniBal's search: a greedy anchor partition (cut where the running time passes ``s/S`` of the
  total), candidates moving every boundary by at most ``radius`` layers, ranked by the spread of stage compute
  and communication, the ``top_k`` simulated; the fastest step wins.
- ``"uniform"``: equal layer counts (the first ``L mod S`` stages one more), what users do by default.

Recompute modes: ``"plan"`` (least recompute time that fits, per rank), ``"uniform"`` (one setting for every
rank: none if every rank fits, else every layer), ``"all"``, ``"none"``; :func:`evaluate_partition` also takes
the recomputed layers themselves, one sequence per virtual stage (a choice made before, priced as it is).
Every search's step is the simulator's for the per-stage times of the profile;
:func:`~omnibal_kernels.pipeline.micro_batches.simulate_packs` runs a plan with one time per micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

import numpy as np

from .._checks import check_int, check_positive_int
from .bounds import Windows
from .costs import StageCosts
from .profile import ModelProfile, as_profile
from .schedule import check_micro_batches, check_schedule, simulate
from .search import paper_candidates, search_bottleneck, search_step

__all__ = [
    "METHODS",
    "OBJECTIVES",
    "RECOMPUTE_MODES",
    "PipelinePlan",
    "evaluate_partition",
    "partition",
    "uniform_stages",
    "vit_first_stages",
]

METHODS = ("exact", "paper", "uniform")
OBJECTIVES = ("step", "bottleneck")
RECOMPUTE_MODES = ("plan", "uniform", "all", "none")
# Nodes the exact step search expands before it stops with the best split and a proven lower bound, with one
# stage per rank and with several (whose nodes cost more and whose bounds prune less).
NODE_LIMIT = 20_000
NODE_LIMIT_VIRTUAL = 2_000
Budgets = Union[None, float, Sequence[float]]
Recompute = Union[str, Sequence[Sequence[int]]]


@dataclass(frozen=True)
class PipelinePlan:
    """A partition with its recompute choice and the simulated step.

    Per virtual stage (chain order): ``stages`` ``(first, last)`` layer indices, inclusive, contiguous,
    covering the chain; ``recompute`` the (global) indices of recomputed layers; ``stage_ms`` forward +
    backward + recompute + sends per micro-batch; ``forward_ms``, ``backward_ms`` (recompute included, sends
    not); ``activation_bytes`` kept by one micro-batch under the recompute choice. ``comm_ms``: per boundary,
    one send each way. Per rank: ``peak_bytes`` (simulated), ``memory_bytes`` (the bound the search keeps
    within budget, ``static + sum held * kept``), ``slack_bytes`` (0 when the recompute choice is exactly
    optimal). ``step_ms``, ``bubble``: the simulated step; ``lower_bound_ms``: a proven bound on the step of
    every split the method could have returned (equal to ``step_ms`` for a completed exact search);
    ``fits``: every rank within its budget.
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
    virtual_stages: int = 1
    stage_ranks: tuple[int, ...] = ()
    objective: str = "step"
    lower_bound_ms: float = 0.0
    search_nodes: int = 0
    memory_bytes: tuple[int, ...] = ()
    slack_bytes: tuple[int, ...] = ()
    weight_ms: tuple[float, ...] = ()

    @property
    def num_stages(self) -> int:
        """Virtual stages (``ranks * virtual_stages``)."""
        return len(self.stages)

    @property
    def num_ranks(self) -> int:
        return len(self.stages) // self.virtual_stages

    @property
    def rank_ms(self) -> tuple[float, ...]:
        """Per rank, the time of one micro-batch through all its stages."""
        out = [0.0] * self.num_ranks
        for j, t in enumerate(self.stage_ms):
            out[self.stage_ranks[j]] += t
        return tuple(out)

    @property
    def bottleneck_ms(self) -> float:
        return max(self.rank_ms)

    @property
    def optimality_gap(self) -> float:
        """``step_ms / lower_bound_ms - 1``: 0 when the split is proven optimal."""
        return self.step_ms / self.lower_bound_ms - 1.0 if self.lower_bound_ms > 0 else math.inf

    def rank_stages(self, rank: int) -> list[int]:
        """The virtual stages ``rank`` runs, in chain order."""
        return [j for j, r in enumerate(self.stage_ranks) if r == rank]

    def layer_names(self, stage: int) -> list[str]:
        """Names of the layers of virtual stage ``stage``."""
        first, last = self.stages[stage]
        return list(self.names[first : last + 1])

    def recompute_names(self, stage: int) -> list[str]:
        """Names of the recomputed layers of virtual stage ``stage`` (for ``apply_recompute``)."""
        return [self.names[j] for j in self.recompute[stage]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "objective": self.objective,
            "schedule": self.schedule,
            "micro_batches": self.micro_batches,
            "virtual_stages": self.virtual_stages,
            "stage_ranks": list(self.stage_ranks),
            "stages": [list(s) for s in self.stages],
            "recompute": [list(r) for r in self.recompute],
            "step_ms": self.step_ms,
            "bubble": self.bubble,
            "lower_bound_ms": self.lower_bound_ms,
            "search_nodes": self.search_nodes,
            "peak_bytes": list(self.peak_bytes),
            "memory_bytes": list(self.memory_bytes),
            "slack_bytes": list(self.slack_bytes),
            "stage_ms": list(self.stage_ms),
            "bottleneck_ms": self.bottleneck_ms,
            "activation_bytes": list(self.activation_bytes),
            "fits": self.fits,
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


def vit_first_stages(profile: Any, stages: int) -> list[tuple[int, int]]:
    """Megatron's VLM layout: the vision encoder and the projector (the layers of kind ``"vit"`` and
    ``"projector"``, first in the chain) on stage 0, the other layers split evenly over all stages
    (:func:`uniform_stages`), stage 0 taking its share after the vision encoder."""
    profile = as_profile(profile)
    stages = check_positive_int("stages", stages)
    front = sum(layer.kind in ("vit", "projector") for layer in profile.layers)
    if front == 0 or any(layer.kind in ("vit", "projector") for layer in profile.layers[front:]):
        raise ValueError("profile: the vit-first layout needs the 'vit' and 'projector' layers first")
    if len(profile) - front < stages:
        raise ValueError(f"stages ({stages}) must not exceed the {len(profile) - front} layers after the ViT")
    rest = uniform_stages(len(profile) - front, stages)
    return [(0, front + rest[0][1])] + [(a + front, b + front) for a, b in rest[1:]]


def _check_choices(recompute: str, link_gb_per_s: float, weight_fraction: float) -> None:
    if not isinstance(recompute, str):
        raise TypeError(f"recompute must be one of {RECOMPUTE_MODES}, got {type(recompute).__name__}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if not link_gb_per_s >= 0:
        raise ValueError(f"link_gb_per_s must be >= 0, got {link_gb_per_s}")
    if not 0.0 <= weight_fraction <= 1.0:
        raise ValueError(f"weight_fraction must be in [0, 1], got {weight_fraction}")


def _given_recompute(recompute: Any, stages: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """``recompute`` given as the recomputed layers of every virtual stage (global indices inside it)."""
    if not isinstance(recompute, Sequence) or isinstance(recompute, (str, bytes)):
        raise TypeError(
            f"recompute must be one of {RECOMPUTE_MODES} or one sequence of layer indices per stage, "
            f"got {type(recompute).__name__}"
        )
    if len(recompute) != len(stages):
        raise ValueError(f"recompute: {len(recompute)} sequences of layers for {len(stages)} stages")
    out = []
    for j, (layers, (a, b)) in enumerate(zip(recompute, stages)):
        if not isinstance(layers, (Sequence, np.ndarray)) or isinstance(layers, (str, bytes)):
            raise TypeError(f"recompute: stage {j} must be a sequence of layer indices, got {type(layers).__name__}")
        own = tuple(sorted(check_int(f"recompute: stage {j} layer", x) for x in list(layers)))
        if any(not a <= x <= b for x in own):
            raise ValueError(f"recompute: stage {j} holds layers {a}..{b}, got {list(layers)}")
        if len(set(own)) != len(own):
            raise ValueError(f"recompute: stage {j} names a layer twice, got {list(layers)}")
        out.append(own)
    return tuple(out)


def _budgets(memory_bytes: Budgets, ranks: int) -> Optional[list[float]]:
    if memory_bytes is None:
        return None
    if isinstance(memory_bytes, (int, float, np.integer, np.floating)) and not isinstance(memory_bytes, bool):
        values = [float(memory_bytes)] * ranks
    elif isinstance(memory_bytes, bool):
        raise TypeError(f"memory_bytes must be a number of bytes, one per rank, or None, got {memory_bytes!r}")
    else:
        values = [float(v) for v in memory_bytes]
        if len(values) != ranks:
            raise ValueError(f"memory_bytes: {len(values)} per-rank budgets for {ranks} ranks")
    for r, v in enumerate(values):
        if not v > 0:
            raise ValueError(f"memory_bytes: the budget of rank {r} must be > 0, got {v}")
    return values


def _fixed(fixed_starts: Optional[Mapping[int, int]], stages: int, layers: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, first in dict(fixed_starts or {}).items():
        s = check_positive_int("fixed_starts stage", s, 0)
        first = check_positive_int("fixed_starts layer", first, 0)
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


def _check_layers_fit(costs: StageCosts) -> None:
    """A layer that cannot fit any rank even alone and recomputed makes every partition infeasible."""
    for j in range(costs.L):
        if not costs.layer_fits_alone(j):
            layer = costs.profile.layers[j]
            raise ValueError(
                f"layer {j} ({layer.name!r}) does not fit any stage's memory budget even alone with recomputation "
                f"(static {layer.static_bytes / 2**30:.2f} GiB, recompute mode {costs.mode!r})"
            )


class _Evaluator:
    """Complete splits under one :class:`StageCosts`: recompute per rank (or the ``given`` layers of every
    stage), then the simulated step."""

    def __init__(self, costs: StageCosts, given: Optional[tuple[tuple[int, ...], ...]] = None) -> None:
        self.c = costs
        self.given = given

    def parts(self, stages: Sequence[tuple[int, int]]):
        c = self.c
        chosen: list[tuple[int, ...]] = [()] * c.S
        rec, rec_f, kept = np.zeros(c.S), np.zeros(c.S), np.zeros(c.S)
        memory, slack, fits = [], [], True
        for r in range(c.P):
            own = [(j, a, b) for j, (a, b) in enumerate(stages) if c.rank_of[j] == r]
            if self.given is None:
                choice = c.rank_choice(own)
            else:
                choice = c.given_choice(own, [self.given[j] for j, _, _ in own])
            for (j, _, _), ch, ms, kb in zip(own, choice.chosen, choice.recompute_ms, choice.kept_bytes):
                chosen[j], rec[j], kept[j] = ch, ms, kb
            for (j, _, _), ms in zip(own, choice.checkpoint_forward_ms):
                rec_f[j] = ms
            memory.append(choice.memory_bytes)
            slack.append(choice.slack_bytes)
            fits = fits and choice.fits
        return chosen, rec, rec_f, kept, memory, slack, fits

    def inputs(self, stages: Sequence[tuple[int, int]], rec: np.ndarray, rec_f: np.ndarray) -> dict[str, np.ndarray]:
        c = self.c
        a = np.array([s[0] for s in stages])
        b = np.array([s[1] for s in stages])
        fwd = c.span(c.c_fwd, a, b) + rec_f
        bt = c.span(c.c_bwd, a, b)
        return {"forward_ms": fwd, "backward_ms": bt + rec, "weight_ms": c.wf * bt, "comm_ms": c.send_ms[b[:-1]]}

    def step(self, stages: Sequence[tuple[int, int]]) -> Optional[float]:
        _, rec, rec_f, _, _, _, fits = self.parts(stages)
        if not fits:
            return None
        x = self.inputs(stages, rec, rec_f)
        return simulate(
            x["forward_ms"],
            x["backward_ms"],
            self.c.m,
            schedule=self.c.schedule,
            virtual_stages=self.c.v,
            comm_ms=x["comm_ms"],
            weight_ms=x["weight_ms"],
        ).step_ms

    def plan(
        self, stages: Sequence[tuple[int, int]], method: str, objective: str, lower: float = 0.0, nodes: int = 0
    ) -> PipelinePlan:
        c = self.c
        chosen, rec, rec_f, kept, memory, slack, fits = self.parts(stages)
        x = self.inputs(stages, rec, rec_f)
        static = np.array([c.span(c.c_static, a, b) for a, b in stages])
        sim = simulate(
            x["forward_ms"],
            x["backward_ms"],
            c.m,
            schedule=c.schedule,
            virtual_stages=c.v,
            comm_ms=x["comm_ms"],
            activation_bytes=kept,
            static_bytes=static,
            weight_ms=x["weight_ms"],
        )
        f, bb, w = c.parts(
            np.arange(c.S), np.array([s[0] for s in stages]), np.array([s[1] for s in stages]), rec, rec_f
        )
        return PipelinePlan(
            stages=tuple((int(a), int(b)) for a, b in stages),
            recompute=tuple(chosen),
            step_ms=sim.step_ms,
            bubble=sim.bubble,
            peak_bytes=sim.peak_bytes,
            stage_ms=tuple(float(t) for t in f + bb + w),
            forward_ms=tuple(float(t) for t in x["forward_ms"]),
            backward_ms=tuple(float(t) for t in x["backward_ms"]),
            comm_ms=tuple(float(t) for t in x["comm_ms"]),
            activation_bytes=tuple(int(round(k)) for k in kept),
            fits=fits,
            method=method,
            schedule=c.schedule,
            micro_batches=c.m,
            names=tuple(c.profile.names),
            virtual_stages=c.v,
            stage_ranks=tuple(int(r) for r in c.rank_of),
            objective=objective,
            lower_bound_ms=min(lower, sim.step_ms) if lower else 0.0,
            search_nodes=nodes,
            memory_bytes=tuple(int(round(x)) for x in memory),
            slack_bytes=tuple(int(math.ceil(x)) for x in slack),
            weight_ms=tuple(float(t) for t in x["weight_ms"]),
        )


def _modes(mode: str) -> list[str]:
    return ["none", "all"] if mode == "uniform" else [mode]


def _costs(
    profile: ModelProfile,
    ranks: int,
    v: int,
    m: int,
    schedule: str,
    budgets: Optional[list[float]],
    mode: str,
    link: float,
    weight_fraction: float,
) -> StageCosts:
    return StageCosts(profile, ranks, v, m, schedule, budgets, mode, link, weight_fraction)


def evaluate_partition(
    profile: Any,
    stages: Sequence[Sequence[int]],
    *,
    micro_batches: int,
    memory_bytes: Budgets = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    recompute: Recompute = "plan",
    link_gb_per_s: float = 25.0,
    weight_fraction: float = 0.5,
    method: str = "given",
) -> PipelinePlan:
    """The recompute choice and simulated step of a given partition (``stages``: ``(first, last)`` pairs, one
    per virtual stage in chain order).

    ``recompute``: a mode of :data:`RECOMPUTE_MODES` (module docstring), or the recomputed layers themselves,
    one sequence of global layer indices per virtual stage, each inside its stage (a plan's ``recompute``):
    that choice is priced as it is, ``fits`` telling whether it keeps every rank within ``memory_bytes``.
    Raises ``TypeError`` for a ``recompute`` of neither form, ``ValueError`` for an unknown mode or a layer
    outside its stage."""
    profile = as_profile(profile)
    m = check_micro_batches(micro_batches)
    v = check_positive_int("virtual_stages", virtual_stages)
    check_schedule(schedule, v)
    # a mode name, or the layers themselves (priced with nothing chosen on top of them)
    mode, given = (recompute, None) if isinstance(recompute, str) else ("none", recompute)
    _check_choices(mode, link_gb_per_s, weight_fraction)
    stage_list = [(int(a), int(b)) for a, b in stages]
    L = len(profile)
    if (
        not stage_list
        or stage_list[0][0] != 0
        or stage_list[-1][1] != L - 1
        or any(b < a or (i and a != stage_list[i - 1][1] + 1) for i, (a, b) in enumerate(stage_list))
    ):
        raise ValueError(
            f"stages must be contiguous non-empty (first, last) pairs covering layers 0..{L - 1}, got {stage_list}"
        )
    if len(stage_list) % v:
        raise ValueError(f"stages: {len(stage_list)} virtual stages are not {v} per rank")
    P = len(stage_list) // v
    budgets = _budgets(memory_bytes, P)
    if given is not None:
        chosen = _given_recompute(given, stage_list)
        costs = _costs(profile, P, v, m, schedule, budgets, mode, link_gb_per_s, weight_fraction)
        return _Evaluator(costs, chosen).plan(stage_list, method, "given")
    plans = [
        _Evaluator(_costs(profile, P, v, m, schedule, budgets, each, link_gb_per_s, weight_fraction)).plan(
            stage_list, method, "given"
        )
        for each in _modes(mode)
    ]
    fitting = [p for p in plans if p.fits]
    return fitting[0] if fitting else plans[-1]


def _search_limits(costs: StageCosts, fixed: dict[int, int], objective: str) -> tuple[np.ndarray, float]:
    """Per start, the last layer a stage may end at: beyond it even the lone stage time (no recompute, no
    sends) would exceed what a known split reaches (its step over m, or its bottleneck)."""
    ev = _Evaluator(costs)
    uniform = uniform_stages(costs.L, costs.S)
    ok = all(fixed.get(s, a) == a for s, (a, _) in enumerate(uniform))
    step = ev.step(uniform) if ok else None
    if step is None:
        return np.full(costs.L, costs.L - 1, np.int64), math.inf
    if objective == "step":
        cap = step / costs.m
    else:
        _, rec, rec_f, _, _, _, _ = ev.parts(uniform)
        f, bb, w = costs.parts(
            np.arange(costs.S), np.array([a for a, _ in uniform]), np.array([b for _, b in uniform]), rec, rec_f
        )
        cap = float(np.max(f + bb + w))
    train = costs.c_fwd + costs.c_bwd
    last = np.searchsorted(train, train[:-1] + cap * (1 + 1e-9), side="right") - 2
    return np.clip(last, np.arange(costs.L), costs.L - 1).astype(np.int64), step


def _search(
    costs: StageCosts, fixed: dict[int, int], method: str, objective: str, radius: int, top_k: int, node_limit: int
) -> Optional[PipelinePlan]:
    ev = _Evaluator(costs)
    L, S = costs.L, costs.S
    mats: Optional[np.ndarray]
    if method == "exact":
        last, _ = _search_limits(costs, fixed, objective)
        mats, _ = costs.recompute_matrices(last)
        if objective == "bottleneck":
            found = search_bottleneck(costs, mats, fixed)
            return None if found is None else ev.plan(found, "exact", objective)
        windows = Windows.of(costs.schedule, costs.P, costs.m, costs.v)
        seeds: list[Optional[list[tuple[int, int]]]]
        seeds = (
            [uniform_stages(L, S)] if all(fixed.get(s, a) == a for s, (a, _) in enumerate(uniform_stages(L, S))) else []
        )
        if costs.v == 1:
            seeds.append(search_bottleneck(costs, mats, fixed))
        result = search_step(costs, mats, windows, fixed, ev.step, seeds, node_limit)
        if result is None:
            return None
        return ev.plan(result.stages, "exact", objective, result.lower_bound_ms, result.nodes)
    last = np.full(L, L - 1, np.int64)
    mats, _ = costs.recompute_matrices(last) if costs.v == 1 else (None, None)
    if mats is None:
        a, b = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
        mats = np.stack([np.where(a <= b, costs.lone_recompute(j, a, b), np.inf) for j in range(S)])
    plans = [ev.plan(st, "paper", "step") for st in paper_candidates(costs, mats, fixed, radius, top_k)]
    plans = [p for p in plans if p.fits]
    return min(plans, key=lambda p: p.step_ms) if plans else None


def partition(
    profile: Any,
    stages: int,
    *,
    micro_batches: int,
    memory_bytes: Budgets = None,
    method: str = "exact",
    objective: str = "step",
    recompute: str = "plan",
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    fixed_starts: Optional[Mapping[int, int]] = None,
    link_gb_per_s: float = 25.0,
    weight_fraction: float = 0.5,
    radius: int = 2,
    top_k: int = 8,
    node_limit: Optional[int] = None,
) -> PipelinePlan:
    """Splits a layer chain over ``stages`` pipeline ranks with a per-rank recomputation plan.

    Args:
        profile: a ``ModelProfile`` (or its dict form).
        stages: P, the number of pipeline ranks; the chain is cut into ``P * virtual_stages`` virtual stages
            (1 <= that <= layers).
        micro_batches: m, micro-batches per step (sets how many each stage holds), at most
            :data:`~omnibal_kernels.pipeline.schedule.MAX_MICRO_BATCHES`.
        memory_bytes: one budget for every rank or one per rank; ``None``: memory is no constraint.
        method: ``"exact"``, ``"paper"`` or ``"uniform"``; objective: ``"step"`` or ``"bottleneck"`` for
            ``"exact"`` (module docstring).
        recompute: ``"plan"``, ``"uniform"``, ``"all"`` or ``"none"`` (module docstring).
        schedule, virtual_stages: one of ``SCHEDULES`` and its chunks per rank (2 for ``"zbv"``).
        fixed_starts: ``{virtual stage: first layer}`` boundaries the search must keep (e.g. ``{1: n_vit}`` puts
            the whole ViT on stage 0).
        link_gb_per_s: GB/s between consecutive stages on different ranks (0: communication is free).
        weight_fraction: under zero bubble, the share of each layer's backward that is its weight gradient.
        radius, top_k: the paper search's neighbourhood and number of candidates simulated.
        node_limit: nodes the exact step search may expand before it returns its best split with a bound
            (default ``NODE_LIMIT``, ``NODE_LIMIT_VIRTUAL`` with several stages per rank).

    Raises ``ValueError`` when no partition fits the budgets (naming a layer that fits no rank when there is
    one). The uniform split is returned even when it does not fit (``fits`` tells).
    """
    profile = as_profile(profile)
    L = len(profile)
    P = check_positive_int("stages", stages)
    m = check_micro_batches(micro_batches)
    v = check_positive_int("virtual_stages", virtual_stages)
    check_schedule(schedule, v)
    S = P * v
    if S > L:
        raise ValueError(f"stages * virtual_stages ({S}) must not exceed the number of layers ({L})")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "bottleneck" and v > 1:
        raise ValueError("objective='bottleneck' takes one stage per rank (virtual_stages=1)")
    _check_choices(recompute, link_gb_per_s, weight_fraction)
    radius = check_positive_int("radius", radius, 0)
    top_k = check_positive_int("top_k", top_k)
    if node_limit is None:
        node_limit = NODE_LIMIT if v == 1 else NODE_LIMIT_VIRTUAL
    node_limit = check_positive_int("node_limit", node_limit)
    budgets = _budgets(memory_bytes, P)
    fixed = _fixed(fixed_starts, S, L)
    if method == "uniform":
        return evaluate_partition(
            profile,
            uniform_stages(L, S),
            micro_batches=m,
            memory_bytes=budgets,
            schedule=schedule,
            virtual_stages=v,
            recompute=recompute,
            link_gb_per_s=link_gb_per_s,
            weight_fraction=weight_fraction,
            method="uniform",
        )
    best: Optional[PipelinePlan] = None
    errors, lower = [], math.inf
    for mode in _modes(recompute):
        costs = _costs(profile, P, v, m, schedule, budgets, mode, link_gb_per_s, weight_fraction)
        try:
            _check_layers_fit(costs)
        except ValueError as exc:
            errors.append(exc)
            continue
        plan = _search(costs, fixed, method, objective, radius, top_k, node_limit)
        if plan is None or not plan.fits:
            continue
        lower = min(lower, plan.lower_bound_ms)
        key = (
            (plan.bottleneck_ms, sum(plan.stage_ms))
            if objective == "bottleneck" and method == "exact"
            else (plan.step_ms,)
        )
        if best is None or key < (
            (best.bottleneck_ms, sum(best.stage_ms))
            if objective == "bottleneck" and method == "exact"
            else (best.step_ms,)
        ):
            best = plan
    if best is None:
        if errors and len(errors) == len(_modes(recompute)):
            raise errors[-1]
        where = "" if method == "exact" else f" within radius {radius} of the anchor"
        raise ValueError(
            f"no partition into {S} stages fits the memory budget{where} "
            f"(recompute mode {recompute!r}, schedule {schedule!r}, {m} micro-batches)"
        )
    # with two recompute settings tried, what is proven is the lesser of their bounds
    return replace(best, lower_bound_ms=lower) if best.lower_bound_ms else best
