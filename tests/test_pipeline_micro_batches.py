"""Per-micro-batch costs: pack loads through the cost model of each layer kind, and a plan simulated on them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from omnibal_kernels import PlanOptions
from omnibal_kernels.balance import CostModel, plan_packs
from omnibal_kernels.lengths import default_lengths
from omnibal_kernels.pipeline import (
    ModelProfile,
    kind_costs,
    kind_scales,
    micro_batch_times,
    pack_kind_costs,
    packs_from_plan,
    partition,
    profile_from_config,
    simulate,
    simulate_packs,
    stage_times,
)

MODEL = CostModel(vit_linear=2.0, vit_quadratic=0.5, llm_linear=1.0, llm_quadratic=0.01)


def _packs(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 6, 3).astype(float), rng.integers(50, 400, 3).astype(float)) for _ in range(n)]


def _profile(packs):
    return profile_from_config("internvl-300m-7b", packs, static_bytes_per_param=6.0)


def test_times_scale_by_the_cost_of_each_kind():
    packs = _packs(0, 6)
    prof = _profile(packs)
    t = micro_batch_times(prof, packs, cost_model=MODEL)
    kinds = [layer.kind for layer in prof.layers]
    # the profile is the mean micro-batch of these packs
    np.testing.assert_allclose(t.forward_ms.mean(axis=0), prof.forward_ms, rtol=1e-12)
    np.testing.assert_allclose(t.backward_ms.mean(axis=0), prof.backward_ms, rtol=1e-12)
    vit = np.array([v.sum() * 2.0 + (v * v).sum() * 0.5 for v, _ in packs])
    llm = np.array([t_.sum() + 0.01 * (t_ * t_).sum() for _, t_ in packs])
    tokens = np.array([t_.sum() for _, t_ in packs])
    tiles = np.array([v.sum() for v, _ in packs])
    for j, kind in enumerate(kinds):
        expected = {"vit": vit, "llm": llm, "head": tokens, "projector": tiles}[kind]
        np.testing.assert_allclose(t.forward_ms[:, j], prof.forward_ms[j] * expected / expected.mean(), rtol=1e-12)
    # a kind the packs give no cost to keeps the profile's time
    blank = [(np.zeros(3), t_) for _, t_ in packs]
    tb = micro_batch_times(prof, blank, cost_model=MODEL)
    np.testing.assert_allclose(tb.forward_ms[:, kinds.index("vit")], prof.forward_ms[kinds.index("vit")])


def test_fixed_times_stay_and_the_rest_scales():
    packs = _packs(3, 6)
    prof = _profile(packs)
    fixed = ModelProfile(
        tuple(
            replace(layer, fixed_forward_ms=0.3 * layer.forward_ms, fixed_backward_ms=0.1 * layer.backward_ms)
            for layer in prof.layers
        ),
        input_bytes=prof.input_bytes,
    )
    plain, t = micro_batch_times(prof, packs, cost_model=MODEL), micro_batch_times(fixed, packs, cost_model=MODEL)
    # the mean micro-batch keeps the profile's times, every other moves by 70% (forward) / 90% (backward) as far
    np.testing.assert_allclose(t.forward_ms.mean(axis=0), prof.forward_ms, rtol=1e-12)
    np.testing.assert_allclose(t.forward_ms - prof.forward_ms, 0.7 * (plain.forward_ms - prof.forward_ms), atol=1e-9)
    np.testing.assert_allclose(
        t.backward_ms - prof.backward_ms, 0.9 * (plain.backward_ms - prof.backward_ms), atol=1e-9
    )
    # a plan's stage times per micro-batch: the sums of the layers', recomputation included
    budget = 0.7 * max(partition(fixed, 3, micro_batches=6).memory_bytes)
    plan = partition(fixed, 3, micro_batches=6, memory_bytes=budget)
    assert any(plan.recompute)
    offsets = np.cumsum([0] + [v.size for v, _ in packs])
    costs = pack_kind_costs(
        np.concatenate([v for v, _ in packs]), np.concatenate([x for _, x in packs]), offsets, cost_model=MODEL
    )
    scales = kind_scales(costs, costs)
    st = stage_times(plan, fixed, scales)
    for j, (a, b) in enumerate(plan.stages):
        rec = list(plan.recompute[j])
        np.testing.assert_allclose(st.forward_ms[:, j], t.forward_ms[:, a : b + 1].sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(st.recompute_ms[:, j], t.forward_ms[:, rec].sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(
            st.backward_ms[:, j], t.backward_ms[:, a : b + 1].sum(axis=1) + st.recompute_ms[:, j], rtol=1e-12
        )


def test_simulate_packs_runs_the_plan_per_micro_batch():
    packs = _packs(1, 8)
    prof = _profile(packs)
    budget = 0.7 * max(partition(prof, 4, micro_batches=8).memory_bytes)
    plan = partition(prof, 4, micro_batches=8, memory_bytes=budget)
    assert any(plan.recompute)
    same = simulate_packs(plan, prof, [packs[0]] * 8, reference=[packs[0]])
    assert same.step_ms == pytest.approx(plan.step_ms, rel=1e-12)
    # by hand: per micro-batch stage sums of the scaled layer times, recomputation included
    r = simulate_packs(plan, prof, packs)
    t = micro_batch_times(prof, packs)
    fwd = np.stack([t.forward_ms[:, a : b + 1].sum(axis=1) for a, b in plan.stages], axis=1)
    bwd = np.stack(
        [
            t.backward_ms[:, a : b + 1].sum(axis=1) + t.forward_ms[:, list(rec)].sum(axis=1)
            for (a, b), rec in zip(plan.stages, plan.recompute)
        ],
        axis=1,
    )
    assert r.step_ms == pytest.approx(simulate(fwd, bwd, 8, comm_ms=plan.comm_ms).step_ms, rel=1e-12)
    assert r.step_ms != pytest.approx(plan.step_ms, rel=1e-6)


def test_interleaved_plans_and_balanced_packs():
    lengths = default_lengths()
    balanced = plan_packs(lengths, PlanOptions(vit_capacity=16, llm_capacity=5376, seed=0), world_size=1)
    packs = packs_from_plan(balanced, lengths, limit=16)
    prof = _profile(packs)
    plan = partition(prof, 2, micro_batches=16, schedule="interleaved", virtual_stages=2)
    r = simulate_packs(plan, prof, packs)
    assert r.step_ms >= max(r.busy_ms) and len(r.busy_ms) == 2 and len(r.held) == 4


def test_bad_input():
    prof = _profile(_packs(0, 2))
    with pytest.raises(TypeError, match="cost_model"):
        kind_costs("internvl")
    with pytest.raises(ValueError, match=r"packs\[1\]"):
        micro_batch_times(prof, [(np.ones(2), np.ones(2)), (np.ones(2), -np.ones(2))])
    plan = partition(prof, 2, micro_batches=2)
    other = profile_from_config("internvl-6b-20b", _packs(0, 2))
    with pytest.raises(ValueError, match="layers"):
        simulate_packs(plan, other, _packs(0, 2))
