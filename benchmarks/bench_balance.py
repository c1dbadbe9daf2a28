"""Planning speed and quality, ours side by side with the yardstick and the baselines, in one process.

Speed: planning 1.2M samples (the bundled real loads resampled with a fixed seed), capacity search included,
against ``numpy.argsort`` of the same 1.2M token counts; the slow Python ISF of ``omnibal_kernels.testing``
(a straightforward implementation of the authors' algorithm) runs on the 70,706 real samples.
Quality: the balance report of random, isf and balanced on the 70,706 real samples, 8 ranks, 4 per pack.

    python benchmarks/bench_balance.py            # prints both tables
    python -m pytest benchmarks/bench_balance.py  # pytest-benchmark groups
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np
import pytest

from omnibal_kernels import Lengths, balance_report, plan_packs
from omnibal_kernels.lengths import default_lengths
from omnibal_kernels.testing import isf_reference

NUM_LARGE = 1_200_000
WORLD_SIZE = 8
TARGET = 4.0


def large_lengths(n: int = NUM_LARGE, seed: int = 0) -> Lengths:
    """The real loads resampled to ``n`` samples."""
    real = default_lengths()
    idx = np.random.default_rng(seed).integers(0, len(real), n)
    return Lengths(real.vit[idx], real.llm[idx])


def _providers(lengths: Lengths) -> dict[str, Callable[[], object]]:
    return {
        "numpy.argsort (yardstick)": lambda: np.argsort(lengths.llm),
        "balanced (ours, search included)": lambda: plan_packs(lengths, world_size=WORLD_SIZE, target_batch_size=TARGET),
        "isf (ours, 18/6016)": lambda: plan_packs(lengths, world_size=WORLD_SIZE, method="isf", vit_capacity=18,
                                                  llm_capacity=6016),
        "random (ours)": lambda: plan_packs(lengths, world_size=WORLD_SIZE, method="random", vit_capacity=16,
                                            llm_capacity=5376),
    }


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def speed_table(repeats: int = 7, rounds: int = 3) -> list[tuple[str, float, float]]:
    """(provider, best seconds, ratio to argsort) on 1.2M samples, all in one process.

    Each provider runs ``repeats`` times in a row (after one warm-up call: lazy imports, caches), and the
    providers take turns ``rounds`` times, so a noisy moment on the machine does not hit one provider only.
    """
    lengths = large_lengths()
    providers = _providers(lengths)
    best = {name: float("inf") for name in providers}
    for _ in range(rounds):
        for name, fn in providers.items():
            fn()
            best[name] = min(best[name], _best_of(fn, repeats))
    base = best["numpy.argsort (yardstick)"]
    return [(name, t, t / base) for name, t in best.items()]


def other_shapes_table(repeats: int = 5) -> list[tuple[str, float, float]]:
    """(data, best seconds of the balanced plan, ratio to argsort of its token counts) for synthetic 1.2M-sample
    text-only data (16k-token packs) and Qwen2-VL-like patch loads (80k patches, 30k tokens per pack)."""
    rng = np.random.default_rng(0)
    patches = rng.integers(256, 16_384, NUM_LARGE)
    cases = {
        "balanced, text-only data": (Lengths(np.zeros(NUM_LARGE, np.int64), rng.integers(50, 4000, NUM_LARGE)),
                                      dict(vit_capacity=0, llm_capacity=16_384)),
        "balanced, Qwen2-VL-like patches": (Lengths(patches, patches // 4 + rng.integers(20, 800, NUM_LARGE)),
                                               dict(vit_capacity=80_000, llm_capacity=30_000)),
    }
    rows = []
    for name, (lengths, caps) in cases.items():
        plan = lambda: plan_packs(lengths, world_size=WORLD_SIZE, **caps)  # noqa: E731
        sort = lambda: np.argsort(lengths.llm)  # noqa: E731
        plan()
        ours, base = _best_of(plan, repeats), _best_of(sort, repeats)
        rows.append((name, ours, ours / base))
    return rows


def python_isf_ratio() -> tuple[float, float]:
    """(seconds of the Python ISF, seconds of ours) on the 70,706 real samples at 18/6016, same algorithm."""
    real = default_lengths()
    items = np.arange(len(real), dtype=np.int64)
    start = time.perf_counter()
    isf_reference(real.vit, real.llm, items, 18, 6016, 18, 5888, 50, 0)
    slow = time.perf_counter() - start
    ours = _best_of(lambda: plan_packs(real, world_size=WORLD_SIZE, method="isf", vit_capacity=18,
                                       llm_capacity=6016), 5)
    return slow, ours


def quality_table() -> list[dict]:
    real = default_lengths()
    rows = []
    for method in ("random", "isf", "balanced"):
        plan = plan_packs(real, world_size=WORLD_SIZE, method=method, target_batch_size=TARGET)
        row = balance_report(plan, real).to_dict()
        row.update(method=method, vit_capacity=plan.vit_capacity, llm_capacity=plan.llm_capacity)
        rows.append(row)
    return rows


# --- pytest-benchmark ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def large():
    return large_lengths()


@pytest.mark.parametrize("provider", ["numpy.argsort (yardstick)", "balanced (ours, search included)",
                                      "isf (ours, 18/6016)", "random (ours)"])
def test_plan_1p2m(benchmark, large, provider):
    benchmark.group = "plan 1.2M samples"
    benchmark.extra_info["samples"] = NUM_LARGE
    benchmark(_providers(large)[provider])


def main() -> int:
    print(f"planning {NUM_LARGE:,} samples (real loads resampled), {WORLD_SIZE} ranks; best of 3 x 7 runs, one process")
    for name, seconds, ratio in speed_table():
        print(f"  {name:<36} {seconds * 1e3:9.1f} ms   {ratio:6.2f}x argsort")
    for name, seconds, ratio in other_shapes_table():
        print(f"  {name:<36} {seconds * 1e3:9.1f} ms   {ratio:6.2f}x argsort of its tokens")
    slow, ours = python_isf_ratio()
    print(f"ISF on 70,706 real samples: Python reference {slow:.2f} s, ours {ours * 1e3:.1f} ms "
          f"({slow / ours:,.0f}x faster)")
    print()
    print(f"quality on the 70,706 real samples, {WORLD_SIZE} ranks, target {TARGET:g} samples per pack")
    keys = ["vit_capacity", "llm_capacity", "ave_bs", "vit_fill", "llm_fill", "vit_dist", "llm_dist",
            "step_efficiency", "duplicated"]
    rows = quality_table()
    print(f"  {'':<16}" + "".join(f"{r['method']:>12}" for r in rows))
    for key in keys:
        cells = "".join(f"{r[key]:>12.4f}" if isinstance(r[key], float) else f"{r[key]:>12}" for r in rows)
        print(f"  {key:<16}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
