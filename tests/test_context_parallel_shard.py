"""Context-parallel shards in one process: layouts, tokens, labels, positions, restore, and the exchange plan.

The exchange is emulated here (every rank's sends handed to the receivers by indexing), so the plan's
send/receive lists and key indices are checked against unsharded ``varlen_attention`` on many random batches;
``test_context_parallel_dist.py`` runs the real all-to-all over gloo processes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from omnibal_kernels import PackOptions
from omnibal_kernels.attention import varlen_attention
from omnibal_kernels.context_parallel import (
    ContextParallelCost,
    ContextParallelOptions,
    context_parallel_rank_times,
    shard_for_context_parallel,
)
from omnibal_kernels.context_parallel.layout import tiled_pairs
from omnibal_kernels.packing import pack_batch

STRATEGIES = [
    ("zigzag", False),
    ("zigzag", True),
    ("per_document", False),
    ("hybrid", False),
    ("contiguous", False),
    ("auto", False),
]

lengths_st = st.lists(st.one_of(st.integers(0, 40), st.integers(1, 400)), min_size=1, max_size=10).filter(
    lambda xs: sum(xs) > 0
)


def _batch(lengths: list[int], seed: int = 0, allow_empty: bool = True):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 1000, (n,), generator=g)} for n in lengths]
    return pack_batch(samples, PackOptions(allow_empty=allow_empty))


def emulate(shards, q, k, v):
    """Every rank's context_parallel_attention in one process: the all-to-all done by indexing."""
    heads = k.shape[1]
    kv = [torch.cat([k, v], 1).index_select(0, s.indices.clamp(min=0)) for s in shards]
    sent = [torch.split(kv[r].index_select(0, s.send_index), list(s.send_counts)) for r, s in enumerate(shards)]
    outs = []
    for r, s in enumerate(shards):
        got = torch.cat([sent[src][r] for src in range(len(shards))])
        assert got.shape[0] == sum(s.recv_counts)
        keys = torch.cat([kv[r], got]).index_select(0, s.key_index)
        outs.append(
            varlen_attention(
                q.index_select(0, s.indices.clamp(min=0)),
                keys[:, :heads],
                keys[:, heads:],
                s.cu_seqlens_q,
                s.max_seqlen_q,
                cu_seqlens_k=s.cu_seqlens_k,
                max_seqlen_k=s.max_seqlen_k,
            )
        )
    return outs


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, context_parallel_size=st.integers(1, 8), which=st.sampled_from(STRATEGIES))
def test_every_token_once_labels_positions_restore(lengths, context_parallel_size, which):
    strategy, pad = which
    batch = _batch(lengths)
    total = batch["input_ids"].shape[1]
    shards = shard_for_context_parallel(
        batch, ContextParallelOptions(size=context_parallel_size, strategy=strategy, pad_sequences=pad)
    )
    assert len(shards) == context_parallel_size
    held = torch.cat([s.indices for s in shards])
    real = held[held >= 0]
    # every token exactly once; padding only with Megatron padding
    assert sorted(real.tolist()) == list(range(total))
    assert pad or int((held < 0).sum()) == 0
    assert int((held < 0).sum()) == shards.times.padding
    cu = batch["cu_seqlens"].tolist()
    labels = batch["labels"][0]
    for s in shards:
        idx = s.indices
        seq = np.searchsorted(cu, idx.clamp(min=0).numpy(), side="right") - 1
        for i, g in enumerate(idx.tolist()):
            b = s.batch
            if g < 0:
                assert b["labels"][0, i] == -100 and b["shift_labels"][0, i] == -100
                continue
            start, stop = cu[seq[i]], cu[seq[i] + 1]
            assert s.position_ids[i] == g - start == b["position_ids"][0, i]
            assert b["input_ids"][0, i] == batch["input_ids"][0, g]
            assert b["labels"][0, i] == labels[g]
            # the target of a token is its successor in its own sequence, never a token of another one
            assert b["shift_labels"][0, i] == (labels[g + 1] if g + 1 < stop else -100)
            if g == start:
                assert b["labels"][0, i] == -100
        assert s.batch["cu_seqlens"].dtype == torch.int32 and int(s.batch["cu_seqlens"][-1]) == s.num_tokens
    # restore: each rank's rows (as a per-token output) come back as the packed tokens, in order
    outs = [torch.stack([s.indices, s.indices * 3], 1) for s in shards]
    assert torch.equal(shards.restore(outs), torch.stack([torch.arange(total), 3 * torch.arange(total)], 1))
    targets = int((batch["labels"][0, 1:] != -100).sum()) - 0
    assert shards.num_items_in_batch == sum(int((s.batch["shift_labels"] != -100).sum()) for s in shards)
    assert shards.num_items_in_batch <= targets


