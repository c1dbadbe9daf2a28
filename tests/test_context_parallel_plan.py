"""Plans for context-parallel groups: capacities per group, the data-parallel world, every CP rank's time.

The report prices each slot's pack as the collator shards it: its times are those of the shards
``PackCollator(context_parallel_size=C)`` builds for the same samples, slot by slot.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import omnibal_kernels as ok
from omnibal_kernels.context_parallel import ContextParallelOptions, shard_for_context_parallel

LLM_CAPACITY = 16384


def _lengths(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(20, 400, n - n // 10), rng.integers(2000, 12000, n // 10)])


def test_a_cp_plan_is_the_plan_of_its_groups(tmp_path):
    lengths = _lengths()
    plain = ok.plan_packs(lengths, ok.PlanOptions(llm_capacity=LLM_CAPACITY, vit_capacity=0), world_size=4)
    plan = ok.plan_packs(
        lengths,
        ok.PlanOptions(llm_capacity=LLM_CAPACITY, vit_capacity=0, context_parallel=ok.ContextParallelOptions(size=4)),
        world_size=4,
    )
    assert plan.context_parallel.size == 4 and plain.context_parallel.size == 1
    assert plan.fingerprint() == plain.fingerprint()  # capacities per group: the packs of the groups
    loaded = ok.Plan.load(plan.save(tmp_path / "plan"))
    assert loaded.context_parallel == plan.context_parallel and loaded.fingerprint() == plan.fingerprint()
    assert "context_parallel_size=4" in repr(plan) and len(repr(plan).splitlines()) == 1


@pytest.mark.parametrize("strategy", ["auto", "zigzag", "hybrid"])
def test_the_report_prices_each_pack_as_the_collator_shards_it(strategy):
    lengths = _lengths(120, seed=1)
    cp = 3
    plan = ok.plan_packs(
        lengths,
        ok.PlanOptions(
            llm_capacity=LLM_CAPACITY, vit_capacity=0, seed=5, context_parallel=ok.ContextParallelOptions(size=cp)
        ),
        world_size=2,
    )
    report = ok.context_parallel.context_parallel_report(
        plan, lengths, plan.context_parallel.replace(strategy=strategy)
    )
    assert report.times.shape == (plan.num_steps, 2, cp) and report.options.size == cp
    g = torch.Generator().manual_seed(0)
    for step in (0, plan.num_steps // 2, plan.num_steps - 1):
        for rank in range(2):
            samples = [
                {"input_ids": torch.randint(1, 100, (int(lengths[i]),), generator=g)}
                for i in plan.pack(int(plan.step_packs[step, rank]))
            ]
            shards = shard_for_context_parallel(
                ok.pack_batch(samples), ContextParallelOptions(size=cp, strategy=strategy)
            )
            np.testing.assert_array_equal(report.times[step, rank], shards.times.times)
            np.testing.assert_array_equal(report.tokens[step, rank], shards.times.tokens)
            assert report.kv_exchanged[step, rank] == shards.times.kv_exchanged
            assert report.strategies[step, rank] == shards.strategy
    summary = report.to_dict()
    assert 1.0 <= summary["mean_group_imbalance"] <= summary["worst_group_imbalance"]
    assert report.step_times.shape == (plan.num_steps,)
    assert np.all(report.step_times >= report.times.max(axis=2).max(axis=1) - 1e-9)
    assert 0 < report.step_efficiency <= 1


def test_contiguous_sharding_is_reported_imbalanced():
    """The report shows the imbalance of a strategy that does not balance (none hidden in the pack totals)."""
    lengths = _lengths(200, seed=2)
    plan = ok.plan_packs(
        lengths,
        ok.PlanOptions(llm_capacity=LLM_CAPACITY, vit_capacity=0, context_parallel=ok.ContextParallelOptions(size=4)),
        world_size=2,
    )
    priced = {
        s: ok.context_parallel.context_parallel_report(plan, lengths, plan.context_parallel.replace(strategy=s))
        for s in ("contiguous", "hybrid")
    }
    contiguous, hybrid = (priced[s].to_dict() for s in ("contiguous", "hybrid"))
    assert hybrid["worst_group_imbalance"] < 1.05 < contiguous["worst_group_imbalance"]


def test_the_samplers_report_covers_its_micro_steps():
    lengths = _lengths(240, seed=3)
    sampler = ok.BalancedBatchSampler(
        lengths,
        ok.PlanOptions(
            llm_capacity=LLM_CAPACITY,
            vit_capacity=0,
            drop_last=True,
            context_parallel=ok.ContextParallelOptions(size=2, strategy="hybrid"),
        ),
        world_size=8,
        rank=5,
        micro_steps_per_step=2,
    )
    report = sampler.report(progress=False).context_parallel
    assert report.times.shape == (len(sampler), 4, 2)
    # rank 5 is CP rank 1 of data-parallel rank 2: its column of the report, micro-step by micro-step
    for i, ids in enumerate(sampler.rank_batches(2)):
        times = ok.context_parallel.context_parallel_rank_times(
            lengths[np.asarray(ids)], ok.ContextParallelOptions(size=2, strategy="hybrid")
        )
        np.testing.assert_array_equal(report.times[i, 2], times.times)
    with pytest.warns(UserWarning, match=r"sampler.wrap\(dataset\)"):  # a CP sampler's batches outside wrap()
        assert [list(b) for b in sampler] == [list(b) for b in sampler.rank_batches(2)]


def test_report_arguments_are_checked():
    lengths = _lengths(60)
    plan = ok.plan_packs(
        lengths,
        ok.PlanOptions(llm_capacity=LLM_CAPACITY, vit_capacity=0, context_parallel=ok.ContextParallelOptions(size=2)),
        world_size=1,
    )
    with pytest.raises(ValueError, match="lengths has 59"):
        ok.context_parallel.context_parallel_report(plan, lengths[:-1])
    with pytest.raises(TypeError, match="options must be a ContextParallelOptions, got str"):
        ok.context_parallel.context_parallel_report(plan, lengths, "hybrid")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="plan"):
        ok.context_parallel.context_parallel_report(lengths, lengths)
