"""Model, memory and data balance in a pipeline on InternVL-Chat-like shapes, by simulation.

Profiles are estimated from the configs (``internvl-6b-20b``: InternViT-6B + InternLM2-20B; ``internvl-300m-7b``:
InternViT-300M + a 7B InternLM2) for the first 64 balanced packs of the bundled InternVL-Chat SFT loads
(16 tiles / 5,376 tokens per pack), on an 80 GiB device at 312 TFLOP/s x 0.5, 25 GB/s between stages, 32
micro-batches per step and a distributed optimizer over 8 data-parallel ranks (4 + 12/8 static bytes per
parameter). Every step time is the schedule simulator's (``pipeline.simulate``).

- ``balance``: 1F1B, the uniform split, Megatron's VLM layout ("vit-first": the vision encoder and projector on
  the first stage, the decoder layers split evenly), the paper's search and the exact search (least simulated
  step), each with one recompute setting for every stage (none if every stage fits, else every layer) and with
  the per-rank recompute plan. The paper reports, for InternVL-Chat 6B+20B on Megatron, 1.79x from model
  balance and 1.36x more from memory balance (51.9 -> 29.0 -> 21.3 GPU days) against a baseline that is not
  public in full.
- ``schedules``: the exact search's step under 1F1B, GPipe, interleaved 1F1B (2 chunks per rank), ZB-H1
  (``interleaved-zb``, 1 chunk) and ZBV, with the proven gap to optimal.
- ``data``: one searched split (1F1B and interleaved, 8 ranks), run with one time per micro-batch from the packs
  each data-parallel rank trains (``simulate_packs``: each layer's time scaled by its kind's cost of the pack)
  for balanced, random and ISF packs of the bundled loads; an optimizer step lasts as long as its slowest rank.
  "data" is the share of the bubble the packs add: the step with per-pack times against the same packs at
  their mean time.

    python benchmarks/bench_pipeline.py [balance] [schedules] [data] [--markdown]   # --markdown: also as Markdown
    python -m pytest benchmarks/bench_pipeline.py  # pytest-benchmark: search time
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pytest

from omnibal_kernels import PlanOptions
from omnibal_kernels.balance import plan_packs
from omnibal_kernels.lengths import default_lengths
from omnibal_kernels.pipeline import (
    cost_model_from_config,
    evaluate_partition,
    packs_from_plan,
    partition,
    profile_from_config,
    simulate_packs,
    vit_first_stages,
)

MODELS = ("internvl-6b-20b", "internvl-300m-7b")
STAGES = (4, 8, 16)
MICRO_BATCHES = 32
MEMORY_BYTES = 80 * 2**30
STATIC_BYTES_PER_PARAM = 4 + 12 / 8
WORLD_SIZE = 8
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
SCHEDULE_CASES = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("interleaved-zb", 1), ("zbv", 2))
DATA_CASES = (("1f1b", 1), ("interleaved", 2))
DATA_STAGES = 8
DATA_STEPS = 8  # optimizer steps simulated per pack method


def _plans(method: str):
    lengths = default_lengths()
    plan = plan_packs(
        lengths, PlanOptions(method=method, vit_capacity=16, llm_capacity=5376, seed=0), world_size=WORLD_SIZE
    )
    return lengths, plan


def reference_packs() -> list[tuple[np.ndarray, np.ndarray]]:
    lengths, plan = _plans("balanced")
    return packs_from_plan(plan, lengths, limit=64)


def profiles() -> dict[str, Any]:
    packs = reference_packs()
    return {name: profile_from_config(name, packs, static_bytes_per_param=STATIC_BYTES_PER_PARAM) for name in MODELS}


def _run(profile: Any, stages: int, method: str, recompute: str, **kw: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    common = dict(micro_batches=MICRO_BATCHES, memory_bytes=MEMORY_BYTES, recompute=recompute, **kw)
    try:
        if method == "vit-first":
            plan = evaluate_partition(profile, vit_first_stages(profile, stages), method=method, **common)
        else:
            plan = partition(profile, stages, method=method, **common)
    except ValueError:
        plan = None
    return plan, time.perf_counter() - start


def balance_table() -> list[dict[str, Any]]:
    rows = []
    for name, profile in profiles().items():
        for stages in STAGES:
            row: dict[str, Any] = {"model": name, "stages": stages}
            for label, method, recompute in VARIANTS:
                plan, seconds = _run(profile, stages, method, recompute)
                row[label] = plan.step_ms if plan is not None and plan.fits else float("nan")
                row[label + "_s"] = seconds
            row["model_balance"] = row["uniform"] / row["exact"]
            row["model_balance_vit_first"] = row["vit-first"] / row["exact"]
            row["memory_balance"] = row["exact"] / row["exact+mem"]
            row["total"] = row["uniform"] / row["exact+mem"]
            rows.append(row)
    return rows


def schedule_table() -> list[dict[str, Any]]:
    rows = []
    for name, profile in profiles().items():
        for stages in STAGES:
            row: dict[str, Any] = {"model": name, "stages": stages}
            for schedule, v in SCHEDULE_CASES:
                plan, seconds = _run(profile, stages, "exact", "plan", schedule=schedule, virtual_stages=v)
                key = f"{schedule}/{v}"
                row[key] = (plan.step_ms, plan.bubble, plan.optimality_gap, seconds) if plan is not None else None
            rows.append(row)
    return rows


def _steps(lengths: Any, plan: Any) -> list[list[list[tuple[np.ndarray, np.ndarray]]]]:
    """Per optimizer step, per data-parallel rank, its micro-batches' (vit, llm) loads."""
    vit, llm = np.asarray(lengths.vit), np.asarray(lengths.llm)
    out = []
    for k in range(DATA_STEPS):
        rows = slice(k * MICRO_BATCHES, (k + 1) * MICRO_BATCHES)
        out.append(
            [[(vit[plan.pack(p)], llm[plan.pack(p)]) for p in plan.step_packs[rows, r]] for r in range(WORLD_SIZE)]
        )
    return out


