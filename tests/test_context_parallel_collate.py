"""PackCollator with context_parallel.size = C: every CP rank's shard, against the unsharded batch of the same samples.

The union of the ranks' shards is the batch (every token once, with its ids, labels, targets and positions),
vision fields reach every rank unchanged, and the loss of the shards adds up to the loss of the batch in both
of step_loss's modes and in step_batches' counts: the counts are the pack's, never a shard's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels.context_parallel import ContextParallelOptions
from omnibal_kernels.loss import _local_counts, step_loss
from omnibal_kernels.testing.hf_models import config, internvl_sample, lengths_of, training_samples

STRATEGIES = [
    ("zigzag", False),
    ("zigzag", True),
    ("per_document", False),
    ("hybrid", False),
    ("contiguous", False),
    ("auto", False),
]
VOCAB = 50


def _samples(lengths: list[int], seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(1, VOCAB, (n,), generator=g)
        labels = ids.clone()
        labels[: n // 3] = -100  # a prompt: label tokens differ from tokens
        out.append({"input_ids": ids, "labels": labels})
    return out


def _shards(samples: list[dict], cp: int, strategy: str = "auto", pad: bool = False, **options) -> list:
    context_parallel = ok.ContextParallelOptions(size=cp, strategy=strategy, pad_sequences=pad)
    return [
        ok.PackCollator(
            ok.PackOptions(**options), context_parallel=context_parallel, context_parallel_rank=r, warmup=False
        )(samples)
        for r in range(cp)
    ]


def _with_step(batch, items: int = 1000, labelled: int = 9):
    """The batch as part of an optimizer step of ``items`` targets and ``labelled`` samples."""
    return batch.with_counts(batch.loss_counts._replace(num_items_in_batch=items, num_samples_in_batch=labelled))


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    cp=st.integers(2, 6),
    which=st.sampled_from(STRATEGIES),
    multiple=st.sampled_from([None, 64]),
)
def test_the_union_of_the_shards_is_the_batch(lengths, cp, which, multiple):
    strategy, pad = which
    samples = _samples(lengths, seed=len(lengths))
    full = ok.PackCollator(ok.PackOptions(pad_to_multiple_of=multiple), warmup=False)(samples)
    shards = _shards(samples, cp, strategy, pad, pad_to_multiple_of=multiple)
    total = full["input_ids"].shape[1]
    cu = full["cu_seqlens"].tolist()
    held = torch.cat([s["context_parallel_shard"].indices for s in shards])
    assert sorted(held[held >= 0].tolist()) == list(range(total))
    assert pad or bool((held >= 0).all())
    targets = sum(int((s["shift_labels"] != -100).sum()) for s in shards)
    assert targets == int((full["labels"][0, 1:] != -100).sum())  # each sample's first label is masked
    for r, s in enumerate(shards):
        shard = s["context_parallel_shard"]
        assert shard.rank == r and shard.context_parallel_size == cp
        idx = shard.indices
        real = idx >= 0
        src = idx.clamp(min=0)
        n = idx.numel()
        assert s["input_ids"].shape == s["labels"].shape == s["position_ids"].shape == (1, n)
        assert torch.equal(s["input_ids"][0, real], full["input_ids"][0, src[real]])
        assert torch.equal(s["labels"][0, real], full["labels"][0, src[real]])
        assert torch.equal(s["position_ids"][0, real], full["position_ids"][0, src[real]])
        seq = np.searchsorted(cu, src.numpy(), side="right") - 1
        ends = np.asarray(cu)[seq + 1]
        nxt = torch.from_numpy(np.where(src.numpy() + 1 < ends, src.numpy() + 1, 0))
        want = torch.where(real & torch.from_numpy(src.numpy() + 1 < ends), full["labels"][0, nxt], -100)
        assert torch.equal(s["shift_labels"][0], want)
        # local boundaries: one segment per held chunk, covering the rank's tokens
        local = s["cu_seqlens"]
        assert local.dtype == torch.int32 and int(local[0]) == 0 and int(local[-1]) == n
        assert torch.equal(
            torch.repeat_interleave(torch.arange(local.numel() - 1), local.diff().long()), s["seq_idx"][0].long()
        )
        # the pack's counts, not the shard's
        assert s.loss_counts.sample_lens == full.loss_counts.sample_lens
        assert sum(s.loss_counts.sample_targets) == targets
        assert int(s["num_items_in_batch"]) == targets


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=8),
    cp=st.integers(2, 5),
    which=st.sampled_from(STRATEGIES),
)
def test_the_shards_losses_add_up_to_the_batchs(lengths, cp, which):
    strategy, pad = which
    samples = _samples(lengths, seed=7)
    full = _with_step(ok.PackCollator(warmup=False)(samples))
    shards = [_with_step(s) for s in _shards(samples, cp, strategy, pad)]
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, full["input_ids"].shape[1], VOCAB, generator=g, dtype=torch.float64)
    for mode in ("token", "sample"):
        parts = [step_loss(logits[:, s["context_parallel_shard"].indices.clamp(min=0)], s, mode=mode) for s in shards]
        torch.testing.assert_close(sum(parts), step_loss(logits, full, mode=mode), rtol=1e-12, atol=1e-12)
    # step_batches' counts: summed over the CP ranks, the pack's targets and labelled samples
    counted = np.sum([_local_counts(s, -100) for s in shards], axis=0).tolist()
    assert counted == list(_local_counts(full, -100))


def test_a_group_of_one_is_the_whole_batch():
    samples = _samples([30, 4])
    one = ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=1), warmup=False)(samples)
    assert one.to_dict().keys() == ok.pack_batch(samples).to_dict().keys()
    assert torch.equal(one["input_ids"], ok.pack_batch(samples)["input_ids"])


def test_a_shifted_loss_on_a_shard_would_differ():
    """Control: the local shift (the unsharded rule) pairs neighbours of different chunks on a shard."""
    samples = _samples([120, 90])
    full = _with_step(ok.PackCollator(warmup=False)(samples))
    shards = [_with_step(s) for s in _shards(samples, 2, "zigzag")]
    # logits that predict every next label of the pack: the right pairing costs almost nothing, each pair the
    # local shift makes across two chunks costs about 20 / num_items_in_batch (no draw, so no luck involved)
    logits = torch.zeros(1, full["input_ids"].shape[1], VOCAB, dtype=torch.float64)
    following = full["labels"][0, 1:]
    at = torch.nonzero(following != -100).flatten()
    logits[0, at, following[at]] = 20.0
    local = [
        ok.PackedBatch({k: v for k, v in s.items() if k != "context_parallel_shard"}, s.loss_counts) for s in shards
    ]
    wrong = sum(step_loss(logits[:, s["context_parallel_shard"].indices], b) for s, b in zip(shards, local))
    assert abs(float(wrong - step_loss(logits, full))) > 1e-3


def test_vision_fields_reach_every_rank_unchanged():
    rng = np.random.default_rng(0)
    samples = [internvl_sample(rng, tiles) for tiles in (2, 1, 3)]
    full = ok.PackCollator(warmup=False)(samples)
    for s in _shards(samples, 3, "hybrid"):
        for key in ("pixel_values", "vit_cu_seqlens", "image_to_sample", "num_images"):
            assert torch.equal(s[key], full[key]), key
        assert s["vit_max_seqlen"] == full["vit_max_seqlen"]


def test_shards_move_with_their_batch():
    s = _shards(_samples([40, 9]), 2)[1]
    moved = s.to("meta")
    shard = moved["context_parallel_shard"]
    assert moved["input_ids"].is_meta and shard.indices.is_meta and shard.key_index.is_meta
    assert shard.batch["input_ids"] is moved["input_ids"]  # moved once, shared


def test_for_model_shards_keep_what_the_model_and_the_attention_take():
    samples = training_samples("llama", 4, seed=0)
    collator = ok.PackCollator.for_model(
        config("llama"), context_parallel=ContextParallelOptions(size=2), context_parallel_rank=1, warmup=False
    )
    batch = collator(samples)
    assert {
        "input_ids",
        "labels",
        "shift_labels",
        "position_ids",
        "context_parallel_shard",
        "num_items_in_batch",
    } <= set(batch)
    assert batch["use_cache"] is False
    assert not {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q"} & set(batch)
    assert "ContextParallelOptions(size=2" in repr(collator) and "context_parallel_rank=1" in repr(collator)


def test_sampler_and_collator_give_a_cp_group_one_pack_and_each_rank_its_shard():
    samples = training_samples("llama", 48, seed=1)
    lengths = lengths_of(samples)
    world, cp = 4, 2
    batches = []
    for rank in range(world):
        sampler = ok.BalancedBatchSampler(
            lengths,
            ok.PlanOptions(target_batch_size=4, drop_last=True, context_parallel=ok.ContextParallelOptions(size=cp)),
            world_size=world,
            rank=rank,
            micro_steps_per_step=2,
        )
        assert (sampler.world_size, sampler.rank, sampler.context_parallel_rank) == (2, rank // cp, rank % cp)
        collator = ok.PackCollator(
            context_parallel=ok.ContextParallelOptions(size=cp), context_parallel_rank=rank % cp, warmup=False
        )
        loader = torch.utils.data.DataLoader(
            sampler.wrap(samples), batch_sampler=sampler, collate_fn=collator, num_workers=1 if rank == 3 else 0
        )
        batches.append(list(loader))
    plain = ok.BalancedBatchSampler(
        lengths, ok.PlanOptions(target_batch_size=4, drop_last=True), world_size=2, rank=0, micro_steps_per_step=2
    )
    whole = list(
        torch.utils.data.DataLoader(plain.wrap(samples), batch_sampler=plain, collate_fn=ok.PackCollator(warmup=False))
    )
    assert len(batches[0]) == len(whole)
    for a, b, w in zip(batches[0], batches[1], whole):
        # the two CP ranks of data-parallel rank 0: shards of the pack the plain sampler gives it
        held = torch.cat([a["context_parallel_shard"].indices, b["context_parallel_shard"].indices])
        assert sorted(held.tolist()) == list(range(w["input_ids"].shape[1]))
        for s in (a, b):
            assert s.loss_counts._replace(sample_targets=None) == w.loss_counts
            assert int(s["num_items_in_batch"]) == int(w["num_items_in_batch"])
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(1, w["input_ids"].shape[1], 128, generator=g, dtype=torch.float64)
        got = sum(step_loss(logits[:, s["context_parallel_shard"].indices], s) for s in (a, b))
        torch.testing.assert_close(got, step_loss(logits, w), rtol=1e-12, atol=1e-12)
    for a, b in zip(batches[2], batches[3]):  # rank 3 through a worker process
        assert a.loss_counts == b.loss_counts and a["context_parallel_shard"].rank == 0
        assert b["context_parallel_shard"].rank == 1


def test_context_parallel_arguments_are_named(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="context_parallel.size"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=0))
    with pytest.raises(TypeError, match="context_parallel.size"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=2.0))
    with pytest.raises(ValueError, match="context_parallel_rank"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=2), context_parallel_rank=2)
    with pytest.raises(ValueError, match="context_parallel_rank"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=1), context_parallel_rank=1)
    with pytest.raises(TypeError, match="context_parallel_rank"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=2), context_parallel_rank="1")
    with pytest.raises(ValueError, match="strategy"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=2, strategy="ring"), context_parallel_rank=0)
    with pytest.raises(ValueError, match="not both"):
        ok.PackCollator(
            context_parallel=ok.ContextParallelOptions(size=2), context_parallel_rank=0, context_parallel_group=object()
        )
    # no rank known: an error naming the ways to give it, never rank 0
    with pytest.raises(ValueError, match="context_parallel_rank="):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=2))
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("RANK", "5")
    assert ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=3), warmup=False).context_parallel_rank == 2
    with pytest.raises(ValueError, match="context_parallel.size=4 does not divide"):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=4))


def test_sampler_context_parallel_arguments_are_named():
    lengths = np.full(64, 100)
    with pytest.raises(ValueError, match="context_parallel.size=3 does not divide world_size=4"):
        ok.BalancedBatchSampler(
            lengths, ok.PlanOptions(context_parallel=ok.ContextParallelOptions(size=3)), world_size=4, rank=0
        )
    with pytest.raises(ValueError, match="context_parallel.size"):
        ok.BalancedBatchSampler(
            lengths, ok.PlanOptions(context_parallel=ok.ContextParallelOptions(size=0)), world_size=4, rank=0
        )
    with pytest.raises(TypeError, match="context_parallel.size"):
        ok.BalancedBatchSampler(
            lengths, ok.PlanOptions(context_parallel=ok.ContextParallelOptions(size=True)), world_size=4, rank=0
        )
    with pytest.raises(TypeError, match="context_parallel.size"):
        ok.plan_packs(lengths, ok.PlanOptions(context_parallel=ok.ContextParallelOptions(size=1.5)), world_size=2)
    with pytest.raises(TypeError, match="context_parallel must be a ContextParallelOptions, got int"):
        ok.PlanOptions(context_parallel=2)  # type: ignore[arg-type]


def _guide_loop() -> str:
    import re
    from pathlib import Path

    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "context-parallel.md"
    match = re.search(
        r"^## A DataLoader per CP rank\n.*?```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S | re.M
    )
    assert match, "the context-parallel guide has no 'A DataLoader per CP rank' example"
    return match.group(1)


class _TokenModel(torch.nn.Module):
    """Per-token logits from the token and its position: what a shard computes for a token is what the whole
    pack computes for it exactly when ids and positions are right."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens = torch.nn.Embedding(128, 128, dtype=torch.float64)
        self.positions = torch.nn.Embedding(4096, 128, dtype=torch.float64)

    def forward(self, input_ids, position_ids, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.tokens(input_ids) + self.positions(position_ids))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:epoch 0")
