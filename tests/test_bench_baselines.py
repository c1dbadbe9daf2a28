"""The suite's baselines and step-time simulation against slow references and hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import plan_packs
from omnibal_kernels.balance import CostModel
from omnibal_kernels.bench.baselines import (
    ffd_tokens_plan,
    length_grouped_plan,
    over_vit_capacity,
    random_padded_plan,
)
from omnibal_kernels.bench.ddp import padded_batch
from omnibal_kernels.testing.tiny_vlm import TinyVLM, make_sample, scaled_lengths
from omnibal_kernels.bench.quality import coverage
from omnibal_kernels.bench.simulate import epoch_time, ideal_time, padding_fraction, rank_costs
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.packing import pack_batch
from omnibal_kernels.testing import causal_lm_loss


def _lengths(draw_vit: list[int], draw_llm: list[int]) -> Lengths:
    return Lengths(np.asarray(draw_vit, np.int64), np.asarray(draw_llm, np.int64))


loads = st.integers(1, 60).flatmap(
    lambda n: st.tuples(st.lists(st.integers(0, 9), min_size=n, max_size=n),
                        st.lists(st.integers(1, 500), min_size=n, max_size=n))
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


def _llava_reference(llm: np.ndarray, order: np.ndarray, world_size: int, batch: int) -> list[list[list[int]]]:
    """LLaVA's split_to_even_chunks per megabatch, in plain Python: longest first, each to the lightest
    micro-batch that still has room."""
    steps = []
    mega = world_size * batch
    for start in range(0, len(order), mega):
        group = sorted(order[start:start + mega].tolist(), key=lambda i: -llm[i])  # stable on ties
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
    assert got == [expected[first]] + expected[:first] + expected[first + 1:]
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


@settings(max_examples=40, deadline=None)
@given(loads, st.integers(1, 4), st.sampled_from(["balanced", "random", "random_padded", "length_grouped"]))
def test_no_method_beats_the_limit(data, world_size: int, method: str) -> None:
    lengths = _lengths(*data)
    cost = CostModel.internvl_7b()
    if method in ("balanced", "random"):
        plan = plan_packs(lengths, world_size=world_size, method=method, vit_capacity=9, llm_capacity=500,
                          cost_model=cost)
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
