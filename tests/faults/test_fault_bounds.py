"""Values at the edges: read-only loads (no stale statistics), capacities, epochs and seeds bounded before the
C++ engine, with errors that name the argument."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels.balance import epoch_seed
from omnibal_kernels.balance.options import MAX_CAPACITY


def _text_lengths(n: int = 400, seed: int = 0) -> ok.Lengths:
    return ok.Lengths(np.zeros(n, np.int64), np.random.default_rng(seed).integers(1, 3000, n))


def _max_pack_load(plan: ok.Plan, lengths: ok.Lengths) -> int:
    return max(int(lengths.llm[plan.pack(p)].sum()) for p in range(plan.num_packs))


def test_in_place_edits_after_a_plan_are_refused_and_cannot_overfill_packs():
    lengths = _text_lengths()
    first = ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=4)
    assert _max_pack_load(first, lengths) <= 4096
    for edit in (
        lambda L: L.llm.__iadd__(2000),
        lambda L: L.llm.__setitem__(0, 10**6),
        lambda L: L.vit.fill(3),
        lambda L: L.source.__setitem__(0, 5),
    ):
        with pytest.raises(ValueError, match="read-only"):
            edit(lengths)
    # The loads and the cached statistics are unchanged, so a second plan holds the capacity too.
    second = ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=4)
    assert _max_pack_load(second, lengths) <= 4096
    # New loads are a new Lengths, with their own statistics: the oversize check sees them.
    heavier = ok.Lengths(lengths.vit, lengths.llm + 2000, lengths.source, lengths.sources)
    assert heavier.stats().llm_max == lengths.stats().llm_max + 2000
    with pytest.raises(ok.OversizeError):
        ok.plan_packs(heavier, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=4)


def test_arrays_given_by_the_caller_are_not_shared_writeably():
    vit, llm = np.zeros(5, np.int64), np.arange(1, 6, dtype=np.int64)
    lengths = ok.Lengths(vit, llm)
    assert lengths.stats().llm_max == 5
    llm[:] = 10**6  # the caller edits its own array afterwards
    assert lengths.llm.tolist() == [1, 2, 3, 4, 5] and lengths.stats().llm_max == 5
    assert llm.flags.writeable  # the caller's array is left as it was
    frozen = np.arange(1, 6, dtype=np.int64)
    frozen.flags.writeable = False
    assert ok.Lengths(np.zeros(5, np.int64), frozen).llm is frozen  # read-only input: kept, not copied
    view = llm.view()
    view.flags.writeable = False  # read-only view of a writeable array: still copied
    assert not np.shares_memory(ok.Lengths(vit, view).llm, llm)


def test_loaded_subset_and_concatenated_loads_are_read_only(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(1, 9))
    loaded = ok.load_lengths(tmp_path / "a.npy")
    for lengths in (loaded, loaded[2:5], loaded[np.array([0, 3])], ok.Lengths.concat([loaded, loaded])):
        for arr in (lengths.vit, lengths.llm, lengths.source):
            assert not arr.flags.writeable


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("method", ["balanced", "isf", "random"])
def test_capacities_at_the_bound_plan_exactly(method, drop_last):
    # Loads near 2**31 with capacities at the bound: every sum stays exact in the engine's int64.
    rng = np.random.default_rng(1)
    heavy = ok.Lengths(rng.integers(0, 2**31 - 1, 300), rng.integers(1, 2**31 - 1, 300))
    # Text loads from 1 token with only the LLM capacity binding: the rooms of open packs are within a few
    # tokens of the capacity (at 2**62 they rounded up to it and were bucketed out of range: 10 packs, or a
    # crash, instead of 1).
    light = ok.Lengths(np.zeros(300, np.int64), np.arange(1, 301))
    for lengths, vit_capacity in ((heavy, MAX_CAPACITY), (light, 0)):
        plan = ok.plan_packs(
            lengths,
            ok.PlanOptions(method=method, vit_capacity=vit_capacity, llm_capacity=MAX_CAPACITY, drop_last=drop_last),
            world_size=1,
        )
        assert plan.num_packs == 1 and sorted(plan.pack(0).tolist()) == list(range(300))


@pytest.mark.parametrize("cap", [MAX_CAPACITY + 1, 2**63 - 1, 2**63, 2**64])
@pytest.mark.parametrize("which", ["vit_capacity", "llm_capacity"])
def test_capacities_past_the_bound_are_clear_errors(cap, which):
    caps = {"vit_capacity": 0, "llm_capacity": 4096, which: cap}
    with pytest.raises(ValueError, match=f"{which} must be at most 2\\*\\*48"):
        ok.plan_packs(_text_lengths(), ok.PlanOptions(**caps), world_size=2)


@pytest.mark.parametrize("epoch", [2**63, 2**64, 2**64 + 1, -1])
def test_epochs_outside_int64_are_refused_everywhere(epoch):
    lengths = _text_lengths()
    with pytest.raises(ValueError, match=r"epoch must be a non-negative int below 2\*\*63"):
        ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=2, epoch=epoch)
    with pytest.raises(ValueError, match="epoch"):
        epoch_seed(0, epoch)
    sampler = ok.BalancedBatchSampler(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=2, rank=0)
    with pytest.raises(ValueError, match="epoch"):
        sampler.set_epoch(epoch)


def test_the_largest_epoch_plans_and_differs_from_epoch_zero():
    lengths = _text_lengths()
    last = ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=2, epoch=2**63 - 1)
    zero = ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=4096), world_size=2, epoch=0)
    assert last.fingerprint() != zero.fingerprint()


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 2**80])
def test_seeds_that_would_collide_modulo_2_64_are_refused(seed):
    with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64\)"):
        ok.plan_packs(_text_lengths(), ok.PlanOptions(vit_capacity=0, llm_capacity=4096, seed=seed), world_size=2)


@settings(max_examples=40, deadline=None)
@given(epoch=st.integers(0, 2**63 - 1), seed=st.integers(-(2**63), 2**64 - 1))
def test_epoch_seeds_in_range_are_distinct_per_epoch(epoch, seed):
    # Within the accepted range the mixing is injective in the epoch: the neighbours never share a seed.
    assert epoch_seed(seed, epoch) != epoch_seed(seed, epoch ^ 1)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda v: v.compute_loads([[(448, 448)]], [5], num_image_token=-1), "num_image_token must be >= 0"),
        (lambda v: v.compute_loads([[(448, 448)]], [5], num_image_token=2**63), "num_image_token must be <="),
        (lambda v: v.internvl_target_ratios(1, v.INTERNVL_MAX_TILES + 1), "max_num must be <= 256"),
        (lambda v: v.internvl_num_tiles([448], [448], image_size=2**63), "image_size must be <="),
        (lambda v: v.qwen2vl_grid([448], [448], patch_size=2**63), "patch_size must be <="),
        (lambda v: v.qwen2vl_grid([448], [448], merge_size=v.MAX_IMAGE_SIDE + 1), "merge_size must be <="),
        (lambda v: v.qwen2vl_grid([448], [448], temporal_patch_size=2**64), "temporal_patch_size must be <="),
    ],
)
def test_vision_options_past_their_bounds_are_clear_errors(call, message):
    # Before: a negative token count per tile gave negative loads silently, huge sizes an OverflowError from
    # numpy, and max_num = 2**31 a candidate scan that never finished.
    from omnibal_kernels import vision

    with pytest.raises(ValueError, match=message):
        call(vision)
