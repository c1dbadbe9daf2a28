"""A vision-language pack's CP shards: each rank encodes a balanced share of the images, and the routing delivers
every placeholder's embedding row exactly once, from the rank that encoded it (no process group: the
all-to-all is simulated from the shards' counts)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels.context_parallel import ContextParallelCost, ContextParallelOptions
from omnibal_kernels.context_parallel.vision import divide_vision_units, patch_units
from omnibal_kernels.testing.hf_models import IMG, IMG_CONTEXT, VID, config, internvl_sample, qwen_sample

STRATEGIES = ["zigzag", "per_document", "hybrid", "contiguous"]


@functools.cache
def _collators(name: str, size: int, strategy: str = "zigzag") -> list:
    cp = ContextParallelOptions(size=size, strategy=strategy)
    return [
        ok.PackCollator.for_model(config(name), context_parallel=cp, context_parallel_rank=r, warmup=False)
        for r in range(size)
    ]


@functools.cache
def _whole(name: str) -> ok.PackCollator:
    return ok.PackCollator.for_model(config(name), warmup=False)


def _global_rows(units, ids: np.ndarray) -> np.ndarray:
    """Global feature ids (kind * 10**6 + row within the kind) of the units ``ids``' rows, in order."""
    parts = [
        units.kind[u] * 10**6 + np.arange(units.feature_start[u], units.feature_start[u] + units.feature_rows[u])
        for u in ids
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _simulated_exchange(shards: list) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each rank's placeholder rows after the exchange, as global feature ids, and the rank each came from, from
    its shard's routing alone."""
    size = len(shards)
    own = []
    for s in shards:
        vision = s.vision
        ids = vision.units.numpy()
        units = vision.work.units
        own.append(
            _global_rows(units, ids[units.kind[ids] == 0]).tolist()
            + _global_rows(units, ids[units.kind[ids] == 1]).tolist()
        )
        assert len(own[-1]) == vision.encoded_image_rows + vision.encoded_video_rows
        assert vision.send_counts[s.rank] == 0 and vision.recv_counts[s.rank] == 0  # kept rows are not sent
    outboxes = []
    for s in shards:
        sent = [own[s.rank][i] for i in s.vision.send_index.tolist()]
        starts = np.r_[0, np.cumsum(s.vision.send_counts)]
        outboxes.append([sent[starts[d] : starts[d + 1]] for d in range(size)])
    out, origins = [], []
    for s in shards:
        received = [row for src in range(size) for row in outboxes[src][s.rank]]
        origin = [s.rank] * len(own[s.rank]) + [src for src in range(size) for _ in outboxes[src][s.rank]]
        for src in range(size):
            assert len(outboxes[src][s.rank]) == s.vision.recv_counts[src]
        gather = s.vision.gather_index.numpy()
        out.append(np.array(own[s.rank] + received, dtype=np.int64)[gather])
        origins.append(np.array(origin, dtype=np.int64)[gather])
    return out, origins


def _expected_rows(batch_full: dict, shard, image_token: int, video_token: int | None) -> np.ndarray:
    """The global feature ids the shard's placeholders hold in the unsharded pack."""
    ids = batch_full["input_ids"][0].numpy()
    rows = []
    for kind, token in ((0, image_token), (1, video_token)):
        if token is None:
            continue
        where = np.flatnonzero(ids == token)
        held = shard.indices.numpy()
        mine = held[np.isin(held, where)]
        rows.append(kind * 10**6 + np.searchsorted(where, mine))
    return np.concatenate(rows)


def _check_pack(name: str, samples: list, size: int, strategy: str) -> list:
    full = _whole(name)(samples)
    batches = [c(samples) for c in _collators(name, size, strategy)]
    shards = [b["context_parallel_shard"] for b in batches]
    if all(s.vision is None for s in shards):
        assert "pixel_values" not in full or full["pixel_values"].shape[0] == 0
        return batches
    video_token = None if name == "internvl" else VID
    image_token = IMG_CONTEXT if name == "internvl" else IMG
    got, origins = _simulated_exchange(shards)
    units = shards[0].vision.work.units
    for s, rows, origin in zip(shards, got, origins):
        np.testing.assert_array_equal(rows, _expected_rows(full, s, image_token, video_token))
        # each row came from the rank that encoded its unit
        kind, row = rows // 10**6, rows % 10**6
        unit = [np.flatnonzero((units.kind == k) & (units.feature_start <= r))[-1] for k, r in zip(kind, row)]
        np.testing.assert_array_equal(origin, s.vision.work.assignment[np.array(unit, dtype=np.int64)])
    everything = np.sort(np.concatenate(got))
    np.testing.assert_array_equal(everything, np.sort(_global_rows(units, np.arange(units.num_units))))
    # every unit encoded by exactly one rank, its pixels those of the pack
    encoded = np.sort(np.concatenate([s.vision.units.numpy() for s in shards]))
    np.testing.assert_array_equal(encoded, np.arange(units.num_units))
    for key, grid_key in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        if key not in full:
            continue
        mine = [b[key] for b in batches]
        assert sum(m.shape[0] for m in mine) == full[key].shape[0]
        if grid_key in full:
            for b in batches:
                assert int(b[grid_key].prod(-1).sum()) == b[key].shape[0]
        joined = torch.cat(mine)
        assert torch.equal(torch.sort(joined.flatten(1).sum(1)).values, torch.sort(full[key].flatten(1).sum(1)).values)
    return batches


grids = st.tuples(st.integers(1, 3), st.sampled_from([2, 4]), st.sampled_from([2, 4, 6]))
qwen_samples = st.lists(
    st.tuples(st.lists(grids.map(lambda g: (1, g[1], g[2])), max_size=3), st.lists(grids, max_size=2)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None)
@given(
    qwen_samples,
    st.integers(2, 4),
    st.sampled_from(STRATEGIES),
    st.sampled_from(["qwen2_vl", "qwen2_5_vl"]),
    st.integers(0, 99),
)
def test_every_placeholder_row_arrives_once_from_its_encoder(specs, size, strategy, name, seed):
    rng = np.random.default_rng(seed)
    samples = [qwen_sample(rng, images, videos, seconds=[1.0] * len(videos) or None) for images, videos in specs]
    _check_pack(name, samples, size, strategy)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=5), st.integers(2, 4), st.sampled_from(STRATEGIES))