@settings(max_examples=40, deadline=None)
@given(
    lengths=lengths_st,
    context_parallel_size=st.integers(1, 8),
    which=st.sampled_from(STRATEGIES),
    gqa=st.sampled_from([1, 2]),
)
def test_emulated_exchange_gives_unsharded_attention(lengths, context_parallel_size, which, gqa):
    strategy, pad = which
    batch = _batch(lengths)
    total = batch["input_ids"].shape[1]
    g = torch.Generator().manual_seed(len(lengths))
    q = torch.randn(total, 4, 8, generator=g)
    k = torch.randn(total, 4 // gqa, 8, generator=g)
    v = torch.randn(total, 4 // gqa, 8, generator=g)
    ref = varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])
    shards = shard_for_context_parallel(
        batch, ContextParallelOptions(size=context_parallel_size, strategy=strategy, pad_sequences=pad)
    )
    outs = emulate(shards, q, k, v)
    torch.testing.assert_close(shards.restore(outs), ref, rtol=1e-5, atol=1e-5)
    # the predicted exchange is what the plan exchanges
    assert [sum(s.recv_counts) for s in shards] == shards.times.kv_received.tolist()
    assert [sum(s.send_counts) for s in shards] == [s.send_index.numel() for s in shards]
    assert sum(sum(s.send_counts) for s in shards) == shards.times.kv_exchanged


def test_emulation_catches_a_wrong_key_index():
    """Negative control: one key row moved makes the emulated attention differ from the reference."""
    batch = _batch([50, 70])
    total = batch["input_ids"].shape[1]
    g = torch.Generator().manual_seed(0)  # not the global generator: other tests in the process move it
    q, k, v = (torch.randn(total, 2, 4, generator=g) for _ in range(3))
    ref = varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])
    shards = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="zigzag"))
    shards[1].key_index[3] = shards[1].key_index[4]
    assert not torch.allclose(shards.restore(emulate(shards, q, k, v)), ref, atol=1e-4)


def _auto_against_the_fixed_strategies(lengths: list[int], context_parallel_size: int) -> None:
    """auto never exchanges more K/V rows than zigzag, and is never predicted slower than zigzag nor than any
    fixed strategy that exchanges no more."""
    auto = context_parallel_rank_times(lengths, ContextParallelOptions(size=context_parallel_size, strategy="auto"))
    fixed = {
        name: context_parallel_rank_times(lengths, ContextParallelOptions(size=context_parallel_size, strategy=name))
        for name in ("zigzag", "per_document", "hybrid", "contiguous")
    }
    zigzag = fixed["zigzag"]
    assert auto.kv_exchanged <= zigzag.kv_exchanged and auto.step_time <= zigzag.step_time
    for times in fixed.values():
        if times.kv_exchanged <= zigzag.kv_exchanged:
            assert auto.step_time <= times.step_time
    assert auto.strategy in fixed
    assert int(auto.tokens.sum()) == sum(lengths)


@pytest.mark.property
@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=30), context_parallel_size=st.integers(1, 8))
def test_auto_never_exchanges_more_than_zigzag_nor_is_slower_than_a_frugal_strategy(lengths, context_parallel_size):
    _auto_against_the_fixed_strategies(lengths, context_parallel_size)


