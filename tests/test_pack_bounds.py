"""Lower bounds on the number of packs (``pack_lower_bounds``): never above the fewest packs any grouping
needs, and above the volume where large samples cannot share a pack."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import Lengths, PlanOptions, plan_packs
from omnibal_kernels.balance import pack_lower_bounds
from omnibal_kernels.balance.bound import costs_epoch_bound, min_packs
from omnibal_kernels.bench.targets import target_misses, target_row
from omnibal_kernels.synthetic import synthetic_lengths


def _fewest_packs(vit: list[int], llm: list[int], vit_capacity: int, llm_capacity: int) -> int:
    """The fewest packs that hold the samples within both capacities (samples over a capacity alone), by
    branch and bound over the samples, largest first."""
    fits = [(v <= vit_capacity or vit_capacity == 0) and t <= llm_capacity for v, t in zip(vit, llm)]
    singles = fits.count(False)
    items = sorted(((v, t) for v, t, ok in zip(vit, llm, fits) if ok), reverse=True)
    best = [len(items)]

    def place(i: int, packs: list[list[int]]) -> None:
        if len(packs) >= best[0]:
            return
        if i == len(items):
            best[0] = len(packs)
            return
        v, t = items[i]
        for pack in packs:
            if (vit_capacity == 0 or pack[0] + v <= vit_capacity) and pack[1] + t <= llm_capacity:
                pack[0] += v
                pack[1] += t
                place(i + 1, packs)
                pack[0] -= v
                pack[1] -= t
        packs.append([v, t])
        place(i + 1, packs)
        packs.pop()

    place(0, [])
    return max(best[0] + singles, 1)


@settings(max_examples=300, deadline=None)
@given(
    loads=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=8),
    vit_capacity=st.integers(0, 24),
    llm_capacity=st.integers(1, 24),
)
def test_bounds_are_never_above_the_fewest_packs(loads, vit_capacity, llm_capacity):
    vit, llm = [v for v, _ in loads], [t for _, t in loads]
    lengths = Lengths(np.array(vit, np.int64), np.array(llm, np.int64))
    bounds = pack_lower_bounds(lengths, vit_capacity, llm_capacity)
    fewest = _fewest_packs(vit, llm, vit_capacity, llm_capacity)
    assert 1 <= bounds.volume <= bounds.tight <= fewest
    # no two samples over half a capacity (and within it) share a pack
    for load, capacity in ((lengths.llm, llm_capacity), (lengths.vit, vit_capacity)):
        if capacity > 0:
            assert bounds.tight >= np.count_nonzero((2 * load > capacity) & (load <= capacity))


@pytest.mark.parametrize("tiles", [[11, 12, 13], [11, 12, 13, 9]])
def test_pages_that_cannot_share_a_pack_each_count_one(tiles):
    # pages of 11 to 13 tiles under 20: their volume says about half a pack each, and each needs its own; a
    # page of 9 tiles fits only beside one of 11
    vit = np.array(tiles * 50, np.int64)
    bounds = pack_lower_bounds(Lengths(vit, np.full(vit.size, 10, np.int64)), 20, 10_000)
    assert bounds.volume == int(np.ceil(vit.sum() / 20))
    assert bounds.tight == 150 > bounds.volume


def _pages_of_12_and_9() -> Lengths:
    # 50 pages of 12 tiles and 100 of 9 under 20 tiles: no page of 9 fits beside one of 12, so the 9s need 45
    # packs more than the 12s' 50 (the fewest is 100); the volume says 75, the pages over half 50
    vit = np.array([12] * 50 + [9] * 100, np.int64)
    return Lengths(vit, np.full(vit.size, 10, np.int64))


def test_smaller_samples_count_only_the_room_they_fit():
    assert pack_lower_bounds(_pages_of_12_and_9(), 20, 10_000) == (75, 95)


@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")
def test_a_plan_has_no_fewer_packs_than_the_tight_bound():
    # pages of 7 to 13 tiles under a 20-tile capacity beside short chats and long code
    lengths = synthetic_lengths("clustered_mix", 5_000, seed=0)
    plan = plan_packs(lengths, PlanOptions(target_batch_size=4.0, seed=0), world_size=8)
    bounds = pack_lower_bounds(lengths, plan.vit_capacity, plan.llm_capacity)
    assert bounds.volume < bounds.tight <= plan.num_packs <= 1.03 * bounds.tight


def test_samples_over_a_capacity_count_one_pack_each():
    lengths = Lengths(np.array([0, 0, 0], np.int64), np.array([50, 5, 5], np.int64))
    assert pack_lower_bounds(lengths, 0, 10) == (2, 2)


def test_bad_capacities_are_refused():
    lengths = Lengths(np.array([1], np.int64), np.array([1], np.int64))
    with pytest.raises(ValueError, match="llm_capacity"):
        pack_lower_bounds(lengths, 1, 0)
    with pytest.raises(ValueError, match="vit_capacity"):
        pack_lower_bounds(lengths, -1, 1)
    with pytest.raises(TypeError, match="llm_capacity"):
        pack_lower_bounds(lengths, 1, 2.5)


def test_token_counts_alone_are_text():
    # as plan_packs takes them: a 1-D array of token counts, or a (vit, llm) tuple
    tokens = np.array([600, 600, 300, 300], np.int64)
    assert pack_lower_bounds(tokens, 0, 1_000) == pack_lower_bounds((np.zeros(4, np.int64), tokens), 0, 1_000)
    assert pack_lower_bounds(tokens, 0, 1_000) == (2, 2)


@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")
def test_the_balance_targets_hold_packs_to_the_tight_bound():
    row = target_row("clustered_mix", synthetic_lengths("clustered_mix", 5_000, seed=0), 8)
    # the volume bound is out of reach here; the packs are within 3% of what no plan can go below
    assert row["packs_over_volume"] > 1.03 >= row["packs_over_tight"] >= 1.0
    assert target_misses(row) == []
    assert target_misses({**row, "packs_over_tight": 1.04}) == [
        f"packs 1.040x the tight bound ({row['packs_over_volume']:.3f}x the volume bound)"
    ]


def test_the_epoch_bound_counts_the_packs_such_samples_need():
    # at one rank with only a per-pack cost, a plan's epoch is its number of packs: the bound is the tight
    # count, not the volume
    lengths = _pages_of_12_and_9()
    bound = costs_epoch_bound(
        np.zeros(len(lengths)),
        lengths.vit,
        lengths.llm,
        vit_capacity=20,
        llm_capacity=10_000,
        world_size=1,
        per_pack=1.0,
    )
    assert bound == min_packs(lengths.vit, lengths.llm, 20, 10_000) == 95