def test_the_guides_loop_trains_the_gradient_of_the_packs():
    """The guide's example on 2 groups of 2 CP ranks has the gradient of 2 data-parallel ranks without CP
    (gradients averaged over the ranks, as DDP does), and fails it when both ranks of a group take shard 0."""
    rng = np.random.default_rng(2)
    samples = _samples(rng.integers(300, 4000, 64).tolist(), seed=2)
    lengths = lengths_of(samples)

    def run(code: str, world_size: int) -> torch.Tensor:
        model = _TokenModel()
        for rank in range(world_size):
            scope = {
                "ok": ok,
                "DataLoader": torch.utils.data.DataLoader,
                "lengths": lengths,
                "dataset": samples,
                "world_size": world_size,
                "rank": rank,
                "model": model,
                "cp_group": None,
            }
            exec(code, scope)
            size = scope["cp"].size
            if size > 1:
                assert scope["report"].times.shape[1:] == (world_size // size, size)
            else:
                assert scope["report"] is None  # whole packs: nothing priced per CP rank
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]) / world_size

    code = _guide_loop()
    got = run(code, 4)
    want = run(code.replace("ContextParallelOptions(size=2)", "ContextParallelOptions(size=1)"), 2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(got.abs().max()) > 0
    # a collator told to be CP rank 0 on every rank: refused, never both ranks training shard 0
    with pytest.raises(ValueError, match="context_parallel_rank 0 but the sampler's batches are for CP rank 1"):
        run(code.replace("ok.PackCollator()", "ok.PackCollator(context_parallel=cp, context_parallel_rank=0)"), 4)
    # the dataset not wrapped: the batches carry no plan, so no shard and no step count: said, then refused
    with pytest.warns(UserWarning, match=r"sampler.wrap\(dataset\)"), pytest.raises(ValueError, match="no count"):
        run(code.replace("sampler.wrap(dataset)", "dataset"), 4)
