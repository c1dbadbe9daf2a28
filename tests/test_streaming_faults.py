"""BalancedPacker and streaming_report under the inputs that used to lose data silently.

Oversize singles of a ragged step, the epoch behind persistent DataLoader workers, one-shot sources, and a
report whose offline plan cannot exist.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from omnibal_kernels.balance import PlanOptions, TooFewPacksError, plan_packs
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.streaming import BalancedPacker, streaming_report


def _loads(sample: dict) -> tuple[int, int]:
    return sample["vit"], sample["llm"]


def _pack_ids(pack: list[dict]) -> list[int]:
    """collate_fn of the DataLoader tests: a pack as its sample ids (module level, so workers can use it)."""
    return [s["id"] for s in pack]


def _mixed_lengths(n: int, seed: int, oversize_share: float = 0.17) -> Lengths:
    """Loads where about ``oversize_share`` of the samples alone exceed the LLM capacity of 4096."""
    rng = np.random.default_rng(seed)
    vit = rng.integers(0, 8, n)
    llm = rng.integers(100, 2000, n)
    big = rng.random(n) < oversize_share
    llm[big] = rng.integers(5000, 9000, int(big.sum()))
    return Lengths(vit, llm)


def _source(lengths: Lengths) -> list[dict]:
    return [{"id": i, "vit": int(v), "llm": int(t)} for i, (v, t) in enumerate(zip(lengths.vit, lengths.llm))]


CAPS = PlanOptions(vit_capacity=16, llm_capacity=4096)


@pytest.mark.parametrize("drop_last", [False, True])
def test_oversize_singles_of_a_ragged_step_are_carried_not_lost(drop_last):
    # 7 ranks and buffers of 64 samples: most buffers end in a ragged step, and oversize singles sit in it
    lengths = _mixed_lengths(1200, 0)
    assert int((lengths.llm > 4096).sum()) > 100
    world = 7
    options = CAPS.replace(oversize="single", drop_last=drop_last, seed=1)
    seen: Counter = Counter()
    for rank in range(world):
        for pack in BalancedPacker(_source(lengths), _loads, options, buffer_size=64, world_size=world, rank=rank):
            seen.update(s["id"] for s in pack)
    report = streaming_report(lengths, options, buffer_size=64, world_size=world).streaming
    missing = set(range(len(lengths))) - set(seen)
    assert len(missing) == report.num_dropped
    assert sum(c - 1 for c in seen.values()) == report.num_duplicated
    if not drop_last:
        assert not missing  # every oversize single reaches a rank
    else:
        # only the final buffer's ragged step may be dropped: fewer than world_size packs
        assert len(missing) < world * 64


def test_oversize_drop_still_reports_what_it_drops():
    lengths = _mixed_lengths(600, 1)
    options = CAPS.replace(oversize="drop", seed=2)
    packers = [
        BalancedPacker(_source(lengths), _loads, options, buffer_size=64, world_size=7, rank=r) for r in range(7)
    ]
    seen = {s["id"] for packer in packers for pack in packer for s in pack}
    oversize = set(np.flatnonzero(lengths.llm > 4096).tolist())
    assert seen == set(range(len(lengths))) - oversize
    assert streaming_report(lengths, options, buffer_size=64, world_size=7).streaming.num_dropped == len(oversize)


def test_persistent_dataloader_workers_follow_set_epoch():
    lengths = _mixed_lengths(240, 2, oversize_share=0.0)
    packer = BalancedPacker(_source(lengths), _loads, CAPS, buffer_size=40, world_size=2, rank=0)
    loader = torch.utils.data.DataLoader(
        packer, batch_size=None, num_workers=2, persistent_workers=True, collate_fn=_pack_ids
    )

    def expected(epoch: int) -> list[tuple[int, ...]]:
        twin = BalancedPacker(_source(lengths), _loads, CAPS, buffer_size=40, world_size=2, rank=0)
        twin.set_epoch(epoch)
        return sorted(tuple(_pack_ids(p)) for w in range(2) for p in twin.iter_shard(w, 2))

    got = {}
    for epoch in (0, 1, 2):
        packer.set_epoch(epoch)
        got[epoch] = sorted(tuple(ids) for ids in loader)
        assert got[epoch] == expected(epoch)
    assert got[0] != got[1] and got[1] != got[2]
    packer.set_epoch(0)  # the same workers go back to epoch 0's packs
    assert sorted(tuple(ids) for ids in loader) == got[0]


def test_epoch_is_kept_in_64_bits():
    packer = BalancedPacker([{"id": 0, "vit": 1, "llm": 1}], _loads, CAPS, world_size=1, rank=0)
    for epoch in (0, 5, 2**63 - 1):
        packer.set_epoch(epoch)
        assert packer.epoch == epoch
    for epoch in (2**63, 2**64):  # epochs are bounded below 2**63 everywhere (a plan's seed mixes 64-bit words)
        with pytest.raises(ValueError, match="epoch must be a non-negative int below 2\\*\\*63"):
            packer.set_epoch(epoch)


@pytest.mark.parametrize(
    "make",
    [
        lambda s: (x for x in s),
        lambda s: iter(s),
        lambda s: map(dict, s),
    ],
    ids=["generator", "list_iterator", "map"],
)
def test_one_shot_iterators_are_rejected(make):
    source = _source(_mixed_lengths(30, 3, 0.0))
    with pytest.raises(TypeError, match="source must be re-iterable .* one-shot iterator"):
        BalancedPacker(make(source), _loads, CAPS, world_size=1, rank=0)


class _ExhaustedAfterOnePass:
    """Iterable whose __iter__ hands out one shared iterator: empty from the second pass on."""

    def __init__(self, items: list[dict]) -> None:
        self._it = iter(items)

    def __iter__(self):
        return self._it


def test_a_source_that_runs_dry_is_detected_next_epoch_and_next_shard():
    source = _source(_mixed_lengths(200, 4, 0.0))
    packer = BalancedPacker(_ExhaustedAfterOnePass(source), _loads, CAPS, buffer_size=50, world_size=1, rank=0)
    assert sum(len(p) for p in packer) == 200
    packer.set_epoch(1)
    with pytest.raises(ValueError, match="source gave 0 samples on this pass but 200 on the first one"):
        list(packer)
    sharded = BalancedPacker(_ExhaustedAfterOnePass(source), _loads, CAPS, buffer_size=50, world_size=1, rank=0)
    first = list(sharded.iter_shard(0, 2))
    assert 0 < sum(len(p) for p in first) < 200
    with pytest.raises(ValueError, match="source gave 0 samples"):
        list(sharded.iter_shard(1, 2))


def test_a_re_iterable_source_passes_the_check_every_epoch():
    lengths = _mixed_lengths(120, 5, 0.0)
    source = _source(lengths)
    packers = [BalancedPacker(source, _loads, CAPS, buffer_size=50, world_size=2, rank=r) for r in range(2)]
    packer = packers[1]
    previous = None
    for epoch in range(3):
        for p in packers:
            p.set_epoch(epoch)
        assert len(list(packer)) > 0
        # each pass reads the whole source again: over both ranks every sample is in a pack, as often as the
        # report of the same stream says, and both ranks take the same number of steps
        packs = [[_pack_ids(pack) for pack in p] for p in packers]
        assert len(packs[0]) == len(packs[1])
        seen = Counter(i for rank in packs for pack in rank for i in pack)
        report = streaming_report(lengths, CAPS, buffer_size=50, world_size=2, epoch=epoch).streaming
        assert report.num_dropped == 0 and set(seen) == set(range(len(source)))
        assert sum(seen.values()) - len(source) == report.num_duplicated
        # and plans the epoch it was set to
        assert packs != previous
        previous = packs


def test_report_gives_the_stream_where_no_offline_plan_exists():
    # 10 small samples fill one pack: no whole step for 4 ranks with drop_last, offline or streamed
    lengths = Lengths(np.ones(10, np.int64), np.full(10, 100))
    with pytest.raises(TooFewPacksError):
        plan_packs(lengths, CAPS.replace(drop_last=True), world_size=4)
    report = streaming_report(lengths, CAPS.replace(drop_last=True), buffer_size=4, world_size=4)
    assert report.offline is None
    assert report.streaming.num_dropped == 10 and report.streaming.num_samples == 0
    # every sample alone oversize, oversize="drop": nothing to plan offline, all dropped in the stream
    big = Lengths(np.full(5, 99), np.full(5, 100))
    report = streaming_report(big, CAPS.replace(oversize="drop"), buffer_size=2, world_size=2)
    assert report.offline is None and report.streaming.num_dropped == 5
    empty = streaming_report(Lengths(np.zeros(0, np.int64), np.zeros(0, np.int64)), CAPS, world_size=2)
    assert empty.offline is None and empty.streaming.num_samples == 0 == empty.streaming.num_dropped
    # where the offline plan exists it is still reported
    ok = streaming_report(_mixed_lengths(300, 6, 0.0), CAPS, buffer_size=100, world_size=2)
    assert ok.offline is not None and ok.offline.num_samples == 300 == ok.streaming.num_samples


def test_report_still_raises_the_streams_own_errors():
    big = Lengths(np.array([1, 99]), np.array([10, 10]))
    with pytest.raises(ValueError, match="alone exceed"):
        streaming_report(big, CAPS, world_size=1)


@pytest.mark.slow
def test_spawned_persistent_workers_follow_set_epoch():
    # spawn (the default start method on macOS, forkserver from Python 3.14 on Linux) pickles the packer into
    # each worker instead of forking it: the shared epoch must survive that too
    lengths = _mixed_lengths(120, 8, oversize_share=0.0)
    packer = BalancedPacker(_source(lengths), _loads, CAPS, buffer_size=30, world_size=1, rank=0)
    loader = torch.utils.data.DataLoader(
        packer,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        collate_fn=_pack_ids,
        multiprocessing_context="spawn",
    )
    epoch0 = sorted(map(tuple, loader))
    packer.set_epoch(1)
    epoch1 = sorted(map(tuple, loader))
    twin = BalancedPacker(_source(lengths), _loads, CAPS, buffer_size=30, world_size=1, rank=0)
    twin.set_epoch(1)
    assert epoch1 == sorted(tuple(_pack_ids(p)) for w in range(2) for p in twin.iter_shard(w, 2))
    assert epoch0 != epoch1
