"""Train a tiny vision-language model on balanced packs, on CPU, alone or under torchrun (gloo).

    python examples/train_tiny_vlm.py --steps 4
    torchrun --nproc-per-node 2 examples/train_tiny_vlm.py --steps 4

Samples are synthetic (random pixels, random tokens, random weights) but their sizes follow the bundled
InternVL-Chat SFT loads (``omnibal_kernels.lengths.default_lengths()``) scaled by 1/16: a real 448px tile
(256 LLM tokens) becomes a 16x16 tile of 16 4x4 patches (16 LLM tokens), and the text tokens are divided
by 16 as well. The path is the real one:

    BalancedBatchSampler -> DataLoader(num_workers=2, pin_memory=True, batch_sampler=...) -> pack_batch
    (text and tiles) in the workers -> ViT over tiles (varlen_attention, one sequence per tile) ->
    image embeddings scattered into the token embeddings -> causal LM (varlen_attention per sample).

Every rank builds the same plan on its own; rank 0 prints each optimizer step's planned per-rank loads, the
measured tokens/s and the epoch's balance report.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
import warnings
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from omnibal_kernels import BalancedBatchSampler, pack_batch, varlen_attention
from omnibal_kernels.lengths import Lengths, default_lengths
from omnibal_kernels.testing.models import RMSNorm, TinyBlock, causal_lm_loss

TILE = 16  # tile side in pixels (a 448px tile, scaled down)
PATCH = 4  # patch side: 16 patches per tile
PATCHES_PER_TILE = (TILE // PATCH) ** 2
SCALE = 16  # a real tile is 256 LLM tokens, here PATCHES_PER_TILE = 256 / SCALE
REAL_TOKENS_PER_TILE = 256
VOCAB = 128
IMAGE_TOKEN = VOCAB - 1  # placeholder id where image embeddings go


def scaled_lengths(num_samples: int, seed: int) -> Lengths:
    """A seeded subset of the bundled loads, scaled by 1/SCALE: ``vit`` tiles, ``llm`` tokens."""
    real = default_lengths()
    pick = np.sort(np.random.default_rng(seed).choice(len(real), num_samples, replace=False))
    tiles = real.vit[pick]
    text = np.maximum(real.llm[pick] - REAL_TOKENS_PER_TILE * tiles, 0)
    llm = tiles * PATCHES_PER_TILE + np.ceil(text / SCALE).astype(np.int64) + 1
    return Lengths(tiles, llm)


class SyntheticVLMData(torch.utils.data.Dataset):
    """Sample ``i``: ``tiles[i]`` random tiles and ``llm[i]`` tokens, image placeholders first."""

    def __init__(self, lengths: Lengths, seed: int = 0) -> None:
        self.lengths, self.seed = lengths, seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        tiles, tokens = int(self.lengths.vit[i]), int(self.lengths.llm[i])
        num_image_tokens = tiles * PATCHES_PER_TILE
        text = torch.randint(0, VOCAB - 1, (tokens - num_image_tokens,), generator=g)
        input_ids = torch.cat([torch.full((num_image_tokens,), IMAGE_TOKEN), text])
        labels = input_ids.clone()
        labels[:num_image_tokens] = -100  # no loss on image positions
        return {"input_ids": input_ids, "labels": labels,
                "pixel_values": torch.randn(tiles, 3, TILE, TILE, generator=g)}


class TinyViTBlock(nn.Module):
    """Pre-norm bidirectional attention + MLP over packed patches; each tile attends only to itself."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        # x: (total_patches, hidden)
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.head_dim).unbind(1)
        x = x + self.proj(varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=False).flatten(1))
        return x + self.mlp(self.norm2(x))


