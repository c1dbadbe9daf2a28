"""Train a tiny vision-language model on balanced packs, on CPU, alone or under torchrun (gloo).

    python examples/train_tiny_vlm.py --steps 4
    torchrun --nproc-per-node 2 examples/train_tiny_vlm.py --steps 4

Samples are synthetic (random pixels, random tokens, random weights) but their sizes follow the bundled
InternVL-Chat SFT loads (``omnibal_kernels.lengths.default_lengths()``) scaled by 1/16: a real 448px tile
(256 LLM tokens) becomes a 16x16 tile of 16 4x4 patches (16 LLM tokens), and the text tokens are divided
by 16 as well. The path is the real one:

    BalancedBatchSampler -> DataLoader(sampler.wrap(dataset), batch_sampler=sampler, num_workers=2,
    pin_memory=True) -> PackCollator (text and tiles, every sample checked against its length entry) in the
    workers -> ViT over tiles (varlen_attention, one sequence per tile) -> image embeddings scattered into the
    token embeddings -> causal LM (varlen_attention per sample) -> step_loss.

The distributed setup: under torchrun the process group is initialized before the sampler is built (the sampler
refuses WORLD_SIZE > 1 without one), and the sampler takes world size and rank from it. The lengths carry each
sample's label tokens, so every batch knows its optimizer step's label tokens over all ranks and micro-steps
(``num_items_in_batch``) from the plan: ``step_loss`` is the micro-step's share of the step's token mean, and
``(loss * world_size).backward()`` under DDP (which averages gradients) gives exactly the gradient of that mean,
with no communication beyond DDP's own.

Every rank builds the same plan on its own; rank 0 prints each optimizer step's loss (the token mean over all
ranks, summed for the printout), the planned per-rank loads, the measured tokens/s and the epoch's balance
report.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from omnibal_kernels import BalancedBatchSampler, PackCollator, PlanOptions, step_loss
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.testing.tiny_vlm import TinyVLM, make_sample, scaled_lengths


class SyntheticVLMData(torch.utils.data.Dataset):
    """Sample ``i``: ``tiles[i]`` random tiles and ``llm[i]`` tokens, image placeholders first (no loss on them)."""

    def __init__(self, lengths: Lengths, seed: int) -> None:
        self.lengths, self.seed = lengths, seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return make_sample(self.lengths, i, self.seed)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps to train")
    parser.add_argument("--micro-steps", type=int, default=2, help="micro-steps (accumulation) per optimizer step")
    parser.add_argument("--num-samples", type=int, default=1024, help="samples drawn from the bundled loads")
    parser.add_argument("--target-batch-size", type=float, default=4.0, help="mean samples per pack")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")  # before the sampler: it takes world size and rank from the group
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    # pin_memory=True is what a GPU run uses; on a CPU-only machine it is a no-op that warns
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")

    lengths = scaled_lengths(args.num_samples, args.seed)  # tiles, tokens and label tokens per sample
    dataset = SyntheticVLMData(lengths, args.seed)
    sampler = BalancedBatchSampler(
        lengths,
        PlanOptions(target_batch_size=args.target_batch_size, seed=args.seed),
        micro_steps_per_step=args.micro_steps,
        dataset=dataset,
    )
    loader = torch.utils.data.DataLoader(
        sampler.wrap(dataset),
        batch_sampler=sampler,
        collate_fn=PackCollator(),
        num_workers=args.workers,
        pin_memory=True,
    )
    model = TinyVLM(hidden=64, vit_hidden=32)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    planned_vit, planned_llm, _ = sampler.micro_step_loads()
    m = args.micro_steps
    if rank == 0:
        qv, qt = sampler.capacities[0]
        print(
            f"ranks {world_size}, {len(lengths)} samples, capacities {qv} tiles / {qt} tokens, "
            f"{len(sampler) // m} optimizer steps of {m} micro-steps in the epoch"
        )

    tokens_done, losses, start = 0, [], time.perf_counter()
    step, step_share = 0, 0.0
    for micro, batch in enumerate(loader):
        last_micro = micro % m == m - 1
        sync = contextlib.nullcontext() if (last_micro or not distributed) else model.no_sync()
        with sync:
            logits = model(**batch)
            # this micro-step's share of the token mean over the optimizer step (all ranks and micro-steps);
            # DDP averages gradients over the ranks, so the world_size factor makes the sum
            loss = step_loss(logits, batch)
            (loss * world_size).backward()
        tokens_done += int(batch["input_ids"].shape[1])
        step_share += float(loss.detach())
        if not last_micro:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = torch.tensor([step_share], dtype=torch.float64)
        if distributed:
            dist.all_reduce(mean)  # for the printout only: the shares of all ranks add up to the step's mean
        losses.append(float(mean))
        step_share = 0.0
        if rank == 0:
            rows = slice(step * m, step * m + m)
            print(
                f"step {step}: loss {losses[-1]:.3f}  tiles per rank "
                f"{planned_vit[rows].sum(axis=0).tolist()}  tokens per rank {planned_llm[rows].sum(axis=0).tolist()}"
            )
        step += 1
        if step >= args.steps:
            break
    seconds = time.perf_counter() - start
    total_tokens = torch.tensor([tokens_done], dtype=torch.int64)
    if distributed:
        dist.all_reduce(total_tokens)
    report = sampler.report()
    if rank == 0:
        print(
            f"{step} steps, {int(total_tokens)} tokens in {seconds:.2f} s: "
            f"{int(total_tokens) / seconds:.0f} tokens/s over {world_size} rank(s)"
        )
        print(
            "balance:",
            {k: (round(v, 5) if isinstance(v, float) else v) for k, v in report.to_dict().items() if k != "groups"},
        )
    if distributed:
        dist.destroy_process_group()
    assert all(math.isfinite(x) for x in losses)
    return {"steps": step, "tokens": int(total_tokens), "losses": losses, "report": report}


if __name__ == "__main__":
    main()
