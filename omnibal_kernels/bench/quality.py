"""Balance quality and simulated training time: methods x data sets x world sizes.

Methods: the planner's ``random``, ``isf`` and ``balanced`` (whatever ``plan_packs`` does), and the
baselines of :mod:`.baselines`: ``random_padded`` (the yardstick), ``length_grouped`` (LLaVA) and
``ffd_tokens`` (1-D first-fit decreasing). Capacities come from ``plan_packs``' own search for a target of
``TARGET`` samples per pack (``isf`` searches its own, as the authors do); the baselines use the balanced
plan's capacities, and the padded ones micro-batches of the balanced packs' mean size (rounded), so both
take about as many steps: where the largest sample forces large capacities (long text) that is more than
``TARGET``.

Data: the bundled real loads (``"bundled"``, 70,706 samples), the same resampled to 1.2M
(``"bundled_1.2M"``) and the synthetic classes of :mod:`omnibal_kernels.synthetic`. Each data set is costed
with the model it resembles: InternViT-300M + 7B LLM for tiles and text, a Qwen2-VL-7B-like model (a 675M
ViT attending over all of a sample's patches) for patches.

Every row also checks the plan: each input sample is scheduled at least once; ``dropped`` counts samples in
no slot and ``duplicated`` sample entries beyond the first (the reused packs of a ragged last step).
"""

from __future__ import annotations

from typing import Any, Optional, cast

import numpy as np

from ..balance import CostModel, balance_report, plan_packs
from ..balance.options import PlanOptions
from ..lengths import Lengths
from ..synthetic import synthetic_lengths
from .baselines import ffd_tokens_plan, length_grouped_plan, over_vit_capacity, random_padded_plan, warmup
from .runner import Config, register
from .simulate import epoch_time, ideal_time, pack_loads, padding_fraction, rank_costs

TARGET = 4.0
METHODS = ("random_padded", "length_grouped", "ffd_tokens", "random", "isf", "balanced")
PATCH_CLASSES = ("patch_multires", "video_mix")
# (synthetic classes, their sample count, world sizes, the 1.2M resample or not)
FULL = dict(
    classes=(
        "text_long_tail",
        "single_image_short_text",
        "many_images_long_text",
        "patch_multires",
        "video_mix",
        "half_text_half_image",
    ),
    n=100_000,
    world_sizes=(8, 64, 512),
    resample=1_200_000,
)
QUICK = dict(classes=("single_image_short_text", "patch_multires"), n=20_000, world_sizes=(8, 64), resample=None)
# the headline speed-ups and the pictures use this world size
HEADLINE_WORLD_SIZE = 8
TRACE_STEPS = 40


def qwen2vl_7b_cost() -> CostModel:
    """A Qwen2-VL-7B-like model: a 675M, 32-layer ViT (hidden 1280) over all of a sample's patches + 7B LLM."""
    return CostModel.from_shapes(
        vit_params=0.675e9,
        vit_layers=32,
        vit_hidden=1280,
        vit_tokens_per_unit=1,
        vit_units_attend_jointly=True,
        llm_params=7.0e9,
        llm_layers=32,
        llm_hidden=4096,
    )


def datasets(quick: bool, seed: int) -> dict[str, tuple[Lengths, CostModel]]:
    """Data set name -> (loads, cost model)."""
    sizes: dict[str, Any] = QUICK if quick else FULL
    out = {"bundled": (synthetic_lengths("bundled", None, seed), CostModel.internvl_7b())}
    if sizes["resample"]:
        out["bundled_1.2M"] = (synthetic_lengths("bundled", sizes["resample"], seed), CostModel.internvl_7b())
    for kind in sizes["classes"]:
        cost = qwen2vl_7b_cost() if kind in PATCH_CLASSES else CostModel.internvl_7b()
        out[kind] = (synthetic_lengths(kind, sizes["n"], seed), cost)
    return out


def make_plans(lengths: Lengths, cost: CostModel, world_size: int, seed: int) -> dict[str, Any]:
    """Method -> plan of ``lengths`` for ``world_size`` ranks (see the module docstring)."""
    plans = {}
    for method in ("random", "isf", "balanced"):
        plans[method] = plan_packs(
            lengths,
            PlanOptions(method=method, target_batch_size=TARGET, cost_model=cost, seed=seed),
            world_size=world_size,
        )
    caps = (plans["balanced"].vit_capacity, plans["balanced"].llm_capacity)
    # padded micro-batches of the balanced packs' mean size, so both take about as many steps
    batch = max(1, int(round(plans["balanced"].num_input_samples / plans["balanced"].num_packs)))
    plans["random_padded"] = random_padded_plan(
        lengths, world_size=world_size, batch_size=batch, capacities=caps, seed=seed
    )
    plans["length_grouped"] = length_grouped_plan(
        lengths, world_size=world_size, batch_size=batch, capacities=caps, seed=seed
    )
    plans["ffd_tokens"] = ffd_tokens_plan(
        lengths, world_size=world_size, llm_capacity=caps[1], vit_capacity=caps[0], seed=seed
    )
    return {m: plans[m] for m in METHODS}