@pytest.mark.property
@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 200_000), context_parallel_size=st.integers(2, 8))
def test_auto_on_one_long_sequence_is_no_worse_than_zigzag(length, context_parallel_size):
    # one sequence: hybrid cuts it head-tail like zigzag, with shares that can trade K/V rows for time
    _auto_against_the_fixed_strategies([length], context_parallel_size)


@pytest.mark.parametrize("context_parallel_size", [2, 4, 8])
def test_auto_on_a_pack_of_one_sequence_keeps_zigzags_exchange(context_parallel_size):
    for length in (70_771, 100_000, 12_345):
        _auto_against_the_fixed_strategies([length], context_parallel_size)


def test_hybrid_keeps_short_sequences_whole_and_balances():
    lengths = [65536] + [1000 + 37 * i for i in range(40)]
    cp = 4
    shards = shard_for_context_parallel(_batch(lengths), ContextParallelOptions(size=cp, strategy="hybrid"))
    pieces = np.bincount(shards.layout.seq, minlength=len(lengths))
    assert pieces[0] > 1  # the long sequence is cut
    # short ones are cut only where one rank's share of the cut sequences ends: at most cp - 1 of them
    assert int((pieces[1:] > 1).sum()) <= cp - 1
    assert shards.times.imbalance <= 1.02
    zigzag = context_parallel_rank_times(lengths, ContextParallelOptions(size=cp, strategy="zigzag"))
    assert shards.times.kv_exchanged <= zigzag.kv_exchanged / 2
    assert shards.times.step_time < zigzag.step_time


def test_hybrid_exchanges_nothing_when_whole_sequences_balance():
    lengths = [1000] * 16
    times = context_parallel_rank_times(lengths, ContextParallelOptions(size=4, strategy="hybrid"))
    assert times.kv_exchanged == 0 and times.imbalance == 1.0