def test_internvl_tiles_are_divided_and_routed(tiles, size, strategy):
    rng = np.random.default_rng(sum(tiles))
    _check_pack("internvl", [internvl_sample(rng, t) for t in tiles], size, strategy)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.integers(20, 200), st.integers(0, 10**6))
def test_many_small_units_are_balanced(size, per_rank, seed):
    rng = np.random.default_rng(seed)
    costs = rng.uniform(1.0, 2.0, size * per_rank)
    assign = divide_vision_units(costs, size, rng.integers(0, size, costs.size))
    times = np.bincount(assign, weights=costs, minlength=size)
    assert times.max() / times.mean() <= 1.05
    # list scheduling's bound holds for any costs
    heavy = rng.pareto(1.0, 3 * size) + 1
    times = np.bincount(divide_vision_units(heavy, size), weights=heavy, minlength=size)
    assert times.max() <= heavy.sum() / size + heavy.max() + 1e-9


def test_division_is_deterministic_and_prefers_the_placeholders_rank():
    costs = np.ones(8)
    prefer = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    assign = divide_vision_units(costs, 2, prefer)
    np.testing.assert_array_equal(assign, prefer)
    np.testing.assert_array_equal(divide_vision_units(costs, 2, prefer), assign)


def test_an_image_costlier_than_a_share_is_reported_not_split():
    rng = np.random.default_rng(0)
    samples = [qwen_sample(rng, [(1, 8, 8)]), qwen_sample(rng, [(1, 2, 2)])]
    batches = _check_pack("qwen2_vl", samples, 2, "contiguous")
    work = batches[0]["context_parallel_shard"].vision.work
    assert work.oversize == (0,) and work.imbalance > 1.5
    assert work.assignment.tolist().count(work.assignment[0]) == 1  # the big image alone on its rank