def data_table() -> list[dict[str, Any]]:
    ref = reference_packs()
    packs = {method: _steps(*_plans(method)) for method in ("balanced", "random", "isf")}
    rows = []
    for name, profile in profiles().items():
        model = cost_model_from_config(name)
        for schedule, v in DATA_CASES:
            plan, _ = _run(profile, DATA_STAGES, "exact", "plan", schedule=schedule, virtual_stages=v)
            row: dict[str, Any] = {
                "model": name,
                "schedule": schedule,
                "virtual_stages": v,
                "constant_step_ms": plan.step_ms,
                "constant_bubble": plan.bubble,
            }
            for method, steps in packs.items():
                step_ms, ideal_ms, busy, tokens = [], [], [], 0.0
                for ranks in steps:
                    runs, flat = [], []
                    for mbs in ranks:
                        runs.append(simulate_packs(plan, profile, mbs, cost_model=model, reference=ref))
                        mean_pack = (
                            np.concatenate([x for x, _ in mbs]) / len(mbs),
                            np.concatenate([t for _, t in mbs]) / len(mbs),
                        )
                        flat.append(
                            simulate_packs(plan, profile, [mean_pack] * len(mbs), cost_model=model, reference=ref)
                        )
                        tokens += float(sum(t.sum() for _, t in mbs))
                    slowest = max(range(WORLD_SIZE), key=lambda r: runs[r].step_ms)
                    step_ms.append(runs[slowest].step_ms)
                    ideal_ms.append(flat[slowest].step_ms)
                    busy.append(sum(runs[slowest].busy_ms) / DATA_STAGES)
                s, f, b = np.array(step_ms), np.array(ideal_ms), np.array(busy)
                idle = (s - b).sum()
                row[method] = {
                    "step_ms": float(s.mean()),
                    "bubble": float(idle / s.sum()),
                    "data_share": float(((s - f).sum()) / idle) if idle > 0 else 0.0,
                    "tokens_per_s": tokens / (s.sum() / 1e3),
                }
            rows.append(row)
    return rows


def _short(name: str) -> str:
    return {"internvl-6b-20b": "6B+20B", "internvl-300m-7b": "300M+7B"}[name]


def print_balance(rows: list[dict[str, Any]], markdown: bool) -> None:
    if markdown:
        print(
            "| model, stages | ViT on stage 0 | uniform | exact | uniform recompute -> per-rank plan (exact) | total |"
        )
        print(
            "| ------------- | -------------: | ------: | ----: | -----------------------------------------: | ----: |"
        )
        for r in rows:
            vf = "does not fit" if np.isnan(r["vit-first"]) else f"{r['vit-first'] / 1e3:.1f}"
            print(
                f"| {_short(r['model'])}, {r['stages']} | {vf} | {r['uniform'] / 1e3:.1f} | {r['exact'] / 1e3:.1f} | "
                f"{r['exact'] / 1e3:.1f} -> {r['exact+mem'] / 1e3:.1f} ({r['memory_balance']:.2f}x) | "
                f"{r['total']:.2f}x |"
            )
        return
    print(f"predicted 1F1B step (s), {MICRO_BATCHES} micro-batches, 80 GiB per rank; nan: does not fit")
    head = "".join(f"{label:>12}" for label, *_ in VARIANTS)
    print(f"{'model':<17}{'P':>3}{head}  model bal. (vs vit-first)  mem bal.  total  search s")
    for r in rows:
        steps = "".join(f"{r[label] / 1e3:>12.2f}" for label, *_ in VARIANTS)
        search = max(r[label + "_s"] for label, *_ in VARIANTS)
        print(
            f"{r['model']:<17}{r['stages']:>3}{steps}  {r['model_balance']:>9.2f}x "
            f"({r['model_balance_vit_first']:.2f}x){r['memory_balance']:>15.2f}x{r['total']:>6.2f}x{search:>9.2f}"
        )
    print(
        f"paper (InternVL-Chat 6B+20B, Megatron): model balance {PAPER_MODEL_BALANCE:.2f}x, memory balance "
        f"{PAPER_MEMORY_BALANCE:.2f}x more, {PAPER_MODEL_BALANCE * PAPER_MEMORY_BALANCE:.2f}x together"
    )


