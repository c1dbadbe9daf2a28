"""``omniverse``: data, model and memory balance composed for one model, layout and data set.

The model is a name of :data:`~omnibal_kernels.pipeline.CONFIGS` (its profile estimated from the shapes for each
data choice) or a measured :class:`~omnibal_kernels.pipeline.ModelProfile` with the micro-batch it was measured
on and the model's cost model (its times and activations scaled per layer kind to each data choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Optional, Union

import numpy as np

from .._checks import check_positive_int
from .._csr import row_totals
from ..balance.cost import CostModel
from ..balance.options import PlanOptions
from ..balance.search import search_capacity
from ..lengths import Lengths, default_lengths
from ..pipeline.estimate import CONFIGS, VLMConfig, cost_model_from_config, profile_from_config
from ..pipeline.micro_batches import pack_kind_costs
from ..pipeline.profile import ModelProfile
from .compose import OmniverseResult, compose
from .data import MicroBatches, balanced_micro_batches, padded_micro_batches, resample
from .layout import Hardware, Layout

__all__ = ["BUNDLED_PATCHES_PER_TILE", "affine_profile", "omniverse", "scaled_profile"]

# A 448 px tile is 32 x 32 patches of 14 px: the bundled tiles as the patches of a patch-based ViT.
BUNDLED_PATCHES_PER_TILE = (448 // 14) ** 2


def _model(model: Union[str, VLMConfig, ModelProfile]) -> Union[VLMConfig, ModelProfile]:
    if isinstance(model, (VLMConfig, ModelProfile)):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a name, a VLMConfig or a ModelProfile, got {type(model).__name__}")
    if model not in CONFIGS:
        raise ValueError(f"model: unknown model {model!r}; choose from {', '.join(CONFIGS)}")
    return CONFIGS[model]


def _lengths(lengths: Optional[Lengths], cfg: Optional[VLMConfig], samples: Optional[int], seed: int) -> Lengths:
    if lengths is None:
        lengths = default_lengths()
        if cfg is not None and cfg.vit_unit == "patch":
            lengths = Lengths(lengths.vit * BUNDLED_PATCHES_PER_TILE, lengths.llm)
    elif not isinstance(lengths, Lengths):
        raise TypeError(f"lengths must be a Lengths, got {type(lengths).__name__}")
    if len(lengths) == 0:
        raise ValueError("lengths: no samples")
    return lengths if samples is None else resample(lengths, samples, seed)


def _kind_load(kind: str, units: float, tokens: float) -> float:
    """What a layer kind's activations grow with: ViT units for the ViT, tokens after it."""
    return units if kind == "vit" else tokens


def _micro_batch_costs(reference: tuple[Any, Any], cost_model: CostModel) -> tuple[Any, Any, dict[str, float]]:
    """The micro-batch ``reference``'s per-sample ``(vit, llm)`` loads as float arrays and its cost per layer
    kind."""
    vit = np.atleast_1d(np.asarray(reference[0], np.float64))
    llm = np.atleast_1d(np.asarray(reference[1], np.float64))
    costs = pack_kind_costs(vit, llm, np.array([0, vit.size]), cost_model=cost_model)
    return vit, llm, {kind: float(c[0]) for kind, c in costs.items()}


# a layer's times that scale with its kind's cost past their fixed parts (``fixed_<name>``); ``recompute_ms`` too
# where it is measured
_TIMES = ("forward_ms", "backward_ms", "checkpoint_forward_ms")


def _scaled(ms: float, fixed: float, time: float) -> float:
    return fixed + (ms - fixed) * time