def test_zigzag_megatron_padding_matches_the_convention():
    """Rank r holds chunk r, then chunk 2P-1-r of every sequence padded to a multiple of 2P (plain reference)."""
    lengths, cp = [7, 11, 5, 16], 2
    batch = _batch(lengths)
    shards = shard_for_context_parallel(batch, ContextParallelOptions(size=cp, strategy="zigzag", pad_sequences=True))
    cu = np.r_[0, np.cumsum(lengths)]
    for r in range(cp):
        expect = []
        for s, n in enumerate(lengths):
            padded = -(-n // (2 * cp)) * 2 * cp
            c = padded // (2 * cp)
            for chunk in (r, 2 * cp - 1 - r):
                expect += [cu[s] + p if p < n else -1 for p in range(chunk * c, (chunk + 1) * c)]
        assert shards[r].indices.tolist() == expect
    assert shards.times.padding == sum(-(-n // 4) * 4 - n for n in lengths)


def test_zigzag_without_padding_deals_the_remainder_evenly():
    times = context_parallel_rank_times([1001] * 8, ContextParallelOptions(size=4, strategy="zigzag"))
    assert times.padding == 0
    assert int(times.tokens.max() - times.tokens.min()) <= 2


@pytest.mark.parametrize(
    "lq,lk",
    [(1, 1), (5, 5), (3, 200), (128, 128), (129, 300), (97, 1025), pytest.param(1023, 1023, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("tile", [1, 16, 128])
def test_tiled_pairs_against_brute_force(lq, lk, tile):
    visible = np.zeros((lq, lk), bool)
    for i in range(lq):
        visible[i, : i + lk - lq + 1] = True
    blocks = 0
    for a in range(0, lq, tile):
        for b in range(0, lk, tile):
            blocks += bool(visible[a : a + tile, b : b + tile].any())
    assert tiled_pairs(lq, lk, tile) == blocks * tile * tile
    if tile == 1:
        assert tiled_pairs(lq, lk, 1) == visible.sum()


def test_same_batch_same_shards():
    batch = _batch([900, 33, 4000, 12, 250])
    a = shard_for_context_parallel(batch, ContextParallelOptions(size=4))
    b = shard_for_context_parallel(batch, ContextParallelOptions(size=4))
    assert a.strategy == b.strategy
    for x, y in zip(a, b):
        assert torch.equal(x.indices, y.indices) and torch.equal(x.key_index, y.key_index)
        assert x.send_counts == y.send_counts


def test_mrope_positions_and_token_fields_are_sharded():
    batch = dict(_batch([20, 9]))
    total = batch["input_ids"].shape[1]
    batch["position_ids"] = torch.arange(3 * total).reshape(3, 1, total)
    batch["extra"] = torch.arange(total).reshape(1, total) * 2
    shards = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="zigzag"))
    for s in shards:
        assert torch.equal(s.batch["position_ids"], batch["position_ids"][..., s.indices])
        assert torch.equal(s.batch["extra"][0], s.indices * 2)
        assert isinstance(s.batch, dict)
    with pytest.raises(ValueError, match="mRoPE"):
        shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="zigzag", pad_sequences=True))


def test_bad_arguments_are_named():
    batch = _batch([10, 20])
    with pytest.raises(ValueError, match="strategy"):
        shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="ring"))
    with pytest.raises(ValueError, match="context_parallel.size"):
        shard_for_context_parallel(batch, ContextParallelOptions(size=0))
    with pytest.raises(TypeError, match="context_parallel.size"):
        shard_for_context_parallel(batch, ContextParallelOptions(size=2.0))
    with pytest.raises(ValueError, match="pad_sequences"):
        shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="hybrid", pad_sequences=True))
    with pytest.raises(TypeError, match="batch"):
        shard_for_context_parallel([1, 2], ContextParallelOptions(size=2))
    with pytest.raises(ValueError, match="per_sample"):
        shard_for_context_parallel({**batch, "per_sample": [1, 2]}, ContextParallelOptions(size=2))
    assert shard_for_context_parallel(
        {**batch, "per_sample": [1, 2]}, ContextParallelOptions(size=2), replicate=["per_sample"]
    )[1].batch["per_sample"] == [1, 2]
    with pytest.raises(ValueError, match="cu_seqlens"):
        shard_for_context_parallel(
            {**batch, "cu_seqlens": torch.tensor([0, 5, 29], dtype=torch.int32)}, ContextParallelOptions(size=2)
        )
    with pytest.raises(TypeError, match="cost"):
        context_parallel_rank_times([10], ContextParallelOptions(size=2, cost="fast"))
    with pytest.raises(ValueError, match="seqlens"):
        context_parallel_rank_times([10, -1], ContextParallelOptions(size=2))
    with pytest.raises(ValueError, match="ContextParallelCost: pair must be finite and >= 0"):
        ContextParallelCost(1.0, -1.0, 0.0)
    with pytest.raises(ValueError, match="ContextParallelCost: kv_token must be finite"):
        ContextParallelCost(1.0, 1.0, float("nan"))
    with pytest.raises(TypeError, match="ContextParallelCost: token must be a number, got bool"):
        ContextParallelCost(True, 1.0, 0.0)


def test_empty_ranks_keep_valid_shapes():
    shards = shard_for_context_parallel(_batch([3]), ContextParallelOptions(size=8, strategy="zigzag"))
    empty = [s for s in shards if s.num_tokens == 0]
    assert empty
    for s in empty:
        assert s.batch["cu_seqlens"].tolist() == [0, 0] and s.batch["input_ids"].shape == (1, 0)


