"""Partition search, recompute plans and the schedule simulator against brute force and hand-made schedules."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.pipeline import (
    LayerProfile,
    ModelProfile,
    evaluate_partition,
    held_micro_batches,
    min_cost_cover,
    partition,
    simulate,
    uniform_stages,
)

LINK = 25.0  # GB/s


def _profile(rng: np.random.Generator, n: int) -> ModelProfile:
    layers = []
    for i in range(n):
        f = float(rng.uniform(0.5, 3.0))
        layers.append(LayerProfile(f"l{i}", f, f * float(rng.uniform(1.5, 2.5)), int(rng.integers(1, 100)) * 10**6,
                                   int(rng.integers(0, 50)) * 10**6, int(rng.integers(1, 30)) * 10**6))
    return ModelProfile(tuple(layers), input_bytes=int(rng.integers(1, 30)) * 10**6)


def _brute_stage(prof: ModelProfile, a: int, b: int, k: int, budget):
    """(recompute ms, chosen) by trying every subset of the stage's layers."""
    act, inp, fwd, static = prof.activation_bytes, prof.input_bytes_per_layer, prof.forward_ms, prof.static_bytes
    best = None
    idx = range(a, b + 1)
    for r in range(len(idx) + 1):
        for chosen in itertools.combinations(idx, r):
            kept = sum(inp[j] if j in chosen else act[j] for j in idx)
            if budget is not None and static[a:b + 1].sum() + k * kept > budget:
                continue
            cost = sum(fwd[j] for j in chosen)
            if best is None or cost < best[0]:
                best = (cost, chosen)
    return best


def _brute_partition(prof: ModelProfile, P: int, m: int, budget, fixed=None, schedule="1f1b"):
    L = len(prof)
    send = prof.output_bytes / (LINK * 1e9) * 1e3
    best = None
    for cuts in itertools.combinations(range(1, L), P - 1):
        starts = (0,) + cuts
        if fixed and any(starts[s] != first for s, first in fixed.items()):
            continue
        stages = list(zip(starts, [c - 1 for c in cuts] + [L - 1]))
        times = []
        for s, (a, b) in enumerate(stages):
            found = _brute_stage(prof, a, b, min(P - s, m) if schedule == "1f1b" else m, budget)
            if found is None:
                break
            comm = (send[b] if b < L - 1 else 0.0) + (send[a - 1] if a > 0 else 0.0)
            times.append(prof.forward_ms[a:b + 1].sum() + prof.backward_ms[a:b + 1].sum() + found[0] + comm)
        else:
            key = (max(times), sum(times))
            if best is None or key[0] < best[0] * (1 - 1e-12) or (
                    math.isclose(key[0], best[0], rel_tol=1e-12) and key[1] < best[1]):
                best = key
    return best


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 8), P=st.integers(1, 4), m=st.integers(1, 6),
       tight=st.sampled_from([None, 0.9, 0.6, 0.4]), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_exact_search_matches_brute_force(seed, n, P, m, tight, schedule):
    P = min(P, n)
    prof = _profile(np.random.default_rng(seed), n)
    budget = None
    if tight is not None:
        free = partition(prof, P, micro_batches=m, link_gb_per_s=LINK, schedule=schedule)
        budget = max(free.peak_bytes) * tight
    brute = _brute_partition(prof, P, m, budget, schedule=schedule)
    if brute is None:
        with pytest.raises(ValueError):
            partition(prof, P, micro_batches=m, memory_bytes=budget, link_gb_per_s=LINK, schedule=schedule)
        return
    plan = partition(prof, P, micro_batches=m, memory_bytes=budget, link_gb_per_s=LINK, schedule=schedule)
    assert plan.bottleneck_ms == pytest.approx(brute[0], rel=1e-9)
    assert sum(plan.stage_ms) == pytest.approx(brute[1], rel=1e-9)
    # contiguous, covering, within budget
    assert plan.stages[0][0] == 0 and plan.stages[-1][1] == n - 1
    assert all(b2 == a1 - 1 for (_, b2), (a1, _) in zip(plan.stages, plan.stages[1:]))
    assert plan.fits
    if budget is not None:
        assert max(plan.peak_bytes) <= budget * (1 + 1e-12)
    for (a, b), rec in zip(plan.stages, plan.recompute):
        assert all(a <= j <= b for j in rec)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(4, 8), m=st.integers(1, 5))
def test_fixed_starts_are_kept_and_optimal_among_partitions_keeping_them(seed, n, m):
    prof = _profile(np.random.default_rng(seed), n)
    fixed = {1: 2}
    plan = partition(prof, 3, micro_batches=m, fixed_starts=fixed, link_gb_per_s=LINK)
    assert plan.stages[1][0] == 2
    assert plan.bottleneck_ms == pytest.approx(_brute_partition(prof, 3, m, None, fixed)[0], rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(-5, 40), min_size=0, max_size=9), data=st.data())
