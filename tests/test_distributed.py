"""A real multi-process run: 4 ranks (torch.multiprocessing spawn, gloo on CPU) each build the sampler."""

from __future__ import annotations

import os
import tempfile
from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnibal_kernels import PlanOptions
from omnibal_kernels.testing.processes import free_port

WORLD_SIZE = 4
NUM_SAMPLES = 3000
STOP_AT = 11  # micro-steps consumed before the state is saved


def _subset():
    from omnibal_kernels.lengths import default_lengths

    lengths = default_lengths()
    return lengths[np.random.default_rng(1).choice(len(lengths), NUM_SAMPLES, replace=False)]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        from omnibal_kernels.sampler import BalancedBatchSampler

        lengths = _subset()
        # world_size and rank come from torch.distributed
        sampler = BalancedBatchSampler(lengths, PlanOptions(seed=11), micro_steps_per_step=2)
        assert (sampler.world_size, sampler.rank) == (WORLD_SIZE, rank)
        sampler.set_epoch(1)
        prints = [None] * WORLD_SIZE
        dist.all_gather_object(prints, sampler.fingerprint())
        batches = list(sampler)
        gathered = [None] * WORLD_SIZE
        dist.all_gather_object(gathered, batches)
        report = sampler.report()

        # resume: a fresh sampler (as after a restart) continues from a state saved mid-epoch
        run = BalancedBatchSampler(lengths, PlanOptions(seed=11), micro_steps_per_step=2)
        run.set_epoch(1)
        it = iter(run)
        head = [next(it) for _ in range(STOP_AT)]
        state = run.state_dict()
        states = [None] * WORLD_SIZE
        dist.all_gather_object(states, state)
        restarted = BalancedBatchSampler(lengths, PlanOptions(seed=11), micro_steps_per_step=2)
        restarted.load_state_dict(states[0])  # rank 0's checkpoint serves every rank
        restarted.set_epoch(1)
        tail = list(restarted)
        if rank == 0:
            torch.save(
                {
                    "prints": prints,
                    "gathered": gathered,
                    "dropped": report.dropped_samples.tolist(),
                    "duplicated": report.duplicated_samples.tolist(),
                    "states": states,
                },
                os.path.join(out_dir, "rank0.pt"),
            )
        torch.save({"batches": batches, "resumed": head + tail}, os.path.join(out_dir, f"resume{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_four_gloo_ranks_agree_cover_and_resume():
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_worker, args=(free_port(), out_dir), nprocs=WORLD_SIZE, start_method="spawn", join=True)
        result = torch.load(os.path.join(out_dir, "rank0.pt"), weights_only=False)
        resumes = [torch.load(os.path.join(out_dir, f"resume{r}.pt"), weights_only=False) for r in range(WORLD_SIZE)]

    assert len(set(result["prints"])) == 1, result["prints"]
    assert len({s["plan_fingerprint"] for s in result["states"]}) == 1
    assert len({s["micro_steps"] for s in result["states"]}) == 1
    gathered = result["gathered"]
    assert len({len(b) for b in gathered}) == 1

    counts = Counter(i for batches in gathered for batch in batches for i in batch)
    expected = Counter(range(NUM_SAMPLES))
    expected.subtract(result["dropped"])
    expected.update(result["duplicated"])
    assert counts == +expected

    for rank, r in enumerate(resumes):
        assert r["batches"] == gathered[rank]
        assert r["resumed"] == r["batches"], f"rank {rank} resumed differently"
