"""Model and memory balance on InternVL-Chat-like shapes: predicted step time of the uniform split, the paper's
search and the exact search, with one recompute setting for every stage and with per-stage recompute plans.

Profiles are estimated from the configs (``internvl-6b-20b``: InternViT-6B + InternLM2-20B; ``internvl-300m-7b``:
InternViT-300M + a 7B InternLM2) for the first 64 balanced packs of the bundled InternVL-Chat SFT loads
(16 tiles / 5,376 tokens per pack), on an 80 GiB device at 312 TFLOP/s x 0.5, 25 GB/s between stages, 1F1B with
32 micro-batches per step and a distributed optimizer over 8 data-parallel ranks (4 + 12/8 static bytes per
parameter). "Without memory balance" is one recompute setting for all stages (none if every stage fits, else
every layer: what a uniform configuration must do); "with" is the per-stage knapsack searched with the
partition. "vit-first" is Megatron's layout for VLMs (the vision encoder and projector on the first stage, the
decoder layers split evenly), "uniform" equal layer counts over the whole chain. The paper reports, for InternVL-Chat 6B+20B on Megatron, 1.79x from model balance and 1.36x more
from memory balance (51.9 -> 29.0 -> 21.3 GPU days); its baseline configuration is not public in full, so the
ratios here are for the baselines stated above ("model bal." = uniform / exact, in brackets vit-first /
exact; "mem bal." = exact / exact+mem; "total" = uniform / exact+mem).

    python benchmarks/bench_pipeline.py            # prints the table
    python -m pytest benchmarks/bench_pipeline.py  # pytest-benchmark: search time, exact vs paper vs uniform
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from omnibal_kernels.balance import plan_packs
from omnibal_kernels.lengths import default_lengths
from omnibal_kernels.pipeline import evaluate_partition, packs_from_plan, partition, profile_from_config, uniform_stages

MODELS = ("internvl-6b-20b", "internvl-300m-7b")
STAGES = (4, 8, 16)
MICRO_BATCHES = 32
MEMORY_BYTES = 80 * 2**30
STATIC_BYTES_PER_PARAM = 4 + 12 / 8
PAPER_MODEL_BALANCE = 51.9 / 29.0  # 1.79x
PAPER_MEMORY_BALANCE = 29.0 / 21.3  # 1.36x
VARIANTS = (  # (label, method, recompute)
    ("vit-first", "vit-first", "uniform"),
    ("uniform", "uniform", "uniform"),
    ("paper", "paper", "uniform"),
    ("exact", "exact", "uniform"),
    ("uniform+mem", "uniform", "plan"),
    ("paper+mem", "paper", "plan"),
    ("exact+mem", "exact", "plan"),
)


def profiles() -> dict[str, Any]:
    lengths = default_lengths()
    plan = plan_packs(lengths, world_size=8, vit_capacity=16, llm_capacity=5376, seed=0)
    packs = packs_from_plan(plan, lengths, limit=64)
    return {name: profile_from_config(name, packs, static_bytes_per_param=STATIC_BYTES_PER_PARAM) for name in MODELS}


def vit_first_stages(profile: Any, stages: int) -> list[tuple[int, int]]:
    """Megatron's VLM layout: the vision encoder and projector on stage 0, the decoder layers split evenly."""
    n_front = sum(layer.kind in ("vit", "projector") for layer in profile.layers)
    rest = uniform_stages(len(profile) - n_front, stages)
    out = [(0, n_front + rest[0][1])] + [(a + n_front, b + n_front) for a, b in rest[1:]]
    return out


def _run(profile: Any, stages: int, method: str, recompute: str) -> tuple[Any, float]:
    start = time.perf_counter()
    try:
        if method == "vit-first":
            plan = evaluate_partition(profile, vit_first_stages(profile, stages), micro_batches=MICRO_BATCHES,
                                      memory_bytes=MEMORY_BYTES, recompute=recompute, method=method)
        else:
            plan = partition(profile, stages, micro_batches=MICRO_BATCHES, memory_bytes=MEMORY_BYTES,
                             method=method, recompute=recompute)
    except ValueError:
        plan = None
    return plan, time.perf_counter() - start


def table() -> list[dict[str, Any]]:
    rows = []
    for name, profile in profiles().items():
        for stages in STAGES:
            row: dict[str, Any] = {"model": name, "stages": stages}
            for label, method, recompute in VARIANTS:
                plan, seconds = _run(profile, stages, method, recompute)
                ok = plan is not None and plan.fits
                row[label] = plan.step_ms if ok else float("nan")
                row[label + "_s"] = seconds
            row["model_balance"] = row["uniform"] / row["exact"]
            row["model_balance_vit_first"] = row["vit-first"] / row["exact"]
            row["memory_balance"] = row["exact"] / row["exact+mem"]
            row["total"] = row["uniform"] / row["exact+mem"]
            rows.append(row)
    return rows


def main() -> None:
    rows = table()
    print(f"predicted 1F1B step (s), {MICRO_BATCHES} micro-batches, 80 GiB per stage; nan: does not fit")
    head = "".join(f"{label:>12}" for label, *_ in VARIANTS)
    print(f"{'model':<17}{'P':>3}{head}  model bal. (vs vit-first)  mem bal.  total  search s")
    for r in rows:
        steps = "".join(f"{r[label] / 1e3:>12.2f}" for label, *_ in VARIANTS)
        search = max(r[label + "_s"] for label, *_ in VARIANTS)
        print(f"{r['model']:<17}{r['stages']:>3}{steps}  {r['model_balance']:>9.2f}x ({r['model_balance_vit_first']:.2f}x)"
              f"{r['memory_balance']:>15.2f}x{r['total']:>6.2f}x{search:>9.2f}")
    print(f"paper (InternVL-Chat 6B+20B, Megatron): model balance {PAPER_MODEL_BALANCE:.2f}x, memory balance "
          f"{PAPER_MEMORY_BALANCE:.2f}x more, {PAPER_MODEL_BALANCE * PAPER_MEMORY_BALANCE:.2f}x together")
    for r in rows:
        miss = r["paper+mem"] / r["exact+mem"] - 1
        print(f"{r['model']:<17}{r['stages']:>3}  paper search vs exact (with memory balance): {miss:+.1%} step")


# --- pytest-benchmark ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_6b() -> Any:
    return profiles()["internvl-6b-20b"]


@pytest.mark.parametrize("method", ["exact", "paper", "uniform"])
def test_search_time(benchmark, profile_6b, method):
    benchmark.group = "pipeline partition search, 6B+20B, 8 stages, 80 GiB, recompute plan"
    plan = benchmark(lambda: partition(profile_6b, 8, micro_batches=MICRO_BATCHES, memory_bytes=MEMORY_BYTES,
                                       method=method, recompute="plan"))
    benchmark.extra_info.update(step_ms=plan.step_ms, bottleneck_ms=plan.bottleneck_ms, fits=plan.fits)


if __name__ == "__main__":
    main()
