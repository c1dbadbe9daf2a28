"""Per-micro-batch costs: the packs a pipeline trains, through a profile and a plan.

A profile gives each layer's time for one micro-batch; the packs of a step differ (tiles, tokens, their
squares), and a micro-batch that is slow on one stage stalls every stage behind it. ``micro_batch_times``
scales each layer's time by its kind's cost of the pack relative to the mean over the packs (a profile
estimated from a config describes that mean micro-batch, ``profile_from_config``), with the cost model of
each layer kind from :func:`kind_costs`; ``simulate_packs`` runs a plan's split and recompute choice with
those (micro-batch, stage) times. Memory and sends stay the profile's (its largest micro-batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .._csr import row_totals
from .estimate import pack_loads
from .partition import PipelinePlan
from .profile import ModelProfile, as_profile
from .schedule import ScheduleResult, simulate

__all__ = [
    "MicroBatchTimes",
    "StageTimes",
    "kind_costs",
    "kind_scales",
    "micro_batch_times",
    "pack_kind_costs",
    "simulate_packs",
    "StageKindTimes",
    "stage_kind_times",
    "stage_times",
]


def kind_costs(cost_model: Any = None) -> dict[str, Any]:
    """The cost model of each layer kind, from one model's ``balance.CostModel`` (default
    ``CostModel.internvl_7b()``): ``"vit"`` its ViT terms, ``"llm"`` its LLM terms, ``"projector"`` the ViT
    tiles' linear term (it maps image tokens), ``"head"`` the tokens' linear term; ``""`` (no kind) the whole
    model. The fixed ``per_sample`` and ``per_pack`` terms belong to no layer and scale none. This is the one
    place a layer kind meets the cost model."""
    from ..balance.cost import CostModel

    model = CostModel.internvl_7b() if cost_model is None else cost_model
    if not isinstance(model, CostModel):
        raise TypeError(f"cost_model must be a balance.CostModel, got {type(model).__name__}")
    return {
        "vit": CostModel(model.vit_linear, model.vit_quadratic, 0.0, 0.0),
        "projector": CostModel(1.0, 0.0, 0.0, 0.0),
        "llm": CostModel(0.0, 0.0, model.llm_linear, model.llm_quadratic),
        "head": CostModel(0.0, 0.0, 1.0, 0.0),
        "": model,
    }


def _csr(loads: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.array([v.size for v, _ in loads], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return np.concatenate([v for v, _ in loads]), np.concatenate([t for _, t in loads]), offsets


def pack_kind_costs(
    vit: np.ndarray, llm: np.ndarray, offsets: np.ndarray, *, cost_model: Any = None
) -> dict[str, np.ndarray]:
    """Per layer kind of :func:`kind_costs`, the ``(num_packs,)`` cost of every pack: the sum over its samples.

    ``vit``, ``llm``: every sample's loads, pack after pack; ``offsets``: ``(num_packs + 1,)`` int, pack ``p``
    holding samples ``offsets[p]:offsets[p + 1]`` (an empty pack costs 0)."""
    vit = np.asarray(vit, dtype=np.float64)
    llm = np.asarray(llm, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if vit.shape != llm.shape or vit.ndim != 1 or offsets.ndim != 1 or offsets.size < 1:
        raise ValueError("vit and llm must be 1-D of one length and offsets 1-D")
    if offsets[0] != 0 or offsets[-1] != vit.size or (np.diff(offsets) < 0).any():
        raise ValueError(f"offsets must rise from 0 to {vit.size}")
    out = {}
    for kind, model in kind_costs(cost_model).items():
        out[kind] = row_totals(offsets, model.sample_costs(vit, llm))
    return out


def kind_scales(costs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per kind, every pack's cost over the mean cost of the ``reference`` packs (1 where that mean is 0)."""
    out = {}
    for kind, c in costs.items():
        mean = float(np.mean(reference[kind]))
        out[kind] = c / mean if mean > 0 else np.ones_like(c)
    return out


@dataclass(frozen=True)
class MicroBatchTimes:
    """Per micro-batch and layer: ``forward_ms`` and ``backward_ms``, (m, L) float64."""

    forward_ms: np.ndarray
    backward_ms: np.ndarray


_KINDS = ("vit", "projector", "llm", "head", "")


