"""Planning speed and balance quality: the ``planning`` and ``quality`` providers of ``omnibal_kernels.bench``
as pytest-benchmark groups, and the slow Python ISF against ours.

    python -m pytest benchmarks/bench_balance.py --benchmark-only   # groups: plan N samples, quality, isf
    python benchmarks/bench_balance.py [--quick]                     # the suite's tables for these parts
    python benchmarks/bench_balance.py targets [--quick]             # only the targets on every class

Group "plan N samples": every method and ``numpy.argsort`` of the same token counts, on the bundled loads
(70,706) and the same resampled to 1.2M. Group "quality": one call per method on the bundled data, 8 ranks,
its balance row and simulated speed-up over random padded in ``extra_info``. Group "isf 70k": the
straightforward Python ISF of ``omnibal_kernels.testing`` against ours, same algorithm and capacities.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.bench import environment, run_suite
from omnibal_kernels.bench.markdown import to_markdown
from omnibal_kernels.bench.planning import WORLD_SIZE, _methods
from omnibal_kernels.bench.quality import METHODS, datasets, make_plans, quality_row
from omnibal_kernels.synthetic import synthetic_lengths

SIZES = {"70k": None, "1.2M": 1_200_000}
SEED = 0


@pytest.fixture(scope="module", params=list(SIZES))
def loads(request):
    return request.param, synthetic_lengths("bundled", SIZES[request.param], SEED)


@pytest.mark.parametrize("method", ["argsort", "balanced", "random", "isf", "length_grouped", "random_padded",
                                    "ffd_tokens"])
def test_plan(benchmark, loads, method: str) -> None:
    label, lengths = loads
    funcs = _methods(lengths, SEED)
    funcs["argsort"] = lambda: np.argsort(lengths.llm)
    benchmark.group = f"plan {label} samples, {WORLD_SIZE} ranks"
    benchmark.extra_info.update(samples=len(lengths), **environment()["versions"])
    funcs[method]()  # warm-up: lazy imports, compiled code
    benchmark(funcs[method])


@pytest.mark.parametrize("method", METHODS)
def test_quality(benchmark, method: str) -> None:
    lengths, cost = datasets(quick=True, seed=SEED)["bundled"]
    plans = make_plans(lengths, cost, WORLD_SIZE, SEED)
    base = quality_row("bundled", "random_padded", plans["random_padded"], lengths, cost)["sim_epoch"]
    row = quality_row("bundled", method, plans[method], lengths, cost)
    benchmark.group = f"quality: bundled data, {WORLD_SIZE} ranks"
    benchmark.extra_info.update(row, sim_speedup=base / row["sim_epoch"])
    benchmark(lambda: quality_row("bundled", method, plans[method], lengths, cost))


@pytest.mark.parametrize("provider", ["python_reference", "ours"])
def test_isf_70k(benchmark, provider: str) -> None:
    from omnibal_kernels import plan_packs
    from omnibal_kernels.testing import isf_reference

    real = synthetic_lengths("bundled", None, SEED)
    items = np.arange(len(real), dtype=np.int64)
    benchmark.group = "isf 70k samples at 18 / 6016"
    if provider == "ours":
        benchmark(lambda: plan_packs(real, world_size=WORLD_SIZE, method="isf", vit_capacity=18, llm_capacity=6016))
    else:
        benchmark.pedantic(lambda: isf_reference(real.vit, real.llm, items, 18, 6016, 18, 5888, 50, 0), rounds=1)


def main(argv: list[str]) -> int:
    parts = ["targets"] if "targets" in argv else ["quality", "targets", "planning"]
    report = run_suite(parts, quick="--quick" in argv, log=lambda s: print(s, file=sys.stderr))
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
