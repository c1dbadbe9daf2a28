"""Data, model and memory balance in one run: the configurations of :func:`omniverse` and what they cost.

A configuration is three choices: the data (``"padded"``: random micro-batches padded to their longest sample;
``"balanced"``: balanced packs), the split (``"uniform"``: equal layer counts; ``"searched"``: the exact
partition search, least simulated step) and the recomputation (``"all"``: every layer, one setting for every
stage; ``"plan"``: the per-stage plan of least recompute time that fits the memory). Each data choice gets its
own profile (its mean micro-batch's times, its largest micro-batch's activations: packs change the memory
recomputation must fit), each split is searched on that profile, and each configuration's epoch is simulated
micro-batch by micro-batch (:mod:`~omnibal_kernels.omniverse.epoch`).

``baseline`` is padded / uniform / all (the recipe users run today; ``baseline_split="vit-first"`` puts the
whole vision encoder on the first stage instead, as Megatron's VLMs do); ``data``, ``model`` and ``memory`` change
one choice each; ``data+model`` is the paper's cumulative order; ``all`` is the fastest of the eight
combinations that fit, so it is never slower than any single part that fits (it may keep a part's baseline
choice where that is faster).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from ..pipeline.partition import PipelinePlan, evaluate_partition, partition, uniform_stages, vit_first_stages
from ..pipeline.profile import ModelProfile
from .data import MicroBatches, data_summary
from .epoch import EpochTimes, epoch_times, micro_batch_scales
from .layout import Hardware, Layout

__all__ = ["BASELINE_SPLITS", "CONFIGURATIONS", "Configuration", "OmniverseResult", "compose"]

# name -> (data, split, recompute); "all" is searched over every combination
CONFIGURATIONS: dict[str, tuple[str, str, str]] = {
    "baseline": ("padded", "uniform", "all"),
    "data": ("balanced", "uniform", "all"),
    "model": ("padded", "searched", "all"),
    "memory": ("padded", "uniform", "plan"),
    "data+model": ("balanced", "searched", "all"),
}
BASELINE_SPLITS = ("uniform", "vit-first")
RECOMPUTES = ("all", "plan")
_GIB = 2**30


@dataclass(frozen=True)
class Configuration:
    """One configuration's epoch. Times in seconds; ``speedup`` is the baseline's epoch time over this one's;
    ``peak_bytes`` per pipeline stage (rank), ``fits`` whether every stage is within the memory budget;
    ``bubble_fraction`` the idle share of the epoch's rank-time, ``bubble_from_data`` the share of that idle
    time that unequal micro-batches add, ``recompute_fraction`` the share spent recomputing; ``stages`` the
    ``(first, last)`` layers and ``recomputed`` the recomputed layers of each stage; ``step_ms`` every
    optimizer step's time."""

    name: str
    data: str
    split: str
    recompute: str
    fits: bool
    steps: int
    step_seconds: float
    epoch_seconds: float
    speedup: float
    gpu_days: float
    peak_bytes: tuple[int, ...]
    bubble_fraction: float
    bubble_from_data: float
    recompute_fraction: float
    stages: tuple[tuple[int, int], ...]
    recomputed: tuple[tuple[int, ...], ...]
    step_ms: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "data": self.data,
            "split": self.split,
            "recompute": self.recompute,
            "fits": self.fits,
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "epoch_seconds": self.epoch_seconds,
            "speedup": self.speedup,
            "gpu_days": self.gpu_days,
            "peak_bytes": list(self.peak_bytes),
            "bubble_fraction": self.bubble_fraction,
            "bubble_from_data": self.bubble_from_data,
            "recompute_fraction": self.recompute_fraction,
            "stages": [list(s) for s in self.stages],
            "recomputed": [list(r) for r in self.recomputed],
        }
        return out


@dataclass(frozen=True)
class OmniverseResult:
    """Every configuration of one run (:data:`CONFIGURATIONS` and ``all``), with what they were run on."""

    model: str
    layout: Layout
    hardware: Hardware
    samples: int
    configurations: tuple[Configuration, ...]
    data: Mapping[str, Any] = field(default_factory=dict)
    micro_batches: Mapping[str, MicroBatches] = field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Configuration:
        for c in self.configurations:
            if c.name == name:
                return c
        raise KeyError(f"no configuration {name!r}; there are {', '.join(c.name for c in self.configurations)}")

    @property
    def factors(self) -> dict[str, float]:
        """Each part alone over the baseline, their ``product``, and the ``joint`` result (``all``)."""
        parts = {name: self[name].speedup for name in ("data", "model", "memory")}
        return {**parts, "product": math.prod(parts.values()), "joint": self["all"].speedup}

    @property
    def cumulative(self) -> dict[str, float]:
        """The paper's order: ``data`` over the baseline, ``model`` (data+model over data), ``memory`` (all
        over data+model), and ``total`` (all over the baseline)."""
        base, data, both, every = (self[n].epoch_seconds for n in ("baseline", "data", "data+model", "all"))
        return {"data": base / data, "model": data / both, "memory": both / every, "total": base / every}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layout": self.layout.to_dict(),
            "hardware": {
                "tflops": self.hardware.tflops,
                "efficiency": self.hardware.efficiency,
                "link_gb_per_s": self.hardware.link_gb_per_s,
                "static_bytes_per_param": self.hardware.static_bytes(self.layout.dp),
            },
            "samples": self.samples,
            "data": dict(self.data),
            "memory_bytes": self.layout.memory_bytes,
            "configurations": [c.to_dict() for c in self.configurations],
            "factors": self.factors,
            "cumulative": self.cumulative,
        }