def _layer_kinds(profile: ModelProfile) -> list[str]:
    known = _KINDS
    return [layer.kind if layer.kind in known else "" for layer in profile.layers]


def micro_batch_times(
    profile: Any,
    packs: Sequence[tuple[Any, Any]],
    *,
    cost_model: Any = None,
    reference: Optional[Sequence[tuple[Any, Any]]] = None,
) -> MicroBatchTimes:
    """Per (micro-batch, layer) times of ``packs`` (each a ``(vit, llm)`` pair of per-sample loads).

    Layer ``l`` of kind ``k`` on pack ``p`` takes its fixed time plus the rest of its profile time times
    ``cost_k(p) / mean_q cost_k(q)`` over the ``reference`` packs (default: ``packs``), the packs whose mean
    micro-batch the profile describes. A kind of zero reference cost keeps the profile's time.
    """
    profile = as_profile(profile)
    loads = pack_loads(packs)
    costs = pack_kind_costs(*_csr(loads), cost_model=cost_model)
    ref = costs if reference is None else pack_kind_costs(*_csr(pack_loads(reference)), cost_model=cost_model)
    scale = kind_scales(costs, ref)
    factor = np.stack([scale[k] for k in _layer_kinds(profile)], axis=1)  # (m, L)
    f_fix, b_fix = profile.fixed_forward_ms, profile.fixed_backward_ms
    return MicroBatchTimes(
        f_fix + factor * (profile.forward_ms - f_fix), b_fix + factor * (profile.backward_ms - b_fix)
    )


@dataclass(frozen=True)
class StageTimes:
    """Per micro-batch and virtual stage of a plan, (m, S) float64: ``forward_ms`` (checkpoint's own work
    included), ``backward_ms`` (recomputation included), ``weight_ms`` (the part of the backward that is the
    weight gradient, for the zero-bubble schedules), ``recompute_ms`` (the recomputed forwards, in the backward)
    and ``checkpoint_forward_ms`` (what running the recomputed layers under checkpoint adds to the forward;
    ``None``: nothing)."""

    forward_ms: np.ndarray
    backward_ms: np.ndarray
    weight_ms: np.ndarray
    recompute_ms: np.ndarray
    checkpoint_forward_ms: Optional[np.ndarray] = None


@dataclass(frozen=True)
class StageKindTimes:
    """A plan's stage times at the profile's mean micro-batch, per layer kind: ``forward_ms``, ``backward_ms``
    and ``recompute_ms`` as ``(len(kinds), S)``, the parts that grow with the micro-batch; per stage the share
    of the backward that is the weight gradient, and ``fixed_ms``: ``(3, S)`` forward, backward and recompute
    parts that do not (the layers' fixed times); ``checkpoint_forward_ms`` the ``(len(kinds) + 1, S)`` part of
    the forward that the recomputed layers add, per kind then fixed (``None``: nothing). :meth:`times` scales
    them per micro-batch."""

    kinds: tuple[str, ...]
    forward_ms: np.ndarray
    backward_ms: np.ndarray
    recompute_ms: np.ndarray
    weight_share: np.ndarray
    fixed_ms: Optional[np.ndarray] = None
    checkpoint_forward_ms: Optional[np.ndarray] = None

    def times(self, scales: Mapping[str, np.ndarray]) -> StageTimes:
        """(micro-batch, stage) times when every layer of kind ``k`` takes its fixed time plus the rest of its
        profile time times ``scales[k]`` (``(m,)``; a kind missing from ``scales`` keeps the profile's time)."""
        m = max((np.size(v) for v in scales.values()), default=1)
        factor = np.ones((m, len(self.kinds)))
        for i, k in enumerate(self.kinds):
            if k in scales:
                factor[:, i] = scales[k]
        f, b, r = factor @ self.forward_ms, factor @ self.backward_ms, factor @ self.recompute_ms
        if self.fixed_ms is not None:
            f, b, r = f + self.fixed_ms[0], b + self.fixed_ms[1], r + self.fixed_ms[2]
        c = None
        if self.checkpoint_forward_ms is not None:
            c = factor @ self.checkpoint_forward_ms[:-1] + self.checkpoint_forward_ms[-1]
            f = f + c
        return StageTimes(f, b + r, b * self.weight_share, r, c)


