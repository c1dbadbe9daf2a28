"""Adapters: Megatron THD parameters, ring-flash-attention's zigzag varlen inputs, a transformers model per rank.

Megatron and ring-flash-attention need CUDA builds that CI does not have; their inputs are checked against the
conventions they document (a plain reference of what ``zigzag_ring_flash_attn_varlen_func`` computes from its
local inputs). The transformers test runs a tiny random Llama on two gloo ranks through
``context_parallel_attention`` and compares loss, logits and gradients with the samples run one at a time.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnibal_kernels.attention import varlen_attention
from omnibal_kernels.context_parallel import (
    ContextParallelOptions,
    megatron_thd_params,
    ring_flash_attn_inputs,
    shard_for_context_parallel,
)

LENGTHS = [7, 11, 5, 16, 1]


def _batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    ids = torch.randint(1, 60, (1, int(cu[-1])), generator=g)
    labels = ids.clone()
    labels[0, cu[:-1].long()] = -100
    return {"input_ids": ids, "labels": labels, "cu_seqlens": cu, "max_seqlen": max(lengths)}


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_megatron_thd_params(cp):
    shards = shard_for_context_parallel(
        _batch(LENGTHS), ContextParallelOptions(size=cp, strategy="zigzag", pad_sequences=True)
    )
    params = megatron_thd_params(shards)
    padded = [-(-n // (2 * cp)) * 2 * cp for n in LENGTHS]
    assert params["qkv_format"] == "thd"
    assert params["cu_seqlens_q"].tolist() == params["cu_seqlens_kv"].tolist() == [0, *np.cumsum(LENGTHS)]
    assert params["cu_seqlens_q_padded"].tolist() == params["cu_seqlens_kv_padded"].tolist() == [0, *np.cumsum(padded)]
    assert params["cu_seqlens_q"].dtype == torch.int32
    assert params["max_seqlen_q"] == params["max_seqlen_kv"] == max(padded)
    # each rank holds chunk r, then chunk 2cp-1-r, of every padded sequence (Transformer Engine's THD split)
    for r, shard in enumerate(shards):
        assert shard.num_tokens == sum(padded) // cp
        starts = np.cumsum([0, *LENGTHS])
        expect = []
        for s, n in enumerate(LENGTHS):
            c = padded[s] // (2 * cp)
            for chunk in (r, 2 * cp - 1 - r):
                expect += [int(starts[s]) + p if p < n else -1 for p in range(chunk * c, (chunk + 1) * c)]
        assert shard.indices.tolist() == expect
        pad = shard.indices < 0
        assert (shard.batch["labels"][0][pad] == -100).all() and (shard.batch["input_ids"][0][pad] == 0).all()


def test_adapters_need_megatron_padded_zigzag():
    for strategy, pad in (("zigzag", False), ("hybrid", False)):
        shards = shard_for_context_parallel(
            _batch(LENGTHS), ContextParallelOptions(size=2, strategy=strategy, pad_sequences=pad)
        )
        with pytest.raises(ValueError, match="pad_sequences=True"):
            megatron_thd_params(shards)
        with pytest.raises(ValueError, match="pad_sequences=True"):
            ring_flash_attn_inputs(shards, 0)
    shards = shard_for_context_parallel(
        _batch(LENGTHS), ContextParallelOptions(size=2, strategy="zigzag", pad_sequences=True)
    )
    with pytest.raises(ValueError, match="rank"):
        ring_flash_attn_inputs(shards, 2)


def _zigzag_ring_reference(qs, ks, vs, local_cu, cp):
    """What zigzag_ring_flash_attn_varlen_func computes on every rank, from its documented inputs: rank r's
    local segment i holds, in its first half, chunk r and, in its second half, chunk 2cp-1-r of sequence i."""
    outs = [torch.zeros_like(q) for q in qs]
    for i in range(len(local_cu) - 1):
        m = local_cu[i + 1] - local_cu[i]
        c = m // 2
        length = m * cp
        q_full, k_full, v_full = (torch.zeros(length, *x[0].shape[1:]) for x in (qs, ks, vs))
        where = []
        for r in range(cp):
            pos = torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * cp - 1 - r) * c, (2 * cp - r) * c)])
            rows = torch.arange(local_cu[i], local_cu[i + 1])
            q_full[pos], k_full[pos], v_full[pos] = qs[r][rows], ks[r][rows], vs[r][rows]
            where.append((pos, rows))
        group = q_full.shape[1] // k_full.shape[1]
        k_rep, v_rep = k_full.repeat_interleave(group, 1), v_full.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q_full, k_rep) / math.sqrt(q_full.shape[-1])
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        full = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v_rep)
        for r, (pos, rows) in enumerate(where):
            outs[r][rows] = full[pos]
    return outs


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ring_flash_attn_inputs_follow_its_convention(cp):
    batch = _batch([37, 64, 3, 100])
    total = batch["input_ids"].shape[1]
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(total, 4, 8, generator=g),
        torch.randn(total, 2, 8, generator=g),
        torch.randn(total, 2, 8, generator=g),
    )
    shards = shard_for_context_parallel(batch, ContextParallelOptions(size=cp, strategy="zigzag", pad_sequences=True))
    inputs = [ring_flash_attn_inputs(shards, r) for r in range(cp)]
    local_cu = inputs[0]["cu_seqlens"].tolist()
    assert all(x["cu_seqlens"].tolist() == local_cu and x["causal"] is True for x in inputs)
    assert inputs[0]["max_seqlen"] == max(np.diff(local_cu))
    assert inputs[0]["cu_seqlens"].dtype == torch.int32
    # padding rows: zero queries and keys (they sit after every real token, so no real query sees them)
    rows = [s.indices.clamp(min=0) for s in shards]
    real = [(s.indices >= 0)[:, None, None] for s in shards]
    qs, ks, vs = ([x[r] * m for r, m in zip(rows, real)] for x in (q, k, v))
    outs = _zigzag_ring_reference(qs, ks, vs, local_cu, cp)
    ref = varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])
    torch.testing.assert_close(shards.restore(outs), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# a transformers Llama run per rank

SAMPLES = [500, 40, 7, 180, 2, 95]  # the 500 is over half the tokens: every strategy cuts it


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.5,
    )  # sharp attention, so that wrong positions show
    return LlamaForCausalLM(config).float()


def _grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _llama_worker(rank: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        from omnibal_kernels.context_parallel import register_transformers_attention

        model = _llama()
        model.set_attn_implementation(register_transformers_attention())
        batch = _batch(SAMPLES, seed=3)
        results = {}
        for strategy in ("zigzag", "hybrid"):
            shards = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy=strategy))
            shard = shards[rank]
            model.zero_grad()
            out = model(**shard.batch, context_parallel_shard=shard, num_items_in_batch=shards.num_items_in_batch)
            out.loss.backward()
            grads = _grads(model)
            dist.all_reduce(grads)
            loss = out.loss.detach().clone()
            dist.all_reduce(loss)
            # controls: the model's own shift pairs neighbours of different chunks; local positions skew RoPE
            fields = {k: v for k, v in shard.batch.items() if k != "shift_labels"}
            unshifted = model(**fields, context_parallel_shard=shard, num_items_in_batch=shards.num_items_in_batch)
            local = {**shard.batch, "position_ids": torch.arange(shard.num_tokens)[None]}
            skewed = model(**local, context_parallel_shard=shard, num_items_in_batch=shards.num_items_in_batch)
            control = unshifted.loss.detach().clone()
            dist.all_reduce(control)
            results[strategy] = (loss, out.logits.detach(), grads, control, skewed.logits.detach())
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_transformers_llama_on_two_ranks_equals_unsharded():
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _llama_worker, args=("file://" + os.path.join(out_dir, "init"), out_dir), nprocs=2, start_method="spawn"
        )
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    # reference: every sample alone, default attention, transformers' own shift and loss
    model = _llama()
    batch = _batch(SAMPLES, seed=3)
    cu = batch["cu_seqlens"].tolist()
    items = sum(len(range(cu[i] + 1, cu[i + 1])) for i in range(len(SAMPLES)))
    loss, logits = 0.0, []
    for i in range(len(SAMPLES)):
        ids = batch["input_ids"][:, cu[i] : cu[i + 1]]
        out = model(input_ids=ids, labels=ids, num_items_in_batch=items)
        loss = loss + out.loss
        logits.append(out.logits[0])
    loss.backward()
    loss = loss.detach()
    ref_grads, ref_logits = _grads(model), torch.cat(logits).detach()
    for strategy in ("zigzag", "hybrid"):
        shards = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy=strategy))
        assert shards.num_items_in_batch == items
        assert (np.bincount(shards.layout.seq) > 1).any()
        got_loss, _, got_grads, control, _ = ranks[0][strategy]
        torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ranks[1][strategy][0], loss, rtol=1e-5, atol=1e-6)
        got_logits = shards.restore([ranks[r][strategy][1] for r in range(2)], dim=1)[0]
        torch.testing.assert_close(got_logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_grads, ref_grads, rtol=1e-5, atol=1e-6)
        # the controls do differ: without shift_labels the loss, with positions in local order the logits
        # (a few dozen of the batch's targets are wrong then: ten times the tolerance above, not more)
        assert abs(float(control - loss)) > 10 * 1e-5 * float(loss)
        skewed = shards.restore([ranks[r][strategy][4] for r in range(2)], dim=1)[0]
        assert float((skewed - ref_logits).abs().max()) > 1e-2