ProfileFor = Callable[[MicroBatches], ModelProfile]


@dataclass
class _Candidate:
    data: str
    split: str
    recompute: str
    plan: PipelinePlan
    epoch: EpochTimes


def _plan(profile: ModelProfile, layout: Layout, split: str, recompute: str, link: float) -> PipelinePlan:
    common: dict[str, Any] = dict(
        micro_batches=layout.micro_batches,
        memory_bytes=layout.memory_bytes,
        schedule=layout.schedule,
        recompute=recompute,
        link_gb_per_s=link,
    )
    if split == "vit-first":
        return evaluate_partition(profile, vit_first_stages(profile, layout.pp), method="vit-first", **common)
    uniform = uniform_stages(len(profile), layout.pp)
    if split == "uniform":
        return evaluate_partition(profile, uniform, method="uniform", **common)
    try:
        return partition(profile, layout.pp, method="exact", **common)
    except ValueError:
        # no split fits this recompute setting: the uniform one stands for it, reported as not fitting
        return evaluate_partition(profile, uniform, method="uniform", **common)


def _candidates(
    datas: Mapping[str, MicroBatches],
    profiles: Mapping[str, ModelProfile],
    layout: Layout,
    cost_model: Any,
    link: float,
    baseline_split: str,
) -> dict[tuple[str, str, str], _Candidate]:
    out = {}
    for name, data in datas.items():
        scales = micro_batch_scales(data, cost_model)
        for split, recompute in itertools.product((baseline_split, "searched"), RECOMPUTES):
            plan = _plan(profiles[name], layout, split, recompute, link)
            epoch = epoch_times(plan, profiles[name], data, scales)
            out[(name, split, recompute)] = _Candidate(name, split, recompute, plan, epoch)
    return out


def _configuration(name: str, c: _Candidate, baseline_ms: float, gpus: int) -> Configuration:
    epoch_s = c.epoch.epoch_ms / 1e3
    return Configuration(
        name=name,
        data=c.data,
        split=c.split,
        recompute=c.recompute,
        fits=c.plan.fits,
        steps=int(c.epoch.step_ms.size),
        step_seconds=epoch_s / max(c.epoch.step_ms.size, 1),
        epoch_seconds=epoch_s,
        speedup=baseline_ms / c.epoch.epoch_ms if c.epoch.epoch_ms > 0 else math.inf,
        gpu_days=epoch_s * gpus / 86400.0,
        peak_bytes=tuple(int(p) for p in c.plan.peak_bytes),
        bubble_fraction=c.epoch.bubble_fraction,
        bubble_from_data=c.epoch.bubble_from_data,
        recompute_fraction=c.epoch.recompute_fraction,
        stages=c.plan.stages,
        recomputed=c.plan.recompute,
        step_ms=tuple(float(x) for x in c.epoch.step_ms),
    )


def compose(
    model: str,
    datas: Mapping[str, MicroBatches],
    profile_for: ProfileFor,
    layout: Layout,
    *,
    cost_model: Any,
    hardware: Hardware,
    baseline_split: str = "uniform",
) -> OmniverseResult:
    """Runs every configuration (module docstring) of ``datas`` (``"padded"`` and ``"balanced"``) with the
    profiles ``profile_for`` gives each data choice, under ``layout``; ``baseline_split`` is the split of the
    configurations that do not search one, ``"uniform"`` or ``"vit-first"`` (Megatron's VLM layout).

    Raises ``ValueError`` naming the memory budget when no combination fits it."""
    if baseline_split not in BASELINE_SPLITS:
        raise ValueError(f"baseline_split must be one of {BASELINE_SPLITS}, got {baseline_split!r}")
    profiles = {name: profile_for(data) for name, data in datas.items()}
    candidates = _candidates(datas, profiles, layout, cost_model, hardware.link_gb_per_s, baseline_split)
    fitting = [c for c in candidates.values() if c.plan.fits]
    if not fitting:
        least = min((max(c.plan.peak_bytes) for c in candidates.values()), default=math.nan)
        raise ValueError(
            f"memory_gb: no split of {model} over {layout.pp} stages fits {layout.memory_gb:g} GiB per GPU, even "
            f"recomputing every layer (the least peak found is {least / _GIB:.1f} GiB)"
        )
    keys = {
        name: (data, baseline_split if split == "uniform" else split, recompute)
        for name, (data, split, recompute) in CONFIGURATIONS.items()
    }
    base = candidates[keys["baseline"]]
    chosen = [(name, candidates[key]) for name, key in keys.items()]
    chosen.append(("all", min(fitting, key=lambda c: c.epoch.epoch_ms)))
    configurations = tuple(_configuration(n, c, base.epoch.epoch_ms, layout.gpus) for n, c in chosen)
    return OmniverseResult(
        model=model,
        layout=layout,
        hardware=hardware,
        samples=next(iter(datas.values())).samples,
        configurations=configurations,
        data={name: data_summary(data) for name, data in datas.items()},
        micro_batches=dict(datas),
    )