def stage_kind_times(plan: PipelinePlan, profile: Any) -> StageKindTimes:
    """The per-kind stage times of ``plan`` (its split and recompute choice) on ``profile``."""
    profile = as_profile(profile)
    if len(profile) != plan.stages[-1][1] + 1:
        raise ValueError(f"profile has {len(profile)} layers, the plan {plan.stages[-1][1] + 1}")
    kinds = _layer_kinds(profile)
    order = tuple(sorted(set(kinds)))
    index = {k: i for i, k in enumerate(order)}
    S = plan.num_stages
    fwd, bwd, rec = (np.zeros((len(order), S)) for _ in range(3))
    ckpt = np.zeros((len(order) + 1, S))
    fixed = np.zeros((3, S))
    f_fix, b_fix = profile.fixed_forward_ms, profile.fixed_backward_ms
    f_ms, b_ms = profile.forward_ms - f_fix, profile.backward_ms - b_fix
    r_fix, c_fix = profile.fixed_recompute_ms, profile.fixed_checkpoint_forward_ms
    r_ms, c_ms = profile.recompute_ms - r_fix, profile.checkpoint_forward_ms - c_fix
    for j, (a, b) in enumerate(plan.stages):
        for layer in range(a, b + 1):
            fwd[index[kinds[layer]], j] += f_ms[layer]
            bwd[index[kinds[layer]], j] += b_ms[layer]
        for layer in plan.recompute[j]:
            rec[index[kinds[layer]], j] += r_ms[layer]
            ckpt[index[kinds[layer]], j] += c_ms[layer]
        fixed[:, j] = f_fix[a : b + 1].sum(), b_fix[a : b + 1].sum(), r_fix[list(plan.recompute[j])].sum()
        ckpt[-1, j] = c_fix[list(plan.recompute[j])].sum()
    # the plan's forward holds the checkpoint's part and its backward the recomputation: the rest is the backward
    # whose weight-gradient share the plan gives
    mean_bwd = np.asarray(plan.backward_ms) - rec.sum(axis=0) - fixed[2]
    share = np.divide(np.asarray(plan.weight_ms or np.zeros(S)), mean_bwd, out=np.zeros(S), where=mean_bwd > 0)
    return StageKindTimes(order, fwd, bwd, rec, share, fixed if fixed.any() else None, ckpt if ckpt.any() else None)


def stage_times(plan: PipelinePlan, profile: Any, scales: Mapping[str, np.ndarray]) -> StageTimes:
    """The (micro-batch, stage) times of ``plan`` (its split and recompute choice) when every layer of kind
    ``k`` takes its profile time times ``scales[k]`` (``(m,)``, one factor per micro-batch; a kind missing
    from ``scales`` keeps the profile's time): the times :func:`simulate_packs` runs."""
    return stage_kind_times(plan, profile).times(scales)


def simulate_packs(
    plan: PipelinePlan,
    profile: ModelProfile,
    packs: Sequence[tuple[Any, Any]],
    *,
    cost_model: Any = None,
    reference: Optional[Sequence[tuple[Any, Any]]] = None,
    timeline: bool = False,
) -> ScheduleResult:
    """One step of ``plan`` (its split, recompute choice, schedule) with one micro-batch per pack and the times
    of :func:`micro_batch_times`: (micro-batch, stage) forward, backward (recomputation included) and weight
    gradient times. ``len(packs)`` is the step's number of micro-batches."""
    profile = as_profile(profile)
    if len(profile) != plan.stages[-1][1] + 1:
        raise ValueError(f"profile has {len(profile)} layers, the plan {plan.stages[-1][1] + 1}")
    loads = pack_loads(packs)
    costs = pack_kind_costs(*_csr(loads), cost_model=cost_model)
    ref = costs if reference is None else pack_kind_costs(*_csr(pack_loads(reference)), cost_model=cost_model)
    times = stage_times(plan, profile, kind_scales(costs, ref))
    c_s = np.concatenate([[0.0], np.cumsum(profile.static_bytes)])
    a = np.array([s[0] for s in plan.stages])
    b = np.array([s[1] for s in plan.stages]) + 1
    return simulate(
        times.forward_ms,
        times.backward_ms,
        len(loads),
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        comm_ms=plan.comm_ms or None,
        activation_bytes=plan.activation_bytes,
        static_bytes=c_s[b] - c_s[a],
        weight_ms=times.weight_ms,
        timeline=timeline,
    )
