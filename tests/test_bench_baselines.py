"""The suite's baselines and step-time simulation against slow references and hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import PlanOptions, plan_packs
from omnibal_kernels.balance import CostModel
from omnibal_kernels.bench.baselines import (
    _kk_parts,
    accumulated_step_costs,
    ffd_tokens_plan,
    karmarkar_karp_plan,
    length_grouped_plan,
    over_llm_capacity,
    over_vit_capacity,
    random_padded_plan,
    verl_workload,
)
from omnibal_kernels.bench.ddp import padded_batch
from omnibal_kernels.bench.quality import coverage
from omnibal_kernels.bench.simulate import epoch_time, ideal_time, padding_fraction, rank_costs
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.packing import pack_batch
from omnibal_kernels.testing import causal_lm_loss
from omnibal_kernels.testing.tiny_vlm import TinyVLM, make_sample, scaled_lengths


def _lengths(draw_vit: list[int], draw_llm: list[int]) -> Lengths:
    return Lengths(np.asarray(draw_vit, np.int64), np.asarray(draw_llm, np.int64))


loads = st.integers(1, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 9), min_size=n, max_size=n), st.lists(st.integers(1, 500), min_size=n, max_size=n)
    )
)


def _ffd_reference(llm: np.ndarray, capacity: int) -> list[list[int]]:
    """First-fit decreasing, plainly: samples by decreasing tokens (ties by id), first bin with room."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(llm)), key=lambda i: (-llm[i], i)):
        for b, free in enumerate(room):
            if free >= llm[i]:
                bins[b].append(i)
                room[b] -= int(llm[i])
                break
        else:
            bins.append([i])
            room.append(capacity - int(llm[i]))
    return bins


@settings(max_examples=60, deadline=None)
@given(loads, st.integers(1, 5), st.integers(0, 3))
def test_ffd_matches_reference_and_covers_every_sample(data, world_size: int, seed: int) -> None:
    lengths = _lengths(*data)
    capacity = int(lengths.llm.max()) + 37
    plan = ffd_tokens_plan(lengths, world_size=world_size, llm_capacity=capacity, vit_capacity=4, seed=seed)
    packs = [sorted(plan.pack(p).tolist()) for p in range(plan.num_packs)]
    assert packs == [sorted(b) for b in _ffd_reference(lengths.llm, capacity)]
    assert all(lengths.llm[plan.pack(p)].sum() <= capacity for p in range(plan.num_packs))
    dropped, _ = coverage(plan, len(lengths))
    assert dropped == 0
    # every pack is scheduled; extra slots of a ragged last step reuse packs and are counted
    counts = np.bincount(plan.step_packs.reshape(-1), minlength=plan.num_packs)
    assert counts.min() >= 1 and int((counts - 1).sum()) == plan.duplicated_slots
    same = ffd_tokens_plan(lengths, world_size=world_size, llm_capacity=capacity, vit_capacity=4, seed=seed)
    assert np.array_equal(same.step_packs, plan.step_packs)


def test_ffd_counts_packs_over_the_vit_capacity() -> None:
    lengths = _lengths([5, 5, 0, 0], [10, 10, 10, 10])
    plan = ffd_tokens_plan(lengths, world_size=1, llm_capacity=20, vit_capacity=6, seed=0)
    # first fit puts samples 0+1 (10 tiles, over 6) and 2+3 (0 tiles) together
    assert over_vit_capacity(plan, lengths) == 0.5


def test_ffd_rejects_a_sample_over_the_capacity() -> None:
    with pytest.raises(ValueError, match="sample 1 has 50 tokens"):
        ffd_tokens_plan(_lengths([0, 0], [5, 50]), world_size=1, llm_capacity=20)


