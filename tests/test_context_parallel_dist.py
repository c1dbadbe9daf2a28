"""context_parallel_attention over real process groups: forward and gradients equal unsharded varlen attention.

Each run spawns ``world`` processes (gloo on CPU; NCCL with two or more GPUs). Every rank shards the same
batch (mixed long and short sequences, grouped-query heads) under every strategy, runs its attention with the
real all-to-all, back-propagates a fixed output gradient, and saves its outputs and q/k/v gradients; the test
puts them back in packed order and compares them with ``varlen_attention`` on the whole batch. With 4 and 8
processes, CP groups of two ranks inside the world run the same cases through ``group=``.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnibal_kernels.context_parallel import ContextParallelOptions

LENGTHS = [700, 3, 1, 150, 45, 1200, 17, 2, 380]
HEADS, KV_HEADS, DIM = 4, 2, 8
CASES = [
    ("zigzag", False),
    ("zigzag", True),
    ("per_document", False),
    ("hybrid", False),
    ("contiguous", False),
    ("auto", False),
]


def _inputs():
    """The batch (the fields shard_for_context_parallel reads, built without numba) and q, k, v, dout."""
    g = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    ids = torch.randint(1, 100, (1, total), generator=g)
    labels = ids.clone()
    labels[0, cu[:-1].long()] = -100
    batch = {"input_ids": ids, "labels": labels, "cu_seqlens": cu, "max_seqlen": max(LENGTHS)}
    q = torch.randn(total, HEADS, DIM, generator=g)
    k = torch.randn(total, KV_HEADS, DIM, generator=g)
    v = torch.randn(total, KV_HEADS, DIM, generator=g)
    dout = torch.randn(total, HEADS, DIM, generator=g)
    return batch, q, k, v, dout


def _attend(batch, q, k, v, dout, context_parallel_size: int, cp_rank: int, group, device) -> dict:
    """Every case's outputs and q/k/v gradients on this rank of a CP group of ``context_parallel_size``."""
    from omnibal_kernels.context_parallel import context_parallel_attention, shard_for_context_parallel

    results = {}
    for strategy, pad in CASES:
        shard = shard_for_context_parallel(
            batch, ContextParallelOptions(size=context_parallel_size, strategy=strategy, pad_sequences=pad)
        )[cp_rank].to(device)
        rows = shard.indices.clamp(min=0)
        real = (shard.indices >= 0).to(q.dtype)[:, None, None]
        ql, kl, vl = (x.to(device).index_select(0, rows).requires_grad_() for x in (q, k, v))
        out = context_parallel_attention(ql, kl, vl, shard, group)
        # padding queries (Megatron padding) contribute no loss
        (out * dout.to(device).index_select(0, rows) * real).sum().backward()
        results[strategy, pad] = [t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)]
    return results


def _worker(rank: int, world: int, init: str, out_dir: str, backend: str) -> None:
    torch.set_num_threads(1)  # the machine may have fewer cores than ranks
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        inputs = _inputs()
        results = {world: _attend(*inputs, world, rank, None, device)}
        if world > 2:
            # CP groups of two ranks inside the world: the group argument, several groups at once
            pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
            results[2] = _attend(*inputs, 2, rank % 2, pairs[rank // 2], device)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, backend: str = "gloo") -> None:
    from omnibal_kernels.attention import varlen_attention
    from omnibal_kernels.context_parallel import shard_for_context_parallel

    with tempfile.TemporaryDirectory() as out_dir:
        init = "file://" + os.path.join(out_dir, "init")
        mp.start_processes(_worker, args=(world, init, out_dir, backend), nprocs=world, start_method="spawn")
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]
    batch, q, k, v, dout = _inputs()
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    ref = varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])
    (ref * dout).sum().backward()
    expected = [ref.detach(), q.grad, k.grad, v.grad]
    groups = [(world, [list(range(world))])] + ([(2, [[r, r + 1] for r in range(0, world, 2)])] if world > 2 else [])
    for context_parallel_size, members in groups:
        for case in CASES:
            shards = shard_for_context_parallel(
                batch, ContextParallelOptions(size=context_parallel_size, strategy=case[0], pad_sequences=case[1])
            )
            for group in members:
                for i, name in enumerate(("out", "dq", "dk", "dv")):
                    got = shards.restore([ranks[r][context_parallel_size][case][i] for r in group])
                    where = f"ranks {group}, {case} {name}"
                    torch.testing.assert_close(
                        got, expected[i], rtol=1e-5, atol=1e-5, msg=lambda m, where=where: f"{where}: {m}"
                    )


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_forward_and_gradients_equal_unsharded(world):
    _run(world)


@pytest.mark.slow
def test_gloo_eight_ranks():
    _run(8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_two_ranks():
    _run(2, "nccl")


def test_wrong_group_is_an_error():
    from omnibal_kernels.context_parallel import context_parallel_attention, shard_for_context_parallel

    batch, q, k, v, _ = _inputs()
    shard = shard_for_context_parallel(batch, ContextParallelOptions(size=2, strategy="zigzag"))[0]
    n = shard.num_tokens
    with pytest.raises(ValueError, match="not initialized"):
        context_parallel_attention(q[:n], k[:n], v[:n], shard)
    with pytest.raises(ValueError, match="tokens"):
        context_parallel_attention(q, k, v, shard)