def scaled_profile(
    profile: ModelProfile, reference: tuple[Any, Any], data: MicroBatches, cost_model: CostModel
) -> ModelProfile:
    """``profile``, measured on the micro-batch ``reference`` (its ``(vit, llm)`` per-sample loads), as the
    profile of ``data``: each layer's times (forward, backward and what recomputing it adds to each; past their
    fixed parts, which stay) scaled by its kind's mean cost
    over ``data``'s micro-batches against its cost of ``reference``, its activation and output bytes by the
    largest load of its kind (ViT units for ``"vit"`` layers, tokens for the others) against the
    reference's."""
    vit, llm, ref = _micro_batch_costs(reference, cost_model)
    mean = pack_kind_costs(data.vit, data.llm, data.offsets, cost_model=cost_model)
    units = row_totals(data.offsets, data.vit).max()
    tokens = row_totals(data.offsets, data.llm).max()
    layers = []
    for layer in profile.layers:
        kind = layer.kind if layer.kind in ref else ""
        time = float(np.mean(mean[kind])) / ref[kind] if ref[kind] > 0 else 1.0
        grow = max(_kind_load(kind, units, tokens) / max(_kind_load(kind, vit.sum(), llm.sum()), 1e-300), 0.0)
        times: dict[str, Any] = {
            key: _scaled(getattr(layer, key), getattr(layer, f"fixed_{key}"), time) for key in _TIMES
        }
        if layer.recompute_ms is not None:
            times["recompute_ms"] = _scaled(layer.recompute_ms, layer.fixed_recompute_ms, time)
        layers.append(
            replace(
                layer,
                **times,
                activation_bytes=int(round(layer.activation_bytes * grow)),
                output_bytes=int(round(layer.output_bytes * grow)),
            )
        )
    return ModelProfile(tuple(layers), input_bytes=profile.input_bytes, meta=dict(profile.meta))


def affine_profile(
    profiles: Sequence[ModelProfile], references: Sequence[tuple[Any, Any]], cost_model: CostModel
) -> ModelProfile:
    """The first of ``profiles`` with each layer's fixed times: the profiles are of one chain, measured on the
    micro-batches ``references`` (their ``(vit, llm)`` per-sample loads, of at least two costs per layer
    kind), and each layer's forward and backward, and what recomputing it adds to each (``recompute_ms`` where
    every profile measured it), are fitted as a fixed time plus a time proportional to its kind's cost (least
    squares over the profiles); the fixed part is clipped to ``[0, time]`` of the first profile, whose times
    are kept. A kind of one cost over the references gets no fixed part.

    A layer's time on a machine has a part that does not grow with the micro-batch (the per-call cost of its
    operations: launches, dispatch): a profile scaled to another micro-batch (:func:`scaled_profile`,
    :func:`~omnibal_kernels.omniverse.epoch.micro_batch_scales`) keeps it and scales the rest."""
    if isinstance(profiles, ModelProfile) or not isinstance(profiles, Sequence):
        raise TypeError(f"profiles must be a sequence of ModelProfile, got {type(profiles).__name__}")
    if len(profiles) < 2 or len(references) != len(profiles):
        raise ValueError(f"profiles: need two or more, one per reference, got {len(profiles)} and {len(references)}")
    first = profiles[0]
    for i, p in enumerate(profiles):
        if not isinstance(p, ModelProfile):
            raise TypeError(f"profiles[{i}] must be a ModelProfile, got {type(p).__name__}")
        if p.names != first.names:
            raise ValueError(f"profiles[{i}] is of another chain (layers {p.names}, not {first.names})")
    costs = [_micro_batch_costs(reference, cost_model)[2] for reference in references]
    layers = []
    for j, layer in enumerate(first.layers):
        kind = layer.kind if layer.kind in costs[0] else ""
        x = np.array([c[kind] for c in costs])
        attrs = list(_TIMES)
        if all(p.layers[j].recompute_ms is not None for p in profiles):
            attrs.append("recompute_ms")
        fixed: dict[str, Any] = {}
        for attr in attrs:
            y = np.array([getattr(p.layers[j], attr) for p in profiles])
            if np.ptp(x) <= 1e-12 * max(float(np.abs(x).max()), 1e-300):
                fixed[f"fixed_{attr}"] = 0.0
                continue
            intercept = np.polyfit(x, y, 1)[1]
            fixed[f"fixed_{attr}"] = float(np.clip(intercept, 0.0, getattr(layer, attr)))
        layers.append(replace(layer, **fixed))
    return ModelProfile(tuple(layers), input_bytes=first.input_bytes, meta=dict(first.meta))


