"""Per-micro-batch costs: the packs a pipeline trains, through a profile and a plan.

A profile gives each layer's time for one micro-batch; the packs of a step differ (tiles, tokens, their
squares), and a micro-batch that is slow on one stage stalls every stage behind it. ``micro_batch_times``
scales each layer's time by its kind's cost of the pack relative to the mean over the packs (a profile
estimated from a config describes that mean micro-batch, ``profile_from_config``), with the cost model of
each layer kind from :func:`kind_costs`; ``simulate_packs`` runs a plan's split and recompute choice with
those (micro-batch, stage) times. Memory and sends stay the profile's (its largest micro-batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .estimate import pack_loads
from .partition import PipelinePlan
from .profile import ModelProfile, as_profile
from .schedule import ScheduleResult, simulate

__all__ = ["MicroBatchTimes", "kind_costs", "micro_batch_times", "simulate_packs"]


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


@dataclass(frozen=True)
class MicroBatchTimes:
    """Per micro-batch and layer: ``forward_ms`` and ``backward_ms``, (m, L) float64."""

    forward_ms: np.ndarray
    backward_ms: np.ndarray


def micro_batch_times(
    profile: Any,
    packs: Sequence[tuple[Any, Any]],
    *,
    cost_model: Any = None,
    reference: Optional[Sequence[tuple[Any, Any]]] = None,
) -> MicroBatchTimes:
    """Per (micro-batch, layer) times of ``packs`` (each a ``(vit, llm)`` pair of per-sample loads).

    Layer ``l`` of kind ``k`` on pack ``p`` takes ``profile time * cost_k(p) / mean_q cost_k(q)`` over the
    ``reference`` packs (default: ``packs``), the packs whose mean micro-batch the profile describes. A kind
    of zero reference cost keeps the profile's time.
    """
    profile = as_profile(profile)
    loads = pack_loads(packs)
    ref = loads if reference is None else pack_loads(reference)
    models = kind_costs(cost_model)
    kinds = [layer.kind if layer.kind in models else "" for layer in profile.layers]
    scale = {}
    for k in set(kinds):
        cost = np.array([models[k].sample_costs(v, t).sum() for v, t in loads])
        mean = float(np.mean([models[k].sample_costs(v, t).sum() for v, t in ref]))
        scale[k] = cost / mean if mean > 0 else np.ones(len(loads))
    factor = np.stack([scale[k] for k in kinds], axis=1)  # (m, L)
    return MicroBatchTimes(factor * profile.forward_ms, factor * profile.backward_ms)


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
    times = micro_batch_times(profile, packs, cost_model=cost_model, reference=reference)
    m = times.forward_ms.shape[0]
    c_f = np.concatenate([np.zeros((m, 1)), np.cumsum(times.forward_ms, axis=1)], axis=1)
    c_b = np.concatenate([np.zeros((m, 1)), np.cumsum(times.backward_ms, axis=1)], axis=1)
    a = np.array([s[0] for s in plan.stages])
    b = np.array([s[1] for s in plan.stages]) + 1
    fwd = c_f[:, b] - c_f[:, a]
    bwd = c_b[:, b] - c_b[:, a]
    rec = np.stack([times.forward_ms[:, list(r)].sum(axis=1) if r else np.zeros(m) for r in plan.recompute], axis=1)
    mean_bwd = np.asarray(plan.backward_ms) - np.array([profile.forward_ms[list(r)].sum() for r in plan.recompute])
    share = np.divide(
        np.asarray(plan.weight_ms or np.zeros(plan.num_stages)),
        mean_bwd,
        out=np.zeros(plan.num_stages),
        where=mean_bwd > 0,
    )
    c_s = np.concatenate([[0.0], np.cumsum(profile.static_bytes)])
    return simulate(
        fwd,
        bwd + rec,
        m,
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        comm_ms=plan.comm_ms or None,
        activation_bytes=plan.activation_bytes,
        static_bytes=c_s[b] - c_s[a],
        weight_ms=bwd * share,
        timeline=timeline,
    )