class TinyVLM(nn.Module):
    """Patch embedding + ViT blocks -> projector -> image embeddings in place of IMAGE_TOKEN -> decoder."""

    def __init__(self, vit_hidden: int = 32, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, vit_hidden, kernel_size=PATCH, stride=PATCH)
        self.vit_pos = nn.Parameter(torch.zeros(PATCHES_PER_TILE, vit_hidden))
        self.vit_blocks = nn.ModuleList(TinyViTBlock(vit_hidden, 4) for _ in range(layers))
        self.projector = nn.Sequential(nn.LayerNorm(vit_hidden), nn.Linear(vit_hidden, hidden))
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(TinyBlock(hidden, 4, 2, 2 * hidden, 10000.0) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                max_seqlen: int, pixel_values: torch.Tensor | None = None,
                vit_cu_seqlens: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """input_ids/position_ids: (1, T); pixel_values: (tiles, 3, TILE, TILE); returns logits (1, T, VOCAB)."""
        x = self.embed(input_ids)
        if pixel_values is not None:
            patches = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.vit_pos  # (tiles, P, C)
            h = patches.reshape(-1, patches.shape[-1])
            cu = vit_cu_seqlens * PATCHES_PER_TILE  # one ViT sequence per tile, in patch rows
            for block in self.vit_blocks:
                h = block(h, cu, PATCHES_PER_TILE)
            image_positions = (input_ids[0] == IMAGE_TOKEN).nonzero().squeeze(1)
            x = x.index_put((torch.zeros_like(image_positions), image_positions), self.projector(h))
        for block in self.blocks:
            x = block(x, position_ids, cu_seqlens, max_seqlen, "auto")
        return self.lm_head(self.norm(x))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps to train")
    parser.add_argument("--micro-steps", type=int, default=2, help="micro-steps (accumulation) per optimizer step")
    parser.add_argument("--num-samples", type=int, default=1024, help="samples drawn from the bundled loads")
    parser.add_argument("--target-batch-size", type=float, default=4.0, help="mean samples per pack")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    # pin_memory=True is what a GPU run uses; on a CPU-only machine it is a no-op that warns
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")

    lengths = scaled_lengths(args.num_samples, args.seed)
    dataset = SyntheticVLMData(lengths, args.seed)
    sampler = BalancedBatchSampler(lengths, target_batch_size=args.target_batch_size, seed=args.seed,
                                   micro_steps_per_step=args.micro_steps, dataset=dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=pack_batch,
                                         num_workers=args.workers, pin_memory=True)
    model = TinyVLM()
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    planned_vit, planned_llm, _ = sampler.micro_step_loads()
    m = args.micro_steps
    if rank == 0:
        qv, qt = sampler.capacities[0]
        print(f"ranks {world_size}, {len(lengths)} samples, capacities {qv} tiles / {qt} tokens, "
              f"{len(sampler) // m} optimizer steps of {m} micro-steps in the epoch")

    tokens_done, losses, start = 0, [], time.perf_counter()
    step = 0
    for micro, batch in enumerate(loader):
        last_micro = micro % m == m - 1
        sync = contextlib.nullcontext() if (last_micro or not distributed) else model.no_sync()
        with sync:
            logits = model(**batch)
            loss = causal_lm_loss(logits, batch["labels"]) / m
            loss.backward()
        tokens_done += int(batch["input_ids"].shape[1])
        losses.append(float(loss.detach()) * m)
        if not last_micro:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            rows = slice(step * m, step * m + m)
            print(f"step {step}: loss {np.mean(losses[-m:]):.3f}  tiles per rank "
                  f"{planned_vit[rows].sum(axis=0).tolist()}  tokens per rank {planned_llm[rows].sum(axis=0).tolist()}")
        step += 1
        if step >= args.steps:
            break
    seconds = time.perf_counter() - start
    total_tokens = torch.tensor([tokens_done], dtype=torch.int64)
    if distributed:
        dist.all_reduce(total_tokens)
    report = sampler.balance_report()
    if rank == 0:
        print(f"{step} steps, {int(total_tokens)} tokens in {seconds:.2f} s: "
              f"{int(total_tokens) / seconds:.0f} tokens/s over {world_size} rank(s)")
        print("balance:", {k: (round(v, 5) if isinstance(v, float) else v)
                           for k, v in report.to_dict().items() if k != "groups"})
    if distributed:
        dist.destroy_process_group()
    assert all(math.isfinite(x) for x in losses)
    return {"steps": step, "tokens": int(total_tokens), "losses": losses, "report": report}


if __name__ == "__main__":
    main()