def omniverse(
    model: Union[str, VLMConfig, ModelProfile],
    layout: Layout,
    lengths: Optional[Lengths] = None,
    *,
    samples: Optional[int] = None,
    batch_size: int = 4,
    capacities: Optional[tuple[int, int]] = None,
    hardware: Optional[Hardware] = None,
    cost_model: Optional[CostModel] = None,
    reference: Optional[tuple[Any, Any]] = None,
    baseline_split: str = "uniform",
    seed: int = 0,
) -> OmniverseResult:
    """The baseline, data, model and memory balance alone, the paper's ``data+model``, and all three, each
    over one epoch of ``lengths`` on ``layout`` (:mod:`~omnibal_kernels.omniverse.compose`).

    Args:
        model: a name of ``pipeline.CONFIGS`` (``"internvl-6b-20b"``, ...), a ``VLMConfig``, or a measured
            ``ModelProfile`` (then ``reference`` and ``cost_model`` are required).
        layout: GPUs, pipeline and tensor-parallel sizes, micro-batches, memory, schedule.
        lengths: per-sample loads in the model's ViT unit (default: the bundled InternVL-Chat SFT loads; for a
            patch-based ViT each tile counts as 1,024 patches).
        samples: resample ``lengths`` (with replacement, seeded) to this many samples.
        batch_size: samples per random padded micro-batch (the baseline's per-device batch size).
        capacities: ``(vit, llm)`` capacities of the balanced packs (default: searched for ``batch_size``
            samples per pack, so both data choices hold as many samples per micro-batch on average).
        hardware: device throughput, link, bytes per parameter (default ``Hardware()``: an A100 at half of peak).
        cost_model: the per-sample cost of the model (default: from its shapes).
        reference: with a measured profile, the ``(vit, llm)`` per-sample loads of the micro-batch it was
            measured on.
        baseline_split: the split of the configurations that search none: ``"uniform"`` (equal layer counts)
            or ``"vit-first"`` (the vision encoder on the first stage, Megatron's VLM layout).
        seed: seed of the random micro-batches, the balanced plan and the resample.

    Raises ``ValueError`` (one line naming the setting) for an unknown model, a layout that does not divide the
    GPUs or has more stages than the model has layers, and a memory budget no split fits.
    """
    spec = _model(model)
    hardware = Hardware() if hardware is None else hardware
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout, got {type(layout).__name__}")
    batch_size = check_positive_int("batch_size", batch_size)
    cfg = spec if isinstance(spec, VLMConfig) else None
    data_set = _lengths(lengths, cfg, samples, seed)
    if cfg is not None:
        cost = cost_model if cost_model is not None else cost_model_from_config(cfg)
        num_layers = cfg.vision.layers + cfg.llm.layers + 3
    else:
        if reference is None or cost_model is None:
            raise ValueError("a measured profile needs reference (the loads it was measured on) and cost_model")
        cost, num_layers = cost_model, len(spec)  # type: ignore[arg-type]
    if layout.pp > num_layers:
        raise ValueError(f"pp ({layout.pp}) must not exceed the model's {num_layers} layers")
    dp = layout.dp
    if capacities is None:
        found = search_capacity(data_set, PlanOptions(target_batch_size=batch_size, seed=seed), world_size=dp)
        capacities = (found.vit_capacity, found.llm_capacity)
    datas = {
        "padded": padded_micro_batches(
            data_set, dp=dp, micro_batches=layout.micro_batches, batch_size=batch_size, seed=seed
        ),
        "balanced": balanced_micro_batches(
            data_set, dp=dp, micro_batches=layout.micro_batches, cost_model=cost, capacities=capacities, seed=seed
        ),
    }

    def profile_for(data: MicroBatches) -> ModelProfile:
        if cfg is None:
            return scaled_profile(spec, reference, data, cost)  # type: ignore[arg-type]
        return profile_from_config(
            cfg,
            data.loads(range(data.num_micro_batches)),
            tflops=hardware.tflops,
            efficiency=hardware.efficiency,
            dtype_bytes=hardware.dtype_bytes,
            static_bytes_per_param=hardware.static_bytes(dp),
            tensor_parallel=layout.tp,
        )

    name = cfg.name if cfg is not None else str(spec.meta.get("name", "measured profile"))  # type: ignore[union-attr]
    return compose(name, datas, profile_for, layout, cost_model=cost, hardware=hardware, baseline_split=baseline_split)
