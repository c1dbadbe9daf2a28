"""The balanced method's spill pass (csrc/step_spill.cpp): heavy packs of a step above its mean give samples to
packs with room in other steps, within those steps' costliest packs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import _ext

C = _ext.load()


def _pack_costs(offsets, samples, costs, per_pack=0.0):
    return np.array([costs[samples[offsets[p] : offsets[p + 1]]].sum() + per_pack for p in range(len(offsets) - 1)])


def _pack_sums(offsets, samples, load):
    return np.array([load[samples[offsets[p] : offsets[p + 1]]].sum() for p in range(len(offsets) - 1)])


def _spill(vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack=0.0):
    packs, moved = C.spill_to_room(
        vit, llm, offsets, samples, costs, per_pack, vit_cap, llm_cap, np.asarray(order, np.int64), world_size
    )
    return np.asarray(packs.offsets), np.asarray(packs.samples), moved


def test_a_full_heavy_pack_gives_a_sample_to_a_pack_with_room_in_another_step():
    # quadratic costs, one step of two full packs and one whose packs have room: the heavy pack's small sample
    # moves to the cheaper pack of the other step, which stays below that step's costliest pack
    llm = np.array([90, 10, 85, 15, 60, 40], np.int64)
    vit = np.zeros_like(llm)
    costs = llm.astype(np.float64) ** 2
    offsets = np.array([0, 2, 4, 5, 6], np.int64)
    samples = np.arange(6, dtype=np.int64)
    new_offsets, new_samples, moved = _spill(vit, llm, offsets, samples, costs, 0, 100, [0, 1, 2, 3], 2)
    assert moved == 1
    after = _pack_costs(new_offsets, new_samples, costs)
    assert after[:2].max() == 8100.0 and after[2:].max() == 3600.0
    assert list(new_samples[new_offsets[3] : new_offsets[4]]) == [5, 1]


@st.composite
def _instances(draw):
    n = draw(st.integers(4, 160))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    with_vit = draw(st.booleans())
    llm = rng.integers(1, 2000, n).astype(np.int64)
    vit = rng.integers(0, 7, n).astype(np.int64) if with_vit else np.zeros(n, np.int64)
    a, b = draw(st.floats(0.0, 10.0)), draw(st.floats(0.0, 0.01))
    costs = a * llm + b * llm.astype(np.float64) ** 2 + 3.0 * vit
    world_size = draw(st.integers(2, 6))
    per_pack = draw(st.sampled_from([0.0, 50.0]))
    return vit, llm, costs, (12 if with_vit else 0), 5000, world_size, per_pack, seed, draw(st.booleans())


def _packed_in_steps(instance):
    """An instance's packs (random next fit) and their costs, and a settled order of them: by decreasing cost,
    whole steps only, so the last packs are in no step, and with one pack repeated where drawn; None where not
    one whole step is left."""
    vit, llm, costs, vit_cap, llm_cap, world_size, per_pack, seed, repeat_one = instance
    packs = C.random_next_fit(vit, llm, None, vit_cap, llm_cap, seed)
    offsets, samples = np.asarray(packs.offsets), np.asarray(packs.samples)
    before = _pack_costs(offsets, samples, costs, per_pack)
    order = list(np.lexsort((np.arange(before.size), -before)))
    if repeat_one and order:
        order.insert(0, order[0])
    order = order[: len(order) // world_size * world_size]
    return (offsets, samples, before, order) if order else None


def _check_step_pass(instance, packed, new_offsets, new_samples):
    """What a pass over a settled order keeps: every sample once, both capacities, no step's costliest pack
    risen, no pack above its step's costliest pack before, the packs in no step or in more than one slot as
    they were, no pack emptied. Returns the packs' costs after, the steps (packs per step) and the tolerance."""
    vit, llm, costs, vit_cap, llm_cap, world_size, per_pack, _, _ = instance
    offsets, samples, before, order = packed
    assert new_offsets.size == offsets.size
    assert np.array_equal(np.sort(new_samples), np.arange(len(llm)))
    assert (_pack_sums(new_offsets, new_samples, llm) <= llm_cap).all()
    if vit_cap:
        assert (_pack_sums(new_offsets, new_samples, vit) <= vit_cap).all()
    after = _pack_costs(new_offsets, new_samples, costs, per_pack)
    steps = np.asarray(order).reshape(-1, world_size)
    tolerance = 1e-9 * max(before.max(), 1.0)
    assert (after[steps].max(axis=1) <= before[steps].max(axis=1) + tolerance).all()
    assert (after[steps] <= before[steps].max(axis=1, keepdims=True) + tolerance).all()
    uses = np.bincount(np.asarray(order), minlength=before.size)
    for p in np.flatnonzero(uses != 1):
        assert list(new_samples[new_offsets[p] : new_offsets[p + 1]]) == list(samples[offsets[p] : offsets[p + 1]])
    assert ((np.diff(new_offsets) > 0) | (np.diff(offsets) == 0)).all()
    return after, steps, tolerance


@settings(max_examples=60, deadline=None)
@given(_instances())
def test_spill_keeps_every_sample_once_within_the_capacities_and_raises_no_step(instance):
    packed = _packed_in_steps(instance)
    if packed is None:
        return
    vit, llm, costs, vit_cap, llm_cap, world_size, per_pack, _, _ = instance
    offsets, samples, before, order = packed
    new_offsets, new_samples, moved = _spill(
        vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack
    )
    again = _spill(vit, llm, offsets, samples, costs, vit_cap, llm_cap, order, world_size, per_pack)
    assert np.array_equal(again[0], new_offsets) and np.array_equal(again[1], new_samples) and again[2] == moved
    after, _, tolerance = _check_step_pass(instance, packed, new_offsets, new_samples)
    if moved == 0:
        assert np.allclose(after, before, rtol=0, atol=tolerance)


def test_spill_refuses_bad_input():
    llm = np.array([10, 20], np.int64)
    vit = np.zeros_like(llm)
    costs = llm.astype(np.float64)
    with pytest.raises(ValueError, match="^order: pack 5 out of range"):
        _spill(vit, llm, np.array([0, 1, 2]), np.array([0, 1]), costs, 0, 100, [0, 5], 2)
    with pytest.raises(ValueError, match="^offsets must be non-decreasing"):
        _spill(vit, llm, np.array([0, 3, 2]), np.array([0, 1]), costs, 0, 100, [0, 1], 2)
    with pytest.raises(ValueError, match="^order: its length must be a multiple of world_size"):
        _spill(vit, llm, np.array([0, 1, 2]), np.array([0, 1]), costs, 0, 100, [0], 2)
