"""The targets on the real InternVL-Chat SFT loads (70,706 samples, 8 ranks, 4 samples per pack)."""

from __future__ import annotations

import numpy as np
import pytest

from omnibal_kernels import PlanOptions, balance_report, plan_packs, search_capacity
from omnibal_kernels.balance import CostModel
from omnibal_kernels.lengths import default_lengths


@pytest.fixture(scope="module")
def lengths():
    return default_lengths()


def test_isf_reproduces_the_authors_numbers(lengths):
    # The authors' ISF code: ave_bs 4.55, vit_dist 0.0001, llm_dist 0.070 at Qv 18, Qt 6016, threshold 5888.
    plan = plan_packs(lengths, PlanOptions(method="isf", vit_capacity=18, llm_capacity=6016), world_size=8)
    assert plan.llm_threshold == 5888
    report = balance_report(plan, lengths)
    assert report.vit_dist < 0.01
    assert abs(report.llm_dist - 0.070) < 0.03
    assert abs(report.ave_bs - 4.55) < 0.05


def test_isf_capacity_search_finds_the_authors_capacities(lengths):
    caps = search_capacity(
        lengths,
        PlanOptions(
            target_batch_size=4,
            method="isf",
        ),
        world_size=8,
    )
    assert (caps.vit_capacity, caps.llm_capacity, caps.llm_threshold) == (18, 6016, 5888)


@pytest.mark.parametrize("capacities", [None, (18, 6016)])
def test_balanced_meets_the_targets_and_beats_isf(lengths, capacities):
    options = PlanOptions(target_batch_size=4)
    if capacities:
        options = options.replace(vit_capacity=capacities[0], llm_capacity=capacities[1])
    plan = plan_packs(lengths, options, world_size=8)
    report = balance_report(plan, lengths)
    assert 4 <= report.ave_bs <= 5
    assert report.vit_dist <= 0.002
    assert report.step_efficiency >= 0.999
    assert max(report.vit_fill, report.llm_fill) >= 0.98
    assert report.num_dropped == 0 and report.num_duplicated < 8 * 6  # only the ragged tail
    isf = balance_report(
        plan_packs(
            lengths,
            PlanOptions(method="isf", vit_capacity=plan.vit_capacity, llm_capacity=plan.llm_capacity),
            world_size=8,
        ),
        lengths,
    )
    assert report.llm_dist < isf.llm_dist / 10 and report.step_efficiency > isf.step_efficiency
    assert report.num_packs <= isf.num_packs * 1.002  # balance costs no packs


def test_epochs_draw_new_packs_and_no_load_trend(lengths):
    cost = CostModel.internvl_7b().sample_costs(lengths.vit, lengths.llm)
    previous = None
    for epoch in range(4):
        plan = plan_packs(lengths, PlanOptions(seed=0), world_size=8, epoch=epoch)
        packs = {tuple(sorted(plan.pack(p).tolist())) for p in range(plan.num_packs)}
        if previous is not None:
            assert len(packs & previous) < 0.10 * len(packs)
        previous = packs
        pack_cost = np.add.reduceat(cost[plan.pack_samples], plan.pack_offsets[:-1])
        pack_llm = np.add.reduceat(lengths.llm[plan.pack_samples], plan.pack_offsets[:-1])
        steps = np.arange(plan.num_steps)
        for per_pack in (pack_cost, pack_llm):
            step_load = per_pack[plan.step_packs].sum(axis=1)
            assert abs(np.corrcoef(steps, step_load)[0, 1]) < 0.05


def test_ranks_do_not_always_get_the_heavier_pack(lengths):
    plan = plan_packs(lengths, world_size=8)
    pack_llm = np.add.reduceat(lengths.llm[plan.pack_samples], plan.pack_offsets[:-1])
    step_llm = pack_llm[plan.step_packs]
    unique_max = (step_llm == step_llm.max(axis=1, keepdims=True)).sum(axis=1) == 1
    heaviest = step_llm[unique_max].argmax(axis=1)
    share = np.bincount(heaviest, minlength=8) / heaviest.size
    assert heaviest.size > 100 and share.max() < 0.2