def print_schedules(rows: list[dict[str, Any]], markdown: bool) -> None:
    keys = [f"{s}/{v}" for s, v in SCHEDULE_CASES]
    labels = ["1F1B", "GPipe", "interleaved (2)", "ZB-H1", "ZBV"]
    if markdown:
        print("| model, ranks | " + " | ".join(labels) + " |")
        print("| ------------ | " + " | ".join("-" * len(x) + ":" for x in labels) + " |")
    else:
        print("exact search under each schedule: step s (bubble, proven gap to optimal), search s")
    for r in rows:
        cells = []
        for k in keys:
            cell = r[k]
            if cell is None:
                cells.append("does not fit")
                continue
            step, bubble, gap, seconds = cell
            proven = "" if gap <= 1e-9 else f", gap <= {gap:.1%}"
            cells.append(f"{step / 1e3:.1f} ({bubble:.1%}{proven})" + ("" if markdown else f" {seconds:.1f}s"))
        print(
            (f"| {_short(r['model'])}, {r['stages']} | " + " | ".join(cells) + " |")
            if markdown
            else f"{r['model']:<17}{r['stages']:>3}  " + "  ".join(f"{c:>26}" for c in cells)
        )


def print_data(rows: list[dict[str, Any]], markdown: bool) -> None:
    methods = ("balanced", "random", "isf")
    if markdown:
        print(
            "| model, schedule | mean packs: step, bubble | "
            + " | ".join(f"{m}: step, bubble (data)" for m in methods)
            + " | balanced tokens/s vs random, isf |"
        )
        print("| --------------- | -----------------------: | " + " | ".join("---:" for _ in methods) + " | ---: |")
    else:
        print(
            f"one searched split, {DATA_STAGES} ranks, {DATA_STEPS} optimizer steps x {WORLD_SIZE} data-parallel "
            "ranks; step s, bubble (share of it from the data)"
        )
    for r in rows:
        label = f"{_short(r['model'])}, {r['schedule']}" + (
            f" ({r['virtual_stages']})" if r["virtual_stages"] > 1 else ""
        )
        cells = [f"{r['constant_step_ms'] / 1e3:.2f} s, {r['constant_bubble']:.1%}"]
        for m in methods:
            x = r[m]
            cells.append(f"{x['step_ms'] / 1e3:.2f} s, {x['bubble']:.1%} ({x['data_share']:.0%})")
        speed = (
            f"{r['balanced']['tokens_per_s'] / r['random']['tokens_per_s']:.2f}x, "
            f"{r['balanced']['tokens_per_s'] / r['isf']['tokens_per_s']:.2f}x"
        )
        print(
            (f"| {label} | " + " | ".join(cells) + f" | {speed} |")
            if markdown
            else f"{label:<28}" + "  ".join(f"{c:>24}" for c in cells) + f"  {speed}"
        )


def main(argv: list[str]) -> None:
    markdown = "--markdown" in argv
    parts = [a for a in argv if not a.startswith("--")] or ["balance", "schedules", "data"]
    tables = {
        "balance": (balance_table, print_balance),
        "schedules": (schedule_table, print_schedules),
        "data": (data_table, print_data),
    }
    for part in parts:
        if part not in tables:
            raise SystemExit(f"unknown part {part!r}: balance, schedules or data")
        make, show = tables[part]
        rows = make()
        show(rows, False)
        if markdown:  # the same rows as Markdown tables
            print()
            show(rows, True)
        print()


# --- pytest-benchmark ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_6b() -> Any:
    return profiles()["internvl-6b-20b"]


@pytest.mark.parametrize("method", ["exact", "paper", "uniform"])
def test_search_time(benchmark, profile_6b, method):
    benchmark.group = "pipeline partition search, 6B+20B, 8 stages, 80 GiB, recompute plan"
    plan = benchmark(
        lambda: partition(
            profile_6b, 8, micro_batches=MICRO_BATCHES, memory_bytes=MEMORY_BYTES, method=method, recompute="plan"
        )
    )
    benchmark.extra_info.update(
        step_ms=plan.step_ms, bottleneck_ms=plan.bottleneck_ms, fits=plan.fits, optimality_gap=plan.optimality_gap
    )


if __name__ == "__main__":
    main(sys.argv[1:])
