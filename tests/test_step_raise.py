"""The balanced method's raise pass (csrc/step_raise.cpp): the cheaper packs of a step left above its mean take a
costlier sample of a balanced step's pack (for none, one or several of their cheapest), up to their step's
costliest pack."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

# the spill pass's test draws the same instances and checks what every pass over a settled order keeps
from test_step_spill import _check_step_pass, _instances, _pack_costs, _packed_in_steps

from omnibal_kernels import _ext

C = _ext.load()


def _raise(vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack=0.0):
    packs, swaps, gave = C.raise_stuck_steps(
        vit, llm, offsets, samples, costs, per_pack, vit_cap, llm_cap, np.asarray(order, np.int64), world_size
    )
    return np.asarray(packs.offsets), np.asarray(packs.samples), swaps, np.asarray(gave, bool)


def test_a_full_pack_beside_a_pinned_one_takes_one_long_sample_for_two_short_ones():
    # quadratic costs, capacity 100, two steps of two packs: step 0 is pinned by a sample of 100 and its other pack
    # holds 60 + 20 + 20; step 1 is balanced. The 20 + 20 go to step 1's pack that gives a 40 (it costs more
    # than 20**2 + 20**2 and fits; the last of the two 40s, by id), which raises step 0's second pack within its
    # costliest and lowers step 1's.
    llm = np.array([100, 60, 20, 20, 40, 30, 30, 40, 30, 30], np.int64)
    vit = np.zeros_like(llm)
    costs = llm.astype(np.float64) ** 2
    offsets = np.array([0, 1, 4, 7, 10], np.int64)
    samples = np.arange(10, dtype=np.int64)
    new_offsets, new_samples, swaps, gave = _raise(vit, llm, offsets, samples, costs, 0, 100, [0, 1, 2, 3], 2)
    assert swaps == 1 and list(gave) == [False, True]
    after = _pack_costs(new_offsets, new_samples, costs)
    assert sorted(new_samples[new_offsets[1] : new_offsets[2]]) == [1, 7]
    assert after[1] == 60**2 + 40**2 and after[0] == 100**2
    assert sorted(after[2:]) == [2 * 20**2 + 2 * 30**2, 40**2 + 2 * 30**2]


def test_a_pack_with_room_beside_a_pinned_one_takes_a_sample_outright():
    # capacity 100: step 0 is pinned by a sample of 100, its other pack holds 50; step 1's packs hold three 30s
    # each. The pack of 50 takes a 30 (the last by id) and has no room for another; the giving pack keeps two.
    llm = np.array([100, 50, 30, 30, 30, 30, 30, 30], np.int64)
    vit = np.zeros_like(llm)
    costs = llm.astype(np.float64) ** 2
    offsets = np.array([0, 1, 2, 5, 8], np.int64)
    samples = np.arange(8, dtype=np.int64)
    new_offsets, new_samples, swaps, gave = _raise(vit, llm, offsets, samples, costs, 0, 100, [0, 1, 2, 3], 2)
    assert swaps == 1 and list(gave) == [False, True]
    assert list(new_samples[new_offsets[1] : new_offsets[2]]) == [1, 7]
    assert list(new_samples[new_offsets[3] : new_offsets[4]]) == [5, 6]


@settings(max_examples=150, deadline=None)
@given(_instances())
def test_raise_keeps_every_sample_once_within_the_capacities_and_raises_no_step(instance):
    packed = _packed_in_steps(instance)
    if packed is None:
        return
    vit, llm, costs, vit_cap, llm_cap, world_size, per_pack, _, _ = instance
    offsets, samples, before, order = packed
    new_offsets, new_samples, swaps, gave = _raise(
        vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack
    )
    again = _raise(vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack)
    assert all(np.array_equal(x, y) for x, y in zip(again, (new_offsets, new_samples, swaps, gave)))
    after, steps, tolerance = _check_step_pass(instance, packed, new_offsets, new_samples)
    # the packs of the steps that gave only come down
    if gave.size:
        assert (after[steps[gave]] <= before[steps[gave]] + tolerance).all()
    if swaps == 0:
        assert np.array_equal(new_samples, samples) and not gave.any()


def test_raise_refuses_bad_input():
    llm = np.array([10, 20], np.int64)
    vit = np.zeros_like(llm)
    costs = llm.astype(np.float64)
    with pytest.raises(ValueError, match="^order: pack 5 out of range"):
        _raise(vit, llm, np.array([0, 1, 2]), np.array([0, 1]), costs, 0, 100, [0, 5], 2)
    with pytest.raises(ValueError, match="^order: its length must be a multiple of world_size"):
        _raise(vit, llm, np.array([0, 1, 2]), np.array([0, 1]), costs, 0, 100, [0], 2)
    with pytest.raises(ValueError, match="one cost part"):
        _raise(vit, llm, np.array([0, 1, 2]), np.array([0, 1]), np.ones((2, 2)), 0, 100, [0, 1], 2)