def _ldm_reference(costs: list[float], k: int, equal_size: bool) -> list[int]:
    """The largest differencing method, plainly: states of k sets (heaviest first); the state of largest
    spread (then largest set, then lowest id) absorbs the next one, its largest set with the other's smallest."""
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    if equal_size:
        states = [[[i] for i in reversed(order[r * k : (r + 1) * k])] for r in range(len(costs) // k)]
    else:
        states = [[[i]] + [[] for _ in range(k - 1)] for i in order]

    def total(items: list[int]) -> float:
        return sum(costs[i] for i in items) if items else 0.0

    def key(r: int) -> tuple:
        return (-(total(states[r][0]) - total(states[r][-1])), -total(states[r][0]), r)

    alive = list(range(len(states)))
    while len(alive) > 1:
        first, second = sorted(alive, key=key)[:2]
        merged = [a + b for a, b in zip(states[first], reversed(states[second]))]
        states[first] = sorted(merged, key=lambda items: -total(items))  # stable: ties keep their place
        alive.remove(second)
    part = [0] * len(costs)
    for j, items in enumerate(states[alive[0]]):
        for i in items:
            part[i] = j
    return part


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.booleans(), st.data())
def test_karmarkar_karp_matches_the_reference(k: int, per_part: int, equal_size: bool, data) -> None:
    n = k * per_part
    costs = data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))  # small ints: many ties
    out = np.full(n, -1, np.int64)
    _kk_parts(np.asarray(costs, np.float64), k, equal_size, out)
    assert out.tolist() == _ldm_reference([float(c) for c in costs], k, equal_size)
    sums = np.bincount(out, weights=np.asarray(costs, np.float64), minlength=k)
    assert (np.diff(sums) <= 0).all()  # part 0 is the heaviest
    if equal_size:
        assert (np.bincount(out, minlength=k) == per_part).all()
    if k == 2:  # two-way differencing leaves at most the largest item between the parts
        assert sums[0] - sums[1] <= max(costs)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(loads, st.integers(1, 4), st.integers(1, 4), st.integers(0, 3))
