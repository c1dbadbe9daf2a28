"""Vision-language models under context parallelism over real gloo process groups.

Every rank builds its batch with ``PackCollator.for_model(model, context_parallel=...)``, prepares a tiny random
transformers model with ``apply_context_parallel`` and runs ``model(**batch)`` and ``backward``; the ranks'
losses and their gradients, summed over the group, must equal the unsharded packed model's (vision tower
included) within 1e-5 in float32, for Qwen2-VL, Qwen2.5-VL (window attention) and InternVL, on packs mixing
images, videos and text-only samples, under every strategy: among them a placeholder run cut by a shard
boundary, a rank holding no placeholder, and a rank encoding no image. One spawn per world size runs every
case; the tests read its results.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import omnibal_kernels as ok
from omnibal_kernels.context_parallel import ContextParallelOptions
from omnibal_kernels.testing.hf_models import config, internvl_sample, qwen_sample, text_ids, tiny_model

MODELS = ["qwen2_vl", "qwen2_5_vl", "internvl", "llama"]
STRATEGIES = ["zigzag", "per_document", "hybrid", "contiguous", "auto"]
PACKS = ["mixed", "text_first", "cut_image"]


def _text(rng: np.random.Generator, n: int) -> dict[str, torch.Tensor]:
    ids = torch.tensor(text_ids(rng, n))
    return {"input_ids": ids, "labels": ids.clone()}


def pack(model: str, name: str) -> list[dict[str, Any]]:
    """The samples of pack ``name`` for ``model``: ``mixed`` (images, a video, text only), ``text_first`` (a
    long text sample, then one image: under ``contiguous`` rank 0 holds no placeholder and encodes nothing),
    ``cut_image`` (one image whose placeholder run the ``contiguous`` boundary cuts)."""
    rng = np.random.default_rng(PACKS.index(name))
    torch.manual_seed(PACKS.index(name))
    if model == "llama":  # a text model through the same entry point
        return [_text(rng, 40), _text(rng, 3), _text(rng, 90), _text(rng, 1 + PACKS.index(name))]
    if model == "internvl":
        if name == "mixed":
            return [internvl_sample(rng, 2), _text(rng, 9), internvl_sample(rng, 3), internvl_sample(rng, 1)]
        if name == "text_first":
            return [_text(rng, 40), internvl_sample(rng, 1)]
        return [_text(rng, 4), internvl_sample(rng, 2)]
    if name == "mixed":
        return [
            qwen_sample(rng, [(1, 4, 8), (1, 2, 2)]),
            qwen_sample(rng, [], [(2, 4, 4)], seconds=[1.0]),
            _text(rng, 20),
            qwen_sample(rng, [(1, 2, 4)]),
        ]
    if name == "text_first":
        return [_text(rng, 40), qwen_sample(rng, [(1, 4, 4)])]
    return [_text(rng, 4), qwen_sample(rng, [(1, 4, 8)])]


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


def _options(size: int, strategy: str) -> ContextParallelOptions:
    if strategy == "zigzag_padded":  # Megatron padding: models with 1-D positions only
        return ContextParallelOptions(size=size, strategy="zigzag", pad_sequences=True)
    return ContextParallelOptions(size=size, strategy=strategy)


def _train(name: str, world: int, rank: int, group: Any, cases: list[tuple[str, str]]) -> dict:
    from omnibal_kernels.context_parallel import apply_context_parallel

    model = apply_context_parallel(tiny_model(name), group)
    out = {}
    for pack_name, strategy in cases:
        collate = ok.PackCollator.for_model(
            model, context_parallel=_options(world, strategy), context_parallel_rank=rank, warmup=False
        )
        model.zero_grad()
        loss = model(**collate(pack(name, pack_name))).loss
        loss.backward()
        both = torch.cat([loss.detach().reshape(1), _grads(model)])
        dist.all_reduce(both, group=group)
        out[name, pack_name, strategy] = both
        out[name, pack_name, strategy, "no_grad"] = {n for n, p in model.named_parameters() if p.grad is None}
    return out


def _exchange(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """exchange_vision_rows alone: every feature row a leaf, a weighted sum of the routed rows backward."""
    from omnibal_kernels.context_parallel import exchange_vision_rows

    table, weights = _exchange_inputs()
    vision = _collate("qwen2_vl", "mixed", 2, "zigzag", rank)["context_parallel_shard"].vision
    units = vision.work.units
    mine = vision.units.numpy()
    rows = [
        np.arange(units.feature_start[u], units.feature_start[u] + units.feature_rows[u]) + k * 1000
        for k in (0, 1)
        for u in mine[units.kind[mine] == k]
    ]
    own = table.index_select(0, torch.from_numpy(np.concatenate(rows))).requires_grad_()
    routed = exchange_vision_rows(own, vision)
    (routed * weights[: routed.shape[0]]).sum().backward()
    return routed.detach(), own.grad


def _exchange_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(2000, 5, generator=g), torch.randn(64, 5, generator=g)


def _collate(name: str, pack_name: str, size: int, strategy: str, rank: int) -> Any:
    collate = ok.PackCollator.for_model(
        config(name), context_parallel=_options(size, strategy), context_parallel_rank=rank, warmup=False
    )
    return collate(pack(name, pack_name))


def _cases(world: int) -> dict[str, list[tuple[str, str]]]:
    if world == 2:
        padded = {"internvl": [(p, "zigzag_padded") for p in PACKS], "llama": [("mixed", "zigzag_padded")]}
        return {name: [(p, s) for p in PACKS for s in STRATEGIES] + padded.get(name, []) for name in MODELS}
    return {name: [("mixed", "zigzag"), ("mixed", "hybrid"), ("cut_image", "contiguous")] for name in MODELS}


def _errors(rank: int) -> list[str]:
    """The messages of a batch for a group of another size and of a batch from another collator."""
    from omnibal_kernels.context_parallel import apply_context_parallel

    model = apply_context_parallel(tiny_model("qwen2_vl"))
    options = ok.PackCollator.for_model(model, warmup=False).options
    replicating = ok.PackCollator(options, context_parallel=_options(2, "zigzag"), context_parallel_rank=rank)
    messages = []
    for batch in (
        _collate("qwen2_vl", "mixed", 4, "zigzag", rank),
        ok.PackCollator.for_model(model, warmup=False)(pack("qwen2_vl", "mixed")),
        replicating(pack("qwen2_vl", "mixed")),
    ):
        try:
            model(**batch)
        except ValueError as e:
            messages.append(str(e))
    return messages


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        results: dict[str, Any] = {}
        for name, cases in _cases(world).items():
            results.update(_train(name, world, rank, None, cases))
        if world == 2:
            results["exchange"] = _exchange(rank)
            results["errors"] = _errors(rank)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@functools.cache
def _run(world: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        init = "file://" + os.path.join(out_dir, "init")
        mp.start_processes(_worker, args=(world, init, out_dir), nprocs=world, start_method="spawn")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]


@functools.cache
def _reference(name: str, pack_name: str) -> tuple[torch.Tensor, set[str]]:
    """The unsharded packed model's loss and gradients (sdpa attention, one process), and the parameters
    without a gradient."""
    model = tiny_model(name)
    loss = model(**ok.PackCollator.for_model(model, warmup=False)(pack(name, pack_name))).loss
    loss.backward()
    unused = {n for n, p in model.named_parameters() if p.grad is None}
    return torch.cat([loss.detach().reshape(1), _grads(model)]), unused


def _check(world: int) -> None:
    ranks = _run(world)
    for name, cases in _cases(world).items():
        for pack_name, strategy in cases:
            got, (want, unused) = ranks[0][name, pack_name, strategy], _reference(name, pack_name)
            where = f"{name}, {pack_name}, {strategy}, {world} ranks"
            for r in range(world):  # every parameter the model uses has a gradient on every rank (DDP needs it)
                assert ranks[r][name, pack_name, strategy, "no_grad"] <= unused, where
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg=lambda m, w=where: f"{w} loss: {m}")
            torch.testing.assert_close(got[1:], want[1:], rtol=1e-5, atol=1e-5, msg=lambda m, w=where: f"{w}: {m}")


@pytest.mark.slow
def test_two_ranks_train_the_unsharded_packed_models_loss_and_gradients():
    _check(2)


@pytest.mark.slow
def test_four_ranks_train_the_unsharded_packed_models_loss_and_gradients():
    _check(4)


def test_the_packs_hold_the_cases_they_name():
    for name in ("qwen2_vl", "internvl"):
        text_first = [_collate(name, "text_first", 2, "contiguous", r)["context_parallel_shard"] for r in (0, 1)]
        assert text_first[0].vision.image_rows == 0 and text_first[0].vision.units.numel() == 0
        cut = [_collate(name, "cut_image", 2, "contiguous", r)["context_parallel_shard"].vision for r in (0, 1)]
        assert cut[0].image_rows > 0 and cut[1].image_rows > 0  # one run, cut by the boundary
        assert cut[0].group_exchanges
        if name == "qwen2_vl":  # its one image: the other rank encodes nothing and receives rows
            assert min(v.units.numel() for v in cut) == 0
    mixed = _collate("qwen2_5_vl", "mixed", 2, "zigzag", 0)["context_parallel_shard"].vision
    assert set(mixed.work.units.kind.tolist()) == {0, 1}
    padded = [_collate("internvl", p, 2, "zigzag_padded", 0)["context_parallel_shard"] for p in PACKS]
    assert any(bool((s.indices < 0).any()) for s in padded)  # Megatron padding tokens among the shards


@pytest.mark.slow
def test_the_exchange_delivers_rows_and_returns_their_gradients():
    ranks = _run(2)
    table, weights = _exchange_inputs()
    grad = torch.zeros_like(table)
    for rank in (0, 1):
        batch = _collate("qwen2_vl", "mixed", 2, "zigzag", rank)
        shard = batch["context_parallel_shard"]
        ids = ok.PackCollator.for_model(config("qwen2_vl"), warmup=False)(pack("qwen2_vl", "mixed"))["input_ids"][0]
        rows = []
        for k, token in enumerate((config("qwen2_vl").image_token_id, config("qwen2_vl").video_token_id)):
            where = torch.nonzero(ids == token).flatten()
            held = shard.indices[torch.isin(shard.indices, where)]
            rows.append(torch.searchsorted(where, held) + 1000 * k)
        rows = torch.cat(rows)
        routed, _ = ranks[rank]["exchange"]
        torch.testing.assert_close(routed, table[rows], rtol=0, atol=0)
        grad.index_add_(0, rows, weights[: rows.numel()])
    for rank in (0, 1):
        vision = _collate("qwen2_vl", "mixed", 2, "zigzag", rank)["context_parallel_shard"].vision
        units, mine = vision.work.units, vision.units.numpy()
        own = np.concatenate(
            [
                np.arange(units.feature_start[u], units.feature_start[u] + units.feature_rows[u]) + 1000 * k
                for k in (0, 1)
                for u in mine[units.kind[mine] == k]
            ]
        )
        torch.testing.assert_close(ranks[rank]["exchange"][1], grad[torch.from_numpy(own)], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_batch_for_another_group_or_from_another_collator_is_refused():
    """A shard for 4 ranks on a group of 2, a whole pack, and a shard whose pixels are the pack's (the generic
    collator copies them to every rank) each fail before the forward runs."""
    for rank, messages in enumerate(r["errors"] for r in _run(2)):
        assert len(messages) == 3
        assert f"rank {rank}'s shard for a group of 4" in messages[0] and "group of 2" in messages[0]
        assert "no context_parallel_shard" in messages[1] and "another collator" in messages[1]
        assert "no vision routing" in messages[2]


def test_an_unroutable_model_class_is_named():
    from omnibal_kernels.context_parallel import apply_context_parallel

    class LlavaLike(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Config", (), {"model_type": "llava", "vision_config": object()})()

        def forward(self, input_ids=None, labels=None, position_ids=None, pixel_values=None):  # noqa: ARG002
            return None

    with pytest.raises(ValueError, match="LlavaLike.*'llava'"):
        apply_context_parallel(LlavaLike())
    with pytest.raises(TypeError, match="transformers model"):
        apply_context_parallel(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="not initialized"):
        apply_context_parallel(tiny_model("qwen2_vl"))
