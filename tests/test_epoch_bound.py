"""The epoch lower bound (balance.bound): never above an exhaustive optimum of tiny instances nor above a plan
of any method, at least the ideal, exact where every pack holds one sample; and the report's epoch fields."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import Lengths, PlanOptions, plan_packs
from omnibal_kernels.balance import CostModel, balance_report
from omnibal_kernels.balance.bound import costs_epoch_bound, epoch_bound, min_packs
from omnibal_kernels.balance.report import epoch_cost


def _set_partitions(items: list[int]):
    if not items:
        yield []
        return
    for part in _set_partitions(items[1:]):
        for i in range(len(part)):
            yield part[:i] + [[items[0]] + part[i]] + part[i + 1 :]
        yield [[items[0]]] + part


def _best_epochs(c, vit, llm, world_size, vit_capacity, llm_capacity, per_pack) -> dict[int, float]:
    """Packs -> the least epoch of any partition into that many packs within the capacities: its packs sorted by
    cost and cut into runs of world_size (the best steps for given packs)."""
    best: dict[int, float] = {}
    for part in _set_partitions(list(range(len(c)))):
        rows = [np.array(p) for p in part]
        if any(vit[p].sum() > vit_capacity or llm[p].sum() > llm_capacity for p in rows):
            continue
        costs = sorted((c[p].sum() + per_pack for p in rows), reverse=True)
        best[len(rows)] = min(best.get(len(rows), np.inf), sum(costs[::world_size]))
    return best


tiny = st.integers(1, 7).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 5), min_size=n, max_size=n),  # vit
        st.lists(st.integers(1, 19), min_size=n, max_size=n),  # llm
        st.lists(st.floats(0.0, 30.0), min_size=n, max_size=n),  # cost beyond the loads' terms
        st.integers(1, 4),  # world size
        st.integers(0, 5),
        st.integers(0, 24),  # room above the largest sample
        st.sampled_from([0.0, 0.0, 1.5]),  # per pack
        st.sampled_from([0.0, 0.05]),
    )
)  # quadratic token term


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(tiny)
def test_epoch_bound_never_exceeds_the_optimum(case) -> None:
    vit, llm, extra, world_size, room_v, room_t, per_pack, quad = case
    vit, llm = np.array(vit), np.array(llm)
    c = llm + quad * llm**2 + 2.0 * vit + np.array(extra)
    qv, qt = int(max(vit.max(), 1)) + room_v, int(llm.max()) + room_t
    best = _best_epochs(c, vit, llm, world_size, qv, qt, per_pack)
    bound = costs_epoch_bound(c, vit, llm, world_size=world_size, vit_capacity=qv, llm_capacity=qt, per_pack=per_pack)
    ideal = (c.sum() + per_pack * min_packs(vit, llm, qv, qt)) / world_size
    assert ideal * (1 - 1e-12) <= bound <= min(best.values()) * (1 + 1e-9) + 1e-9
    assert bound >= (c.max() + per_pack) * (1 - 1e-12)
    # plans of a given number of steps hold at most steps * world_size packs; a step beyond the runs repeats
    # the cheapest pack
    for steps in range(1, len(c) + 1):
        reachable = [
            e + (steps - -(-p // world_size)) * (per_pack + c.min())
            for p, e in best.items()
            if p <= steps * world_size and -(-p // world_size) <= steps
        ]
        if reachable:
            assert (
                costs_epoch_bound(
                    c,
                    vit,
                    llm,
                    world_size=world_size,
                    vit_capacity=qv,
                    llm_capacity=qt,
                    per_pack=per_pack,
                    num_steps=steps,
                )
                <= min(reachable) * (1 + 1e-9) + 1e-9
            )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=60), st.integers(1, 9), st.integers(1, 4))
def test_epoch_bound_is_exact_when_every_pack_holds_one_sample(costs, world_size, levels) -> None:
    # every sample fills the LLM capacity, so the packs are the samples and the best plan cuts them, sorted
    # by cost, into runs of world_size; costs on a few levels or spread
    c = np.round(np.array(costs) / 1e6 * levels) * 1e6 / levels if levels < 4 else np.array(costs)
    llm = np.full(c.size, 10)
    optimum = np.sort(c)[::-1][::world_size].sum()
    bound = costs_epoch_bound(c, np.zeros(c.size, int), llm, vit_capacity=0, llm_capacity=10, world_size=world_size)
    assert bound == pytest.approx(optimum, rel=1e-6, abs=1e-6)


def test_epoch_bound_when_one_sample_binds() -> None:
    # four samples that each fill a pack, one ten times the others: the best plan is one step of cost 10,
    # the ideal only 13 / 4
    c, llm, vit = np.array([10.0, 1.0, 1.0, 1.0]), np.full(4, 10), np.zeros(4, int)
    assert costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=10, world_size=4) == pytest.approx(10.0)
    # with room for all four in one pack each can still be alone: the best plan stays at 10
    assert costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=40, world_size=4) == pytest.approx(10.0)
    assert costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=10, world_size=1) == pytest.approx(13.0)
    # per_pack: every pack pays it, the best plan is the step 10 + 2
    assert costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=10, world_size=4, per_pack=2.0) == pytest.approx(
        12.0
    )


def test_epoch_bound_is_the_ideal_where_nothing_binds() -> None:
    # 64 equal samples, 4 per pack, 2 ranks: 8 steps of 4 each, the ideal
    c = np.ones(64)
    assert costs_epoch_bound(
        c, np.zeros(64, int), np.full(64, 1), vit_capacity=0, llm_capacity=4, world_size=2
    ) == pytest.approx(32.0)


_instances = st.integers(1, 150).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 12), min_size=n, max_size=n),  # vit
        st.lists(st.integers(1, 4000), min_size=n, max_size=n),  # llm
        st.integers(1, 16),  # world size
        st.sampled_from(["balanced", "isf", "random"]),
        st.tuples(*(st.sampled_from([0.0, 0.5, 1.0]) for _ in range(6))),  # which cost terms
        st.booleans(),  # capacities below the largest sample
        st.integers(0, 3),
    )
)  # seed


# small draws plan fewer packs than ranks, which the planner warns of (tests/test_said_not_silent.py)
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.TooFewPacksWarning")
@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(_instances)
def test_epoch_bound_never_exceeds_a_plan(case) -> None:
    vit, llm, world_size, method, weights, tight, seed = case
    lengths = Lengths(np.array(vit, np.int64), np.array(llm, np.int64))
    model = CostModel(
        vit_linear=3.0 * weights[0],
        vit_quadratic=0.2 * weights[1],
        llm_linear=1.0 * weights[2],
        llm_quadratic=1e-3 * weights[3],
        per_sample=5.0 * weights[4],
        per_pack=50.0 * weights[5],
    )
    qv = max(int(lengths.vit.max()) // (2 if tight else 1), 1) if lengths.vit.any() else 0
    qt = max(int(lengths.llm.max()) // (2 if tight else 1), 1)
    plan = plan_packs(
        lengths,
        PlanOptions(
            method=method, vit_capacity=qv if qv else 0, llm_capacity=qt, oversize="single", seed=seed, cost_model=model
        ),
        world_size=world_size,
    )
    achieved = epoch_cost(plan, lengths, model)
    for steps in (None, plan.num_steps):
        bound = epoch_bound(
            lengths,
            model,
            vit_capacity=plan.vit_capacity,
            llm_capacity=plan.llm_capacity,
            world_size=world_size,
            num_steps=steps,
        )
        assert bound <= achieved * (1 + 1e-9) + 1e-9
    report = balance_report(plan, lengths, model)
    assert report.epoch_cost == pytest.approx(achieved)
    assert report.epoch_ideal * (1 - 1e-12) <= report.epoch_bound <= report.epoch_cost * (1 + 1e-9) + 1e-9
    assert (
        report.epoch_over_bound == pytest.approx(report.epoch_cost / report.epoch_bound)
        if report.epoch_bound
        else report.epoch_over_bound == 1.0
    )


def test_epoch_bound_binds_on_long_text_at_many_ranks() -> None:
    # a few long samples, each alone in a pack, and many short ones over 64 ranks: the steps that hold the
    # long samples cost at least one long sample each, which the ideal does not see
    rng = np.random.default_rng(0)
    llm = np.concatenate([np.full(6, 32_768), rng.integers(100, 2_000, 2_000)])
    lengths = Lengths(np.zeros(llm.size, np.int64), llm)
    model = CostModel(llm_linear=1.0, llm_quadratic=1e-3)
    bound = epoch_bound(lengths, model, vit_capacity=0, llm_capacity=32_768, world_size=64)
    ideal = model.sample_costs(lengths).sum() / 64
    assert bound > 1.5 * ideal
    assert bound >= model.sample_costs(lengths).max()


def test_epoch_bound_checks_its_arguments() -> None:
    c, vit, llm = np.ones(3), np.zeros(3, int), np.ones(3, int)
    with pytest.raises(ValueError, match="world_size"):
        costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=2, world_size=0)
    with pytest.raises(TypeError, match="llm_capacity"):
        costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=2.5, world_size=1)
    with pytest.raises(ValueError, match="costs"):
        costs_epoch_bound(-c, vit, llm, vit_capacity=0, llm_capacity=2, world_size=1)
    with pytest.raises(ValueError, match="shapes"):
        costs_epoch_bound(c[:2], vit, llm, vit_capacity=0, llm_capacity=2, world_size=1)
    with pytest.raises(ValueError, match="num_steps: 1 steps of 1 packs cannot hold"):
        costs_epoch_bound(c, vit, llm, vit_capacity=0, llm_capacity=1, world_size=1, num_steps=1)
    with pytest.raises(TypeError, match="cost_model"):
        epoch_bound(Lengths(vit, llm), "internvl_7b", vit_capacity=0, llm_capacity=2, world_size=1)
    assert (
        costs_epoch_bound(np.zeros(0), np.zeros(0, int), np.zeros(0, int), vit_capacity=0, llm_capacity=2, world_size=4)
        == 0.0
    )
