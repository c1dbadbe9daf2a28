"""The OmniBal paper's Table 2 and the runs that set this library's parts beside it.

The paper (arXiv 2407.20761) reports A100 GPU-days of InternVL-Chat-1.5 SFT on the InternVL-1.2M data: for
6+20B on Megatron-DeepSpeed, baseline 61.8 -> + balanced data 51.9 -> + balanced model partition 29.0 ->
+ adaptive re-computation 21.3; on DeepSpeed 38.9 -> 25.3; 6+34B 54.3 -> 35.5 (DeepSpeed) and 75.4 -> 30.5
(Megatron). The GPU count and the parallel layout of those runs are not given, so :func:`comparison` runs
stated assumptions (:data:`ASSUMED_LAYOUT`) and :func:`sweep` varies them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Callable, Optional

from ..lengths import Lengths
from .compose import OmniverseResult
from .layout import Layout
from .run import omniverse

__all__ = ["ASSUMED_LAYOUT", "PAPER_GPU_DAYS", "comparison", "paper_ratios", "result_row", "sweep"]

# (model, backend) -> GPU-days of the baseline, + data, + model, + memory (None where the paper gives only the
# first and the last)
PAPER_GPU_DAYS: dict[tuple[str, str], tuple[float, Optional[float], Optional[float], float]] = {
    ("internvl-6b-20b", "Megatron-DeepSpeed"): (61.8, 51.9, 29.0, 21.3),
    ("internvl-6b-20b", "DeepSpeed"): (38.9, None, None, 25.3),
    ("internvl-6b-34b", "Megatron-DeepSpeed"): (75.4, None, None, 30.5),
    ("internvl-6b-34b", "DeepSpeed"): (54.3, None, None, 35.5),
}
# What the paper does not state, assumed: 256 A100-80GB, 8 pipeline stages of 4 tensor-parallel GPUs (8
# data-parallel pipelines), 32 micro-batches per step, 1F1B.
ASSUMED_LAYOUT = Layout(gpus=256, pp=8, tp=4, micro_batches=32, memory_gb=80.0)
PAPER_SAMPLES = 1_200_000


def paper_ratios(model: str, backend: str) -> dict[str, Optional[float]]:
    """The paper's factors in its order (``data``, ``model``, ``memory``; ``None`` where not reported) and
    ``total``."""
    base, data, part, every = PAPER_GPU_DAYS[(model, backend)]
    return {
        "data": base / data if data else None,
        "model": data / part if data and part else None,
        "memory": part / every if part else None,
        "total": base / every,
    }


def result_row(result: OmniverseResult, **labels: Any) -> dict[str, Any]:
    """One row of a comparison: the labels, the paper-order factors, each part alone, GPU-days and bubbles."""
    base, every = result["baseline"], result["all"]
    return {
        **labels,
        "layout": result.layout.to_dict(),
        "cumulative": result.cumulative,
        "factors": result.factors,
        "baseline_gpu_days": base.gpu_days,
        "all_gpu_days": every.gpu_days,
        "baseline_bubble": base.bubble_fraction,
        "baseline_bubble_from_data": base.bubble_from_data,
        "all_bubble": every.bubble_fraction,
        "baseline_recompute": base.recompute_fraction,
        "baseline_fits": base.fits,
        "all_choice": [every.data, every.split, every.recompute],
        "data_choices": dict(result.data),
        "configurations": [c.to_dict() for c in result.configurations],
    }


def comparison(
    datasets: dict[str, tuple[Optional[Lengths], Optional[int]]],
    models: Sequence[str] = ("internvl-6b-20b", "internvl-6b-34b"),
    *,
    layout: Layout = ASSUMED_LAYOUT,
    baseline_splits: Sequence[str] = ("uniform", "vit-first"),
    say: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    """The main table: every model on every data set (``{label: (lengths or None for the bundled data,
    resampled size or None)}``) under ``layout``, with each baseline split."""
    rows = []
    for model in models:
        for label, (lengths, samples) in datasets.items():
            for split in baseline_splits:
                say(f"[omniverse] {model}, {label}, baseline split {split}")
                result = omniverse(model, layout, lengths, samples=samples, baseline_split=split)
                rows.append(result_row(result, model=model, data=label, baseline_split=split, samples=result.samples))
    return rows


def sweep(
    model: str = "internvl-6b-20b",
    *,
    gpus: int = 256,
    tps: Sequence[int] = (4,),
    pps: Sequence[int] = (4, 8, 16),
    micro_batches: Sequence[int] = (16, 32, 64, 128),
    memories: Sequence[float] = (40.0, 80.0),
    lengths: Optional[Lengths] = None,
    say: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    """The sensitivity sweep: tensor-parallel size x pipeline stages x micro-batches x memory per GPU on one
    model and data set (a layout no split fits is a row with ``error``)."""
    rows = []
    for tp, pp, m, memory in itertools.product(tps, pps, micro_batches, memories):
        if gpus % (pp * tp):
            continue
        layout = Layout(gpus=gpus, pp=pp, tp=tp, micro_batches=m, memory_gb=memory)
        say(f"[omniverse] sweep TP {tp}, PP {pp}, {m} micro-batches, {memory:g} GiB")
        try:
            result = omniverse(model, layout, lengths)
        except ValueError as exc:
            rows.append({"model": model, "layout": layout.to_dict(), "error": str(exc)})
            continue
        row = result_row(result, model=model)
        del row["configurations"]
        rows.append(row)
    return rows