def test_video_frame_groups_are_units_and_keep_their_seconds():
    rng = np.random.default_rng(1)
    samples = [qwen_sample(rng, [], [(4, 4, 4)], seconds=[2.0]), qwen_sample(rng, [], [(2, 2, 4)], seconds=[0.5])]
    batches = _check_pack("qwen2_5_vl", samples, 2, "zigzag")
    frames = sorted(int(t) for b in batches for t in b["video_grid_thw"][:, 0])
    assert sum(frames) == 6 and len(frames) >= 2
    for b in batches:
        assert b["second_per_grid_ts"].shape[0] == b["video_grid_thw"].shape[0]
    units = patch_units(None, torch.tensor([[4, 4, 4]]), 2, ContextParallelCost.llama3_8b())
    assert units.num_units == 4 and units.feature_rows.tolist() == [4] * 4


def test_vit_cost_terms():
    cost = ContextParallelCost.llama3_8b()
    assert cost.vit_linear > 0 and cost.vit_quadratic > 0
    units = patch_units(torch.tensor([[1, 4, 4], [1, 2, 2]]), None, 2, cost)
    np.testing.assert_allclose(
        units.cost, cost.vit_linear * np.array([16, 4]) + cost.vit_quadratic * np.array([256, 16])
    )
    rows_only = patch_units(torch.tensor([[1, 4, 4]]), None, 2, ContextParallelCost(1.0, 0.0, 0.0))
    assert rows_only.cost.tolist() == [16.0]
    model = ok.CostModel(vit_linear=2.0, vit_quadratic=3.0, llm_linear=1.0)
    assert ContextParallelCost.from_cost_model(model, kv_token=0.0).vit_quadratic == 3.0
    with pytest.raises(ValueError, match="vit_linear"):
        ContextParallelCost(1.0, 0.0, 0.0, vit_linear=-1.0)


def test_a_text_only_pack_has_no_vision_shard():
    samples = [{"input_ids": torch.arange(3, 20), "labels": torch.arange(3, 20)}]
    for b in _collators("qwen2_vl", 2):
        b = b(samples)
        assert b["context_parallel_shard"].vision is None


def test_vision_shards_move_with_the_batch():
    rng = np.random.default_rng(0)
    batch = _collators("qwen2_vl", 2)[1]([qwen_sample(rng, [(1, 4, 4)]), qwen_sample(rng, [(1, 2, 2)])])
    moved = batch.to("meta")
    shard = moved["context_parallel_shard"]
    assert shard.vision.gather_index.is_meta and shard.vision.send_index.is_meta
    assert shard.batch["pixel_values"] is moved["pixel_values"]  # the rank's pixels only, moved once
    assert "vision=VisionShard(rank=1" in repr(shard)