def test_min_cost_cover_matches_brute_force(weights, data):
    costs = data.draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=len(weights), max_size=len(weights)))
    need = data.draw(st.integers(-3, 120))
    best = None
    for r in range(len(weights) + 1):
        for chosen in itertools.combinations(range(len(weights)), r):
            if sum(weights[j] for j in chosen) >= need:
                c = sum(costs[j] for j in chosen)
                best = c if best is None else min(best, c)
    found = min_cost_cover(weights, costs, need)
    if best is None:
        assert found is None
    else:
        cost, chosen = found
        assert cost == pytest.approx(best, abs=1e-9)
        assert sum(weights[j] for j in chosen) >= need
        assert sum(costs[j] for j in chosen) == pytest.approx(cost, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), P=st.integers(1, 5), frac=st.floats(0.2, 1.0))
def test_recompute_plan_never_exceeds_the_budget(seed, P, frac):
    rng = np.random.default_rng(seed)
    prof = _profile(rng, 12)
    free = partition(prof, P, micro_batches=8)
    budgets = [max(free.peak_bytes) * frac * float(rng.uniform(0.8, 1.2)) for _ in range(P)]
    for method in ("exact", "paper"):
        try:
            plan = partition(prof, P, micro_batches=8, memory_bytes=budgets, method=method)
        except ValueError:
            continue
        assert plan.fits
        assert all(p <= b * (1 + 1e-12) for p, b in zip(plan.peak_bytes, budgets))


def test_paper_search_against_the_exact_optimum_on_random_profiles():
    """The paper's search (anchor, radius 2, top 8 by spread, best simulated step) on VLM-like chains.

    The exact search minimizes the bottleneck stage: the paper's bottleneck is never below it, and within 2% of
    it on most chains; the printed line says how often and by how much it misses."""
    rng = np.random.default_rng(7)
    bottleneck_miss, step_miss = [], []
    for _ in range(40):
        nv, nl = int(rng.integers(4, 16)), int(rng.integers(4, 16))
        tv, tl = rng.uniform(1, 4), rng.uniform(1, 4)
        layers = []
        for i in range(nv + nl + 2):
            kind = "vit" if i < nv else "projector" if i == nv else "head" if i == nv + nl + 1 else "llm"
            t = {"vit": tv, "llm": tl, "projector": 0.3, "head": 2 * tl}[kind] * rng.uniform(0.9, 1.1)
            act = {"vit": 3e9, "llm": 2e9, "projector": 5e8, "head": 6e9}[kind] * rng.uniform(0.9, 1.1)
            layers.append(LayerProfile(f"l{i}", t, 2 * t, int(act), int(2e9), int(1e8), kind))
        prof = ModelProfile(tuple(layers), input_bytes=int(1e8))
        P = int(rng.integers(2, 7))
        budget = max(partition(prof, P, micro_batches=4 * P).peak_bytes) * 0.6
        exact = partition(prof, P, micro_batches=4 * P, memory_bytes=budget)
        paper = partition(prof, P, micro_batches=4 * P, memory_bytes=budget, method="paper")
        bottleneck_miss.append(paper.bottleneck_ms / exact.bottleneck_ms - 1)
        step_miss.append(paper.step_ms / exact.step_ms - 1)
    bottleneck_miss, step_miss = np.array(bottleneck_miss), np.array(step_miss)
    print(f"paper vs exact bottleneck: {np.mean(bottleneck_miss > 1e-9):.0%} miss, {np.mean(bottleneck_miss > 0.02):.0%} "
          f"by > 2%, worst {bottleneck_miss.max():.1%}; simulated step: worst {step_miss.max():+.1%}, "
          f"best {step_miss.min():+.1%}")
    assert (bottleneck_miss >= -1e-9).all()
    assert np.mean(bottleneck_miss <= 0.02) >= 0.85
    assert np.median(step_miss) <= 0.02


def test_uniform_split_and_evaluate():
    assert uniform_stages(10, 3) == [(0, 3), (4, 6), (7, 9)]
    prof = _profile(np.random.default_rng(0), 10)
    plan = partition(prof, 3, micro_batches=4, method="uniform")
    assert plan.stages == ((0, 3), (4, 6), (7, 9))
    same = evaluate_partition(prof, plan.stages, micro_batches=4)
    assert same.step_ms == plan.step_ms
    with pytest.raises(ValueError, match="contiguous"):
        evaluate_partition(prof, [(0, 3), (5, 9)], micro_batches=4)


def test_uniform_recompute_is_none_or_all():
    prof = _profile(np.random.default_rng(1), 8)
    free = partition(prof, 2, micro_batches=4, method="uniform", recompute="uniform")
    assert free.recompute == ((), ())
    tight = partition(prof, 2, micro_batches=4, method="uniform", recompute="uniform",
                      memory_bytes=max(free.peak_bytes) * 0.7)
    assert tight.recompute == (tuple(range(0, 4)), tuple(range(4, 8)))