def coverage(plan: Any, n: int) -> tuple[int, int]:
    """(dropped, duplicated): input samples in no slot, and sample entries beyond each sample's first."""
    slots = plan.slot_samples()
    seen = np.bincount(slots, minlength=n)
    return int((seen == 0).sum()), int((seen - 1).clip(min=0).sum())


def quality_row(name: str, method: str, plan: Any, lengths: Lengths, cost: CostModel) -> dict[str, Any]:
    """One row of the balance table, with the simulated epoch time (cost model units)."""
    report = balance_report(plan, lengths, cost)
    dropped, duplicated = coverage(plan, len(lengths))
    costs = rank_costs(plan, lengths, cost)
    peak = costs.max(axis=1)
    return {
        "data": name,
        "world_size": plan.world_size,
        "method": method,
        "vit_capacity": plan.vit_capacity,
        "llm_capacity": plan.llm_capacity,
        "ave_bs": report.ave_bs,
        "vit_fill": report.vit_fill,
        "llm_fill": report.llm_fill,
        "vit_dist": report.vit_dist,
        "llm_dist": report.llm_dist,
        # padding-aware: mean over steps of mean rank time / slowest rank time
        "step_efficiency": float(np.mean(costs.mean(axis=1) / np.where(peak > 0, peak, 1.0))),
        "padding": padding_fraction(plan, lengths),
        "over_vit_capacity": over_vit_capacity(plan, lengths),
        "dropped": dropped,
        "duplicated": duplicated,
        "seconds": plan.seconds,
        "steps": plan.num_steps,
        "sim_epoch": epoch_time(costs),
    }


def _trace(plan: Any, lengths: Lengths, cost: CostModel, scale: float) -> list[list[float]]:
    return (rank_costs(plan, lengths, cost)[:TRACE_STEPS] / scale).round(4).tolist()


def _histograms(plans: dict[str, Any], lengths: Lengths, cost: CostModel) -> dict[str, Any]:
    """Histograms of the distinct scheduled packs' ViT and LLM loads, per method, against the capacities."""
    caps = (plans["balanced"].vit_capacity, plans["balanced"].llm_capacity)
    loads = {m: pack_loads(plans[m], lengths, cost) for m in ("random", "isf", "balanced", "ffd_tokens")}
    vit_top = max(max(int(pl.vit.max()) for pl in loads.values()), caps[0]) + 1
    llm_top = max(max(int(pl.llm.max()) for pl in loads.values()), caps[1])
    llm_edges = np.linspace(0, llm_top * 1.001, 61)
    out: dict[str, Any] = {
        "vit_capacity": caps[0],
        "llm_capacity": caps[1],
        "llm_edges": llm_edges.round(1).tolist(),
        "isf_capacities": [plans["isf"].vit_capacity, plans["isf"].llm_capacity],
        "methods": {},
    }
    for m, pl in loads.items():
        keep = np.unique(plans[m].step_packs)
        out["methods"][m] = {
            "vit": np.bincount(pl.vit[keep], minlength=vit_top).tolist(),
            "llm": np.histogram(pl.llm[keep], llm_edges)[0].tolist(),
        }
    return out


@register("quality")
def run(config: Config) -> dict[str, Any]:
    """Balance quality of every method, data set and world size, and the simulated speed-ups."""
    sizes: dict[str, Any] = QUICK if config.quick else FULL
    warmup()
    rows: list[dict[str, Any]] = []
    speedup: dict[str, dict[str, float]] = {}
    extras: dict[str, Any] = {}
    for name, (lengths, cost) in datasets(config.quick, config.seed).items():
        for world_size in sizes["world_sizes"]:
            plans = make_plans(lengths, cost, world_size, config.seed)
            base: Optional[float] = None
            for method, plan in plans.items():
                row = quality_row(name, method, plan, lengths, cost)
                base = row["sim_epoch"] if method == "random_padded" else base
                row["sim_speedup"] = cast(float, base) / row["sim_epoch"]  # random_padded is first in METHODS
                rows.append(row)
            limit = cast(float, base) / ideal_time(lengths, cost, world_size)
            rows.append({"data": name, "world_size": world_size, "method": "limit", "sim_speedup": limit})
            if world_size == HEADLINE_WORLD_SIZE:
                speedup[name] = {r["method"]: round(r["sim_speedup"], 4) for r in rows[-len(plans) - 1 :]}
            if name == "bundled" and world_size == HEADLINE_WORLD_SIZE:
                scale = float(cost.sample_costs(lengths.vit, lengths.llm).sum() / plans["balanced"].num_packs)
                extras["load_trace"] = {
                    "data": name,
                    "world_size": world_size,
                    "unit": "rank time / mean pack time (balanced)",
                    "methods": {m: _trace(plans[m], lengths, cost, scale) for m in ("random_padded", "balanced")},
                }
                extras["pack_loads"] = _histograms(plans, lengths, cost)
            balanced = next(r for r in rows[-len(plans) - 1 :] if r["method"] == "balanced")
            config.say(
                f"  {name} ({len(lengths):,} samples), {world_size} ranks: balanced "
                f"{balanced['sim_speedup']:.3f}x over random padded (limit {limit:.3f}x)"
            )
    return {"simulated_speedup": speedup, "balance": rows, "headline_world_size": HEADLINE_WORLD_SIZE, **extras}