def test_for_model_batches_are_sharded():
    """PackCollator.for_model batches: boundaries only as cu_seq_lens_q, and a use_cache setting copied."""
    batch = dict(_batch([30, 9, 14]))
    for key in ("cu_seqlens", "seq_lens", "max_seqlen"):
        batch.pop(key)
    batch["use_cache"] = False
    shards = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="zigzag"))
    reference = shard_for_context_parallel(_batch([30, 9, 14]), ContextParallelOptions(size=2, strategy="zigzag"))
    for s, r in zip(shards, reference):
        assert torch.equal(s.indices, r.indices) and s.batch["use_cache"] is False


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.integers(0, 300), st.integers(1, 5000)), min_size=1, max_size=12),
    context_parallel_size=st.integers(1, 8),
    which=st.sampled_from(STRATEGIES),
)
@example(
    lengths=[266], context_parallel_size=6, which=("hybrid", False)
)  # a sequence of two kernel tiles over six ranks
def test_layout_chunks_cover_every_sequence_once(lengths, context_parallel_size, which):
    """Layouts alone (cheap, so many more examples): chunks inside their sequence, disjoint, covering it."""
    from omnibal_kernels.context_parallel import plan_layout

    layout, times = plan_layout(
        lengths, ContextParallelOptions(size=context_parallel_size, strategy=which[0], pad_sequences=which[1])
    )
    assert ((layout.start >= 0) & (layout.start < layout.stop) & (layout.stop <= layout.padded[layout.seq])).all()
    assert ((layout.rank >= 0) & (layout.rank < context_parallel_size)).all()
    for s, n in enumerate(layout.padded.tolist()):
        mine = np.flatnonzero(layout.seq == s)
        order = mine[np.argsort(layout.start[mine])]
        assert layout.start[order].tolist() == [0, *layout.stop[order][:-1].tolist()][: order.size]
        assert (layout.stop[order][-1] if order.size else 0) == n
    assert int(times.tokens.sum()) == sum(lengths) + times.padding


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20_000), min_size=1, max_size=20),
    context_parallel_size=st.integers(2, 8),
    slack=st.sampled_from([1.0, 1.1, 1.5]),
)
def test_max_rank_tokens_is_held(lengths, context_parallel_size, slack):
    total = sum(lengths)
    cap = max(1, int(np.ceil(slack * total / context_parallel_size)))
    auto = context_parallel_rank_times(
        lengths, ContextParallelOptions(size=context_parallel_size, strategy="auto", max_rank_tokens=cap)
    )
    assert int(auto.tokens.max()) <= cap
    # within the cap auto is still no slower than any fixed strategy that keeps to it and (where zigzag keeps to
    # it) exchanges no more K/V than zigzag
    kept = {}
    for name in ("zigzag", "per_document", "contiguous", "hybrid"):
        try:
            kept[name] = context_parallel_rank_times(
                lengths, ContextParallelOptions(size=context_parallel_size, strategy=name, max_rank_tokens=cap)
            )
        except ValueError:
            continue
        assert int(kept[name].tokens.max()) <= cap
    limit = kept["zigzag"].kv_exchanged if "zigzag" in kept else None
    if limit is not None:
        assert auto.kv_exchanged <= limit
    for fixed in kept.values():
        if limit is None or fixed.kv_exchanged <= limit:
            assert auto.step_time <= fixed.step_time


def test_max_rank_tokens_errors_name_it():
    lengths = [50_000, 2_000, 1_000]
    with pytest.raises(ValueError, match="max_rank_tokens"):
        context_parallel_rank_times(
            lengths, ContextParallelOptions(size=4, strategy="auto", max_rank_tokens=10_000)
        )  # under T / P
    # Megatron padding puts 1254 tokens on every rank of [5001, 3] at CP 4, more than the 1251 of the real ones
    with pytest.raises(ValueError, match="1254 tokens, more than max_rank_tokens=1251"):
        context_parallel_rank_times(
            [5001, 3], ContextParallelOptions(size=4, strategy="zigzag", pad_sequences=True, max_rank_tokens=1251)
        )
    with pytest.raises(ValueError, match="max_rank_tokens"):
        context_parallel_rank_times(lengths, ContextParallelOptions(size=4, strategy="zigzag", max_rank_tokens=0))
    shards = shard_for_context_parallel(_batch([3000, 200, 100]), ContextParallelOptions(size=4, max_rank_tokens=900))
    assert max(s.num_tokens for s in shards) <= 900