def test_karmarkar_karp_plan_covers_and_caps(data, world_size: int, batch: int, seed: int) -> None:
    lengths = _lengths(*data)
    capacity = int(lengths.llm.max()) + 50
    costs = verl_workload(lengths.llm)
    result = karmarkar_karp_plan(
        lengths, world_size=world_size, batch_size=batch, llm_capacity=capacity, vit_capacity=5, seed=seed
    )
    plan, steps = result.plan, result.micro_offsets
    group = world_size * batch
    padded = random_padded_plan(lengths, world_size=world_size, batch_size=batch, seed=seed)
    assert np.array_equal(np.sort(plan.slot_samples()), np.sort(padded.slot_samples()))  # the same samples
    assert (plan.pack_sizes() > 0).all() and plan.step_packs.shape == (int(steps[-1]), world_size)
    order = padded.pack_samples
    for g in range(len(steps) - 1):
        batch_ids = order[g * group : (g + 1) * group]
        rows = plan.step_packs[steps[g] : steps[g + 1]]
        ranks = [np.concatenate([plan.pack(p) for p in rows[:, r]]) for r in range(world_size)]
        assert sorted(np.concatenate(ranks).tolist()) == sorted(batch_ids.tolist())
        assert all(len(r) == batch for r in ranks)  # equal-size parts
        # micro-steps: the most ceil(tokens / cap) of any rank, at most one per sample
        need = max(-(-int(lengths.llm[r].sum()) // capacity) for r in ranks)
        assert rows.shape[0] == min(max(need, 1), batch)
    totals = accumulated_step_costs(result, np.array([costs[plan.pack(p)].sum() for p in range(plan.num_packs)]))
    assert totals.shape == (len(steps) - 1, world_size)
    assert totals.sum() == pytest.approx(costs[plan.slot_samples()].sum())
    again = karmarkar_karp_plan(
        lengths, world_size=world_size, batch_size=batch, llm_capacity=capacity, vit_capacity=5, seed=seed
    )
    assert np.array_equal(again.plan.pack_samples, plan.pack_samples)


def test_karmarkar_karp_plan_balances_cost_and_counts_capacity_misses() -> None:
    # one global batch of 2 ranks x 2 samples: costs 8, 7, 6, 5 -> {8, 5} and {7, 6}, whatever the permutation
    costs = np.array([8.0, 7.0, 6.0, 5.0])
    lengths = _lengths([9, 0, 0, 9], [10, 10, 10, 10])
    result = karmarkar_karp_plan(
        lengths, world_size=2, batch_size=2, llm_capacity=40, vit_capacity=10, costs=costs, seed=3
    )
    plan = result.plan
    assert sorted(sorted(costs[plan.pack(p)].tolist()) for p in range(plan.num_packs)) == [[5.0, 8.0], [6.0, 7.0]]
    assert result.micro_offsets.tolist() == [0, 1]
    assert over_vit_capacity(plan, lengths) == 0.5  # {8, 5} holds 18 ViT units, over 10
    # 50 tokens on the rank of {8, 5}, over a cap of 40: every rank runs 2 micro-steps, heaviest first
    lengths = _lengths([9, 0, 0, 9], [10, 10, 10, 40])
    result = karmarkar_karp_plan(
        lengths, world_size=2, batch_size=2, llm_capacity=40, vit_capacity=10, costs=costs, seed=3
    )
    plan = result.plan
    assert result.micro_offsets.tolist() == [0, 2]
    steps = [sorted(costs[plan.pack(p)].sum() for p in row) for row in plan.step_packs]
    assert steps == [[7.0, 8.0], [5.0, 6.0]]
    pack_costs = np.array([costs[plan.pack(p)].sum() for p in range(plan.num_packs)])
    assert sorted(accumulated_step_costs(result, pack_costs)[0].tolist()) == [13.0, 13.0]
    assert over_vit_capacity(plan, lengths) == 0.0 and over_llm_capacity(plan, lengths) == 0.0
    with pytest.raises(ValueError, match="costs must be"):
        karmarkar_karp_plan(lengths, world_size=2, batch_size=2, llm_capacity=40, costs=-costs)
    with pytest.raises(ValueError, match="llm_capacity"):
        karmarkar_karp_plan(lengths, world_size=2, batch_size=2, llm_capacity=0)
    with pytest.raises(ValueError, match="sample 3 has 40 tokens"):
        karmarkar_karp_plan(lengths, world_size=2, batch_size=2, llm_capacity=39)


def _llava_reference(llm: np.ndarray, order: np.ndarray, world_size: int, batch: int) -> list[list[list[int]]]:
    """LLaVA's split_to_even_chunks per megabatch, in plain Python: longest first, each to the lightest
    micro-batch that still has room."""
    steps = []
    mega = world_size * batch
    for start in range(0, len(order), mega):
        group = sorted(order[start : start + mega].tolist(), key=lambda i: -llm[i])  # stable on ties
        chunks: list[list[int]] = [[] for _ in range(world_size)]
        totals = [0] * world_size
        for i in group:
            c = min((c for c in range(world_size) if len(chunks[c]) < batch), key=lambda c: totals[c])
            chunks[c].append(i)
            totals[c] += int(llm[i])
        steps.append(chunks)
    return steps


@settings(max_examples=60, deadline=None)
@given(loads, st.integers(1, 4), st.integers(1, 4), st.integers(0, 3))
def test_length_grouped_matches_reference(data, world_size: int, batch: int, seed: int) -> None:
    lengths = _lengths(*data)
    plan = length_grouped_plan(lengths, world_size=world_size, batch_size=batch, seed=seed)
    padded = random_padded_plan(lengths, world_size=world_size, batch_size=batch, seed=seed)
    order = padded.pack_samples  # the same padded permutation
    expected = _llava_reference(lengths.llm, order, world_size, batch)
    got = [[plan.pack(p).tolist() for p in step] for step in plan.step_packs]
    # the megabatch holding the longest sample goes first, the others keep their order
    first = max(range(len(expected)), key=lambda s: (max(lengths.llm[i] for c in expected[s] for i in c), -s))
    assert got == [expected[first]] + expected[:first] + expected[first + 1 :]
    n = len(lengths)
    dropped, duplicated = coverage(plan, n)
    assert dropped == 0 and duplicated == (-n) % (world_size * batch)
    assert np.array_equal(np.sort(plan.slot_samples()), np.sort(padded.slot_samples()))


def test_random_padded_plan_cuts_a_seeded_permutation() -> None:
    lengths = _lengths([1] * 10, list(range(1, 11)))
    plan = random_padded_plan(lengths, world_size=2, batch_size=2, seed=5)
    order = plan.pack_samples
    assert sorted(order[:10].tolist()) == list(range(10)) and order[10:].tolist() == order[:2].tolist()
    assert plan.step_packs.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert plan.duplicated_slots == 1  # the last pack holds the two repeats
    assert np.array_equal(random_padded_plan(lengths, world_size=2, batch_size=2, seed=5).pack_samples, order)
    with pytest.raises(ValueError, match="batch_size"):
        random_padded_plan(lengths, world_size=2, batch_size=0)
    with pytest.raises(TypeError, match="lengths"):
        random_padded_plan([1, 2], world_size=1, batch_size=1)


def test_rank_costs_by_hand() -> None:
    cost = CostModel(vit_linear=10.0, vit_quadratic=0.0, llm_linear=1.0, llm_quadratic=0.0)
    lengths = _lengths([1, 0, 2, 0], [4, 2, 8, 6])
    plan = random_padded_plan(lengths, world_size=2, batch_size=2, seed=0)
    packs = [plan.pack(p).tolist() for p in plan.step_packs[0]]
    padded = rank_costs(plan, lengths, cost)
    unpadded = rank_costs(plan, lengths, cost, padded=False)
    for r, pack in enumerate(packs):
        vit = 10.0 * lengths.vit[pack].sum()
        assert unpadded[0, r] == vit + lengths.llm[pack].sum()
        assert padded[0, r] == vit + len(pack) * lengths.llm[pack].max()
    assert epoch_time(padded) == padded.max()
    assert ideal_time(lengths, cost, 2) == (30 + 20) / 2
    positions = sum(len(p) * lengths.llm[p].max() for p in packs)
    assert padding_fraction(plan, lengths) == pytest.approx(1 - 20 / positions)


# small draws plan fewer packs than ranks, which the planner warns of (tests/test_said_not_silent.py)
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.TooFewPacksWarning")
@settings(max_examples=40, deadline=None)
@given(loads, st.integers(1, 4), st.sampled_from(["balanced", "random", "random_padded", "length_grouped"]))
def test_no_method_beats_the_limit(data, world_size: int, method: str) -> None:
    lengths = _lengths(*data)
    cost = CostModel.internvl_7b()
    if method in ("balanced", "random"):
        plan = plan_packs(
            lengths,
            PlanOptions(method=method, vit_capacity=9, llm_capacity=500, cost_model=cost),
            world_size=world_size,
        )
    elif method == "random_padded":
        plan = random_padded_plan(lengths, world_size=world_size, batch_size=2)
    else:
        plan = length_grouped_plan(lengths, world_size=world_size, batch_size=2)
    assert epoch_time(rank_costs(plan, lengths, cost)) >= ideal_time(lengths, cost, world_size) * (1 - 1e-12)


def test_padded_and_packed_batches_train_the_same_function() -> None:
    """The DDP benchmark's two modes differ only in batching: the same model gives the same summed loss on
    a dense padded batch as on the packed batch of the same samples."""
    torch.manual_seed(0)
    lengths = scaled_lengths(3, seed=1)
    samples = [make_sample(lengths, i, seed=1) for i in range(3)]
    model = TinyVLM(hidden=32, vit_hidden=16)
    padded, packed = padded_batch(samples), pack_batch(samples)
    assert int((padded["labels"] != -100).sum()) == int((packed["labels"] != -100).sum())
    a = causal_lm_loss(model(**padded), padded["labels"], reduction="sum")
    b = causal_lm_loss(model(**packed), packed["labels"], reduction="sum")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