def test_the_report_prices_each_cp_ranks_share_of_the_images():
    from omnibal_kernels.context_parallel import context_parallel_rank_times, context_parallel_report
    from omnibal_kernels.context_parallel.vision import sample_unit_costs

    rng = np.random.default_rng(4)
    n = 120
    seqlens = [rng.integers(16, 1024, int(k)) for k in rng.integers(0, 4, n)]
    vit = np.array([int(s.sum()) for s in seqlens], np.int64)
    llm = vit // 4 + rng.integers(20, 400, n)
    offsets = np.r_[0, np.cumsum([s.size for s in seqlens])].astype(np.int64)
    lengths = ok.Lengths(vit, llm, vit_seqlens=np.concatenate(seqlens).astype(np.int64), vit_seqlens_offsets=offsets)
    cp = ContextParallelOptions(size=4, strategy="hybrid")
    plan = ok.plan_packs(
        lengths, ok.PlanOptions(llm_capacity=8192, vit_capacity=16_384, context_parallel=cp), world_size=2
    )
    report = context_parallel_report(plan, lengths)
    assert report.vit_times is not None and report.vit_times.shape == report.times.shape
    for step in range(plan.num_steps):
        for group in range(2):
            ids = plan.pack(int(plan.step_packs[step, group]))
            costs = sample_unit_costs(vit, ids, cp.cost, lengths.vit_seqlens, offsets)
            np.testing.assert_allclose(report.vit_times[step, group].sum(), costs.sum())
            text = context_parallel_rank_times(llm[ids], cp).times
            np.testing.assert_allclose(report.times[step, group], text + report.vit_times[step, group])
    assert report.to_dict()["worst_vit_imbalance"] >= 1.0
    text_only = context_parallel_report(plan, ok.Lengths(np.zeros(n, np.int64), llm))
    assert not text_only.vit_times.any() and text_only.to_dict()["worst_vit_imbalance"] == 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_token_keeps_the_unsharded_packs_mrope_position(strategy):
    rng = np.random.default_rng(5)
    samples = [qwen_sample(rng, [(1, 4, 8)], [(2, 4, 4)], seconds=[2.0]), qwen_sample(rng, [(1, 2, 2)])]
    full = ok.PackCollator.for_model(config("qwen2_5_vl"), warmup=False)(samples)
    for b in _collators("qwen2_5_vl", 3, strategy):
        b = b(samples)
        held = b["context_parallel_shard"].indices
        assert b["position_ids"].shape == (4, 1, held.numel())
        assert torch.equal(b["position_ids"], full["position_ids"][..., held])
        assert torch.equal(b["input_ids"][0], full["input_ids"][0, held])


def test_a_planned_sampler_gives_each_cp_rank_its_share_of_the_images():
    from omnibal_kernels.testing.hf_models import lengths_of, training_samples

    samples = training_samples("qwen2_vl", 24, seed=2)
    options = ok.PlanOptions(target_batch_size=4, drop_last=True, context_parallel=ContextParallelOptions(size=2))
    collate = ok.PackCollator.for_model(config("qwen2_vl"), warmup=False)  # CP options and rank from the sampler
    ranks = []
    for rank in range(2):
        sampler = ok.BalancedBatchSampler(lengths_of(samples), options, world_size=2, rank=rank)
        loader = torch.utils.data.DataLoader(sampler.wrap(samples), batch_sampler=sampler, collate_fn=collate)
        ranks.append(list(loader))
    assert len(ranks[0]) == len(ranks[1]) > 0
    for a, b in zip(*ranks):
        va, vb = a["context_parallel_shard"].vision, b["context_parallel_shard"].vision
        assert (va.rank, vb.rank) == (0, 1) and va.work.units.num_units == va.units.numel() + vb.units.numel()
        assert a["pixel_values"].shape[0] + b["pixel_values"].shape[0] == int(va.work.units.pixel_rows.sum())
        assert int(a["num_items_in_batch"]) == int(b["num_items_in_batch"])


def test_vision_shards_come_through_dataloader_workers():
    rng = np.random.default_rng(6)
    pack = [qwen_sample(rng, [(1, 4, 4)], [(2, 2, 4)], seconds=[1.0]), qwen_sample(rng, [(1, 2, 2)])]
    collate = _collators("qwen2_vl", 2)[1]
    loader = torch.utils.data.DataLoader([pack], batch_size=None, collate_fn=collate, num_workers=1)
    (got,) = list(loader)
    want = collate(pack)
    assert torch.equal(
        got["context_parallel_shard"].vision.gather_index, want["context_parallel_shard"].vision.gather_index
    )
    assert (
        torch.equal(got["pixel_values"], want["pixel_values"])
        and got["context_parallel_shard"].vision.work.units.num_units == 4
    )