def test_bad_arguments_and_infeasible_layers_raise():
    prof = _profile(np.random.default_rng(2), 5)
    with pytest.raises(ValueError, match="stages"):
        partition(prof, 6, micro_batches=2)
    with pytest.raises(ValueError, match="method"):
        partition(prof, 2, micro_batches=2, method="greedy")
    with pytest.raises(ValueError, match="fixed_starts"):
        partition(prof, 2, micro_batches=2, fixed_starts={1: 0})
    with pytest.raises(ValueError, match="memory_bytes"):
        partition(prof, 2, micro_batches=2, memory_bytes=[1e9])
    big = ModelProfile(prof.layers[:2] + (LayerProfile("huge", 1, 2, 10, 10**12, 10),) + prof.layers[2:])
    with pytest.raises(ValueError, match="layer 2 \\('huge'\\) does not fit"):
        partition(big, 2, micro_batches=2, memory_bytes=10**11)


# ---- schedule simulator ---------------------------------------------------------------------------------


def test_simulator_two_stages_two_micro_batches_by_hand():
    # F = 1, B = 2 per stage. GPipe: s0 F0 [0,1] F1 [1,2]; s1 F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7];
    # s0 B0 [5,7] B1 [7,9].  1F1B: s1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; s0 F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9].
    g = simulate([1, 1], [2, 2], 2, schedule="gpipe")
    assert g.step_ms == 9 and g.held == (2, 2)
    assert sorted(g.ops) == sorted([(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (1, "F", 0, 1, 2), (1, "F", 1, 2, 3),
                                    (1, "B", 0, 3, 5), (1, "B", 1, 5, 7), (0, "B", 0, 5, 7), (0, "B", 1, 7, 9)])
    o = simulate([1, 1], [2, 2], 2, schedule="1f1b")
    assert o.step_ms == 9 and o.held == (2, 1)
    assert sorted(o.ops) == sorted([(1, "F", 0, 1, 2), (1, "B", 0, 2, 4), (1, "F", 1, 4, 5), (1, "B", 1, 5, 7),
                                    (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 4, 6), (0, "B", 1, 7, 9)])
    assert o.bubble == pytest.approx(1 - 12 / 18)


def test_simulator_uniform_stages_closed_form():
    # Equal stages, no communication: (m + P - 1) (F + B) and bubble (P - 1) / (m + P - 1), both schedules.
    for schedule in ("1f1b", "gpipe"):
        r = simulate([1.0] * 4, [2.0] * 4, 8, schedule=schedule)
        assert r.step_ms == pytest.approx(11 * 3)
        assert r.bubble == pytest.approx(3 / 11)
        assert r.held == tuple(held_micro_batches(schedule, 4, 8, s) for s in range(4))


def test_simulator_slow_stage_and_communication_by_hand():
    # s0: F 1, B 2; s1: F 2, B 4; a send takes 0.5 and occupies the sender.
    # One micro-batch: s0 F+send [0, 1.5], s1 F [1.5, 3.5], B+send [3.5, 8], s0 B [8, 10].
    assert simulate([1, 2], [2, 4], 1, comm_ms=[0.5]).step_ms == pytest.approx(10)
    # Three micro-batches, 1F1B. s0: F0 [0,1.5] F1 [1.5,3] B0 [8,10] F2 [10,11.5] B1 [14.5,16.5] B2 [21,23];
    # s1: F0 [1.5,3.5] B0 [3.5,8] F1 [8,10] B1 [10,14.5] F2 [14.5,16.5] B2 [16.5,21].
    r = simulate([1, 2], [2, 4], 3, comm_ms=[0.5])
    assert r.step_ms == pytest.approx(23)
    assert sorted((s, k, i, a, b) for s, k, i, a, b in r.ops if s == 0) == [
        (0, "B", 0, 8, 10), (0, "B", 1, 14.5, 16.5), (0, "B", 2, 21, 23),
        (0, "F", 0, 0, 1.5), (0, "F", 1, 1.5, 3), (0, "F", 2, 10, 11.5)]
    assert r.busy_ms == (3 * 3.5, 3 * 6.5)
    peak = simulate([1, 2], [2, 4], 3, comm_ms=[0.5], activation_bytes=[10, 20], static_bytes=[100, 5])
    assert peak.peak_bytes == (100 + 2 * 10, 5 + 1 * 20)


def test_simulator_rejects_bad_input():
    with pytest.raises(ValueError, match="comm_ms"):
        simulate([1, 1], [1, 1], 2, comm_ms=[1, 2])
    with pytest.raises(ValueError, match="micro_batches"):
        simulate([1], [1], 0)
    with pytest.raises(ValueError, match="schedule"):
        simulate([1], [1], 1, schedule="zb")
    with pytest.raises(ValueError, match="forward_ms"):
        simulate([-1], [1], 1)
