"""The schedule simulator: schedules worked out by hand, torch's orders, an independent simulator, bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_reference import random_times, rank_of, reference_step, torch_order

from omnibal_kernels.pipeline import SCHEDULES, held_micro_batches, schedule_order, simulate, stage_ranks
from omnibal_kernels.pipeline.bounds import Windows, step_lower_bound
from omnibal_kernels.pipeline.schedule import ZERO_BUBBLE

CHUNKS = {"1f1b": (1,), "gpipe": (1,), "interleaved": (1, 2, 3), "interleaved-zb": (1, 2), "zbv": (2,)}


def _valid_m(schedule: str, P: int, m: int) -> bool:
    return not schedule.startswith("interleaved") or m % max(1, m // P) == 0


def test_two_stages_two_micro_batches_by_hand():
    # F = 1, B = 2 per stage. GPipe: s0 F0 [0,1] F1 [1,2]; s1 F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7];
    # s0 B0 [5,7] B1 [7,9].  1F1B: s1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; s0 F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9].
    g = simulate([1, 1], [2, 2], 2, schedule="gpipe", timeline=True)
    assert g.step_ms == 9 and g.held == (2, 2)
    assert sorted(g.ops) == sorted(
        [
            (0, "F", 0, 0, 1),
            (0, "F", 1, 1, 2),
            (1, "F", 0, 1, 2),
            (1, "F", 1, 2, 3),
            (1, "B", 0, 3, 5),
            (1, "B", 1, 5, 7),
            (0, "B", 0, 5, 7),
            (0, "B", 1, 7, 9),
        ]
    )
    o = simulate([1, 1], [2, 2], 2, schedule="1f1b", timeline=True)
    assert o.step_ms == 9 and o.held == (2, 1)
    assert sorted(o.ops) == sorted(
        [
            (1, "F", 0, 1, 2),
            (1, "B", 0, 2, 4),
            (1, "F", 1, 4, 5),
            (1, "B", 1, 5, 7),
            (0, "F", 0, 0, 1),
            (0, "F", 1, 1, 2),
            (0, "B", 0, 4, 6),
            (0, "B", 1, 7, 9),
        ]
    )
    assert o.bubble == pytest.approx(1 - 12 / 18)
    assert simulate([1, 1], [2, 2], 2).ops == ()  # no timeline unless asked


def test_uniform_stages_closed_form():
    # Equal stages, no communication: (m + P - 1) (F + B) and bubble (P - 1) / (m + P - 1), both schedules.
    for schedule in ("1f1b", "gpipe"):
        r = simulate([1.0] * 4, [2.0] * 4, 8, schedule=schedule)
        assert r.step_ms == pytest.approx(11 * 3)
        assert r.bubble == pytest.approx(3 / 11)
        assert r.held == tuple(held_micro_batches(schedule, 4, 8, s) for s in range(4))
    assert [held_micro_batches("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]


def test_slow_stage_and_communication_by_hand():
    # s0: F 1, B 2; s1: F 2, B 4; a send takes 0.5 and occupies the sender.
    # One micro-batch: s0 F+send [0, 1.5], s1 F [1.5, 3.5], B+send [3.5, 8], s0 B [8, 10].
    assert simulate([1, 2], [2, 4], 1, comm_ms=[0.5]).step_ms == pytest.approx(10)
    # Three micro-batches, 1F1B. s0: F0 [0,1.5] F1 [1.5,3] B0 [8,10] F2 [10,11.5] B1 [14.5,16.5] B2 [21,23];
    # s1: F0 [1.5,3.5] B0 [3.5,8] F1 [8,10] B1 [10,14.5] F2 [14.5,16.5] B2 [16.5,21].
    r = simulate([1, 2], [2, 4], 3, comm_ms=[0.5], timeline=True)
    assert r.step_ms == pytest.approx(23)
    assert sorted(op for op in r.ops if op[0] == 0) == [
        (0, "B", 0, 8, 10),
        (0, "B", 1, 14.5, 16.5),
        (0, "B", 2, 21, 23),
        (0, "F", 0, 0, 1.5),
        (0, "F", 1, 1.5, 3),
        (0, "F", 2, 10, 11.5),
    ]
    assert r.busy_ms == (3 * 3.5, 3 * 6.5)
    peak = simulate([1, 2], [2, 4], 3, comm_ms=[0.5], activation_bytes=[10, 20], static_bytes=[100, 5])
    assert peak.peak_bytes == (100 + 2 * 10, 5 + 1 * 20)


def test_interleaved_by_hand():
    # P = 2, v = 2 (rank 0: stages 0 and 2, rank 1: 1 and 3), m = 2, F = 1 and B = 2 everywhere.
    # rank 0: F0.0 [0,1] F0.1 [1,2] F2.0 [2,3] F2.1 [3,4] B2.0 [6,8] B2.1 [9,11] B0.0 [11,13] B0.1 [13,15]
    # rank 1: F1.0 [1,2] F1.1 [2,3] F3.0 [3,4] B3.0 [4,6] F3.1 [6,7] B3.1 [7,9] B1.0 [9,11] B1.1 [11,13]
    r = simulate(
        [1] * 4,
        [2] * 4,
        2,
        schedule="interleaved",
        virtual_stages=2,
        timeline=True,
        activation_bytes=[1, 10, 100, 1000],
    )
    assert r.step_ms == 15 and r.busy_ms == (12, 12) and r.bubble == pytest.approx(0.2)
    assert sorted(r.ops) == sorted(
        [
            (0, "F", 0, 0, 1),
            (0, "F", 1, 1, 2),
            (2, "F", 0, 2, 3),
            (2, "F", 1, 3, 4),
            (2, "B", 0, 6, 8),
            (2, "B", 1, 9, 11),
            (0, "B", 0, 11, 13),
            (0, "B", 1, 13, 15),
            (1, "F", 0, 1, 2),
            (1, "F", 1, 2, 3),
            (3, "F", 0, 3, 4),
            (3, "B", 0, 4, 6),
            (3, "F", 1, 6, 7),
            (3, "B", 1, 7, 9),
            (1, "B", 0, 9, 11),
            (1, "B", 1, 11, 13),
        ]
    )
    assert r.held == (2, 2, 2, 1)
    # rank 0 holds both micro-batches of both its stages after F2.1; rank 1 at most both of stage 1 and one of 3
    assert r.peak_bytes == (2 * 1 + 2 * 100, 2 * 10 + 1000)
    assert stage_ranks("interleaved", 2, 2) == (0, 1, 0, 1)


def test_zero_bubble_by_hand():
    # interleaved-zb, P = 2, v = 1, m = 2: F = 1, backward 2 = input gradient B 1 + weight gradient W 1.
    # rank 0: F0 [0,1] F1 [1,2] B0 [3,4] W0 [4,5] B1 [5,6] W1 [6,7]
    # rank 1: F0 [1,2] B0 [2,3] F1 [3,4] B1 [4,5] W0 [5,6] W1 [6,7]
    r = simulate([1, 1], [2, 2], 2, schedule="interleaved-zb", weight_ms=[1, 1], timeline=True)
    assert r.step_ms == 7 and r.bubble == pytest.approx(1 / 7)
    assert sorted(r.ops) == sorted(
        [
            (0, "F", 0, 0, 1),
            (0, "F", 1, 1, 2),
            (0, "B", 0, 3, 4),
            (0, "W", 0, 4, 5),
            (0, "B", 1, 5, 6),
            (0, "W", 1, 6, 7),
            (1, "F", 0, 1, 2),
            (1, "B", 0, 2, 3),
            (1, "F", 1, 3, 4),
            (1, "B", 1, 4, 5),
            (1, "W", 0, 5, 6),
            (1, "W", 1, 6, 7),
        ]
    )
    assert r.held == (2, 2)  # activations live until the weight gradient
    # ZBV, P = 2 (rank 0: stages 0 and 3, rank 1: 1 and 2), m = 3, F = B = W = 1:
    # rank 0: F0.0-2 [0,3] F3.0 [3,4] B3.0 [4,5] W3.0 [5,6] F3.1 [6,7] B3.1 [7,8] W3.1 [8,9] B0.0 [9,10]
    #         W0.0 [10,11] F3.2 [11,12] B3.2 [12,13] W3.2 [13,14] B0.1 [14,15] W0.1 [15,16] B0.2 [16,17] W0.2
    # rank 1: F1.0 [1,2] F2.0 [2,3] F1.1 [3,4] F2.1 [4,5] B2.0 [5,6] W2.0 [6,7] F1.2 [7,8] B1.0 [8,9] W1.0
    #         [9,10] F2.2 [10,11] B2.1 [11,12] W2.1 [12,13] B1.1 [13,14] B2.2 [14,15] B1.2 [15,16] W1.1 W2.2 W1.2
    z = simulate([1] * 4, [2] * 4, 3, schedule="zbv", virtual_stages=2, weight_ms=[1] * 4, timeline=True)
    assert z.step_ms == 19 and z.busy_ms == (18, 18)
    ends = {(j, k, i): e for j, k, i, _, e in z.ops}
    assert [ends[(0, "B", i)] for i in range(3)] == [10, 15, 17] and ends[(1, "W", 2)] == 19
    assert ends[(3, "F", 1)] == 7 and ends[(2, "B", 2)] == 15
    assert stage_ranks("zbv", 2, 2) == (0, 1, 1, 0)


@pytest.mark.parametrize("schedule", ["interleaved", "interleaved-zb", "zbv"])
def test_orders_are_torchs(schedule):
    for P in range(1, 5):
        for v in CHUNKS[schedule]:
            for m in range(1, 11):
                if _valid_m(schedule, P, m):
                    assert schedule_order(schedule, P, m, v) == torch_order(schedule, P, m, v), (P, v, m)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    schedule=st.sampled_from(SCHEDULES),
    P=st.integers(1, 4),
    m=st.integers(1, 9),
    data=st.data(),
)
def test_against_the_independent_simulator(seed, schedule, P, m, data):
    v = data.draw(st.sampled_from(CHUNKS[schedule]))
    if not _valid_m(schedule, P, m):
        with pytest.raises(ValueError, match="micro_batches"):
            simulate(np.ones(P * v), np.ones(P * v), m, schedule=schedule, virtual_stages=v)
        return
    zb = schedule in ZERO_BUBBLE
    f, b, w, comm = random_times(np.random.default_rng(seed), P * v, zb)
    r = simulate(f, b, m, schedule=schedule, virtual_stages=v, comm_ms=comm, weight_ms=w if zb else None)
    ranks = rank_of(schedule, P, v)
    step, held = reference_step(torch_order(schedule, P, m, v), f, b - w, w, comm, ranks)
    assert r.step_ms == pytest.approx(step, rel=1e-12)
    assert r.held == tuple(held)
    # The bound the exact search prunes with never exceeds the step.
    cross = np.array([ranks[j] != ranks[j + 1] for j in range(P * v - 1)], dtype=float)
    F = f + np.append(comm * cross, 0.0)
    B = b - w + np.insert(comm * cross, 0, 0.0)
    assert step_lower_bound(Windows.of(schedule, P, m, v), F, B, w) <= r.step_ms * (1 + 1e-12)


def test_per_micro_batch_times():
    # A slow second micro-batch on stage 1 delays everything behind it; constant rows equal (S,) input.
    f = np.array([[1.0, 1.0], [1.0, 3.0]])
    b = 2 * f
    r = simulate(f, b, 2, timeline=True)
    ends = {(j, k, i): e for j, k, i, _, e in r.ops}
    # s1: F0 [1,2] B0 [2,4] F1 [4,7] B1 [7,13]; s0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [13,15]
    assert r.step_ms == 15 and ends[(1, "F", 1)] == 7 and ends[(0, "B", 1)] == 15
    same = simulate(np.ones((3, 2)), 2 * np.ones((3, 2)), 3, comm_ms=np.full((3, 1), 0.5))
    assert same == simulate([1, 1], [2, 2], 3, comm_ms=[0.5])
    with pytest.raises(ValueError, match=r"forward_ms must have shape"):
        simulate(np.ones((2, 2)), np.ones(2), 3)


@pytest.mark.slow
def test_a_million_micro_batches_in_closed_form():
    # Uniform stages: (m + P - 1)(F + B), in O(P) memory (the orders are generated, never stored).
    r = simulate(np.ones(16), 2 * np.ones(16), 10**6)
    assert r.step_ms == pytest.approx((10**6 + 15) * 3)
    assert r.held == tuple(16 - s for s in range(16))


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="comm_ms"):
        simulate([1, 1], [1, 1], 2, comm_ms=[1, 2])
    with pytest.raises(ValueError, match="micro_batches"):
        simulate([1], [1], 0)
    with pytest.raises(TypeError, match="micro_batches"):
        simulate([1], [1], 2.0)
    with pytest.raises(ValueError, match="schedule"):
        simulate([1], [1], 1, schedule="zb")
    with pytest.raises(ValueError, match="forward_ms"):
        simulate([-1], [1], 1)
    with pytest.raises(ValueError, match="virtual_stages"):
        simulate([1, 1], [1, 1], 2, virtual_stages=2)
    with pytest.raises(ValueError, match="virtual_stages"):
        simulate([1] * 6, [1] * 6, 2, schedule="zbv", virtual_stages=3)
    with pytest.raises(ValueError, match="3 virtual stages are not 2 chunks"):
        simulate([1] * 3, [1] * 3, 2, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match="weight_ms must not exceed"):
        simulate([1, 1], [1, 1], 2, schedule="interleaved-zb", weight_ms=[2, 0])
    with pytest.raises(ValueError, match="micro_batches: 'interleaved' with 4 ranks needs a multiple of 2"):
        simulate([1] * 8, [1] * 8, 9, schedule="interleaved", virtual_stages=2)
