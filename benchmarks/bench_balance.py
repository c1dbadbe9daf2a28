"""Planning speed and balance quality: the ``planning`` and ``quality`` providers of ``omnibal_kernels.bench``
as pytest-benchmark groups, and the slow Python ISF against ours.

    python -m pytest benchmarks/bench_balance.py --benchmark-only   # groups: plan N samples, quality, isf
    python benchmarks/bench_balance.py [--quick]                     # the suite's tables for these parts
    python benchmarks/bench_balance.py targets [--quick]             # only the targets on every class

Group "plan N samples": every method and ``numpy.argsort`` of the same token counts, on the bundled loads
(70,706) and the same resampled to 1.2M. Group "quality": one call per method on the bundled data, 8 ranks,
its balance row and simulated speed-up over random padded in ``extra_info``. Group "isf 70k": the
straightforward Python ISF of ``omnibal_kernels.testing`` against ours, same algorithm and capacities.
Groups "choice: ...": the planner's tuned constants (best-fit rounds, the step refinement's work bound,
the LLM headroom of the capacity search) at several values, each value's plan time and its balance row
in ``extra_info``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels import PlanOptions
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


@pytest.mark.parametrize(
    "method", ["argsort", "balanced", "random", "isf", "length_grouped", "random_padded", "ffd_tokens"]
)
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
        benchmark(
            lambda: plan_packs(
                real, PlanOptions(method="isf", vit_capacity=18, llm_capacity=6016), world_size=WORLD_SIZE
            )
        )
    else:
        benchmark.pedantic(lambda: isf_reference(real.vit, real.llm, items, 18, 6016, 18, 5888, 50, 0), rounds=1)


_CHOICE_ROW = ("num_packs", "vit_fill", "llm_fill", "vit_dist", "llm_dist", "step_efficiency")


@pytest.mark.parametrize("rounds", [1, 4, 8, 16])
def test_best_fit_rounds(benchmark, monkeypatch, rounds: int) -> None:
    """``balance.engine.BEST_FIT_ROUNDS``: the balanced method on the bundled data at 18 tiles / 6016 tokens."""
    from omnibal_kernels.balance import balance_report, engine, plan_packs

    real = synthetic_lengths("bundled", None, SEED)
    monkeypatch.setattr(engine, "BEST_FIT_ROUNDS", rounds)

    def plan():
        return plan_packs(real, PlanOptions(vit_capacity=18, llm_capacity=6016, seed=SEED), world_size=WORLD_SIZE)

    report = balance_report(plan(), real).to_dict()
    benchmark.group = "choice: best-fit rounds, bundled data at 18 / 6016"
    benchmark.extra_info.update(rounds=rounds, **{k: report[k] for k in _CHOICE_ROW})
    benchmark(plan)


@pytest.mark.parametrize("world_size", [8, 512])
@pytest.mark.parametrize("work", [0, 1024, 4096, 2**62])
def test_refine_work(benchmark, monkeypatch, work: int, world_size: int) -> None:
    """``balance.engine.REFINE_WORK_PER_SAMPLE``: the balanced method on the Qwen2-VL-like patch loads (1.2M
    samples), its epoch cost over the ideal (sum over steps of the costliest pack / (total cost / ranks)) in
    ``extra_info``; 0 turns the exchanges off (the packs sorted by cost), 2**62 leaves them unbounded."""
    from omnibal_kernels.balance import engine, plan_packs
    from omnibal_kernels.bench.quality import qwen2vl_7b_cost

    lengths = synthetic_lengths("patch_multires", 1_200_000, SEED)
    cost = qwen2vl_7b_cost()
    monkeypatch.setattr(engine, "REFINE_WORK_PER_SAMPLE", work)

    def plan():
        return plan_packs(lengths, PlanOptions(cost_model=cost, seed=SEED), world_size=world_size)

    p = plan()
    pack_cost = cost.pack_costs(lengths, p)
    ideal = (cost.sample_costs(lengths).sum() + cost.per_pack * p.num_packs) / world_size
    benchmark.group = f"choice: refinement work per sample, patch loads 1.2M, {world_size} ranks"
    benchmark.extra_info.update(work=work, epoch_over_ideal=float(pack_cost[p.step_packs].max(axis=1).sum() / ideal))
    benchmark(plan)


@pytest.mark.parametrize("world_size", [8, 64])
@pytest.mark.parametrize("data", ["bundled", "patch_multires"])
@pytest.mark.parametrize("sigmas", [2.0, 3.0, 4.0])
def test_headroom_sigmas(benchmark, monkeypatch, sigmas: float, data: str, world_size: int) -> None:
    """``balance.search.HEADROOM_SIGMAS``: searched capacities and the balanced plan under them."""
    from omnibal_kernels.balance import CostModel, balance_report, plan_packs, search
    from omnibal_kernels.bench.quality import TARGET, qwen2vl_7b_cost

    lengths = synthetic_lengths(data, None if data == "bundled" else 20_000, SEED)
    cost = qwen2vl_7b_cost() if data == "patch_multires" else CostModel.internvl_7b()
    monkeypatch.setattr(search, "HEADROOM_SIGMAS", sigmas)

    def plan():
        return plan_packs(
            lengths, PlanOptions(target_batch_size=TARGET, cost_model=cost, seed=SEED), world_size=world_size
        )

    first = plan()
    report = balance_report(first, lengths, cost).to_dict()
    benchmark.group = f"choice: LLM headroom sigmas, {data}, {world_size} ranks"
    benchmark.extra_info.update(
        sigmas=sigmas,
        vit_capacity=first.vit_capacity,
        llm_capacity=first.llm_capacity,
        **{k: report[k] for k in _CHOICE_ROW},
    )
    benchmark(plan)


def main(argv: list[str]) -> int:
    parts = ["targets"] if "targets" in argv else ["quality", "targets", "planning"]
    report = run_suite(parts, quick="--quick" in argv, log=lambda s: print(s, file=sys.stderr))
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
