"""Measured training speed-up: a tiny VLM trained with DDP over 2 CPU processes, random padded batches
against balanced packs, the same samples and tokens.

The samples are sized like the bundled InternVL-Chat loads scaled by 1/16 (a 448 px tile of 256 LLM tokens
becomes a 16x16 px tile of 16 patches and 16 tokens; text tokens are divided by 16). Two ranks (gloo,
one thread each) train one epoch over them each way, the same model from the same initial weights:

* ``random``: a seeded random order cut into micro-batches of 4 samples, each padded to its longest
  sample and run densely (``(4, longest)`` token batches, dense causal attention), the tiles concatenated;
* ``balanced``: ``plan_packs`` (cost model of this model's own shapes) packs of about 4 samples, each
  built by ``pack_batch`` and run with ``varlen_attention``.

One micro-step per optimizer step; DDP all-reduces the gradients after every backward. A DDP
communication hook runs the all-reduce synchronously and times it: that time is how long a rank waited
for the slower one plus the transfer of the gradients (about 1 MB, well under a millisecond between two
local processes), the ``wait_fraction`` of the epoch. Batches are built before the timed epoch, so the
wall time is training only (collate speed is measured by the ``collate`` provider). After a few untimed
steps of each, the modes take turns for ``rounds`` epochs (which goes first alternates), and each keeps its
fastest epoch.

Caveat: CPU compute shapes differ from a GPU's. Here a rank's time grows about linearly with its tokens,
padding included; on a GPU small batches under-use the device and attention costs more at long lengths.
The ratio shows the effect of balance and padding on real DDP synchronization, not a GPU's number.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ..balance import CostModel, plan_packs
from ..lengths import Lengths
from ..packing import pack_batch, warmup
from ..testing.models import causal_lm_loss
from ..testing.processes import free_port
from ..testing.tiny_vlm import TinyVLM, make_sample, scaled_lengths
from .baselines import random_padded_plan
from .runner import Config, register

BATCH = 4
WORLD_SIZE = 2
WARMUP_STEPS = 3
FULL = dict(samples=1024, rounds=3, hidden=256)
QUICK = dict(samples=64, rounds=1, hidden=64)


def padded_batch(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """A dense padded batch: ``(B, longest)`` ids (pad 0), labels (-100 on padding), tiles concatenated."""
    longest = max(int(s["input_ids"].numel()) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    labels = torch.full((len(samples), longest), -100, dtype=torch.int64)
    for row, s in enumerate(samples):
        n = s["input_ids"].numel()
        ids[row, :n], labels[row, :n] = s["input_ids"], s["labels"]
        labels[row, 0] = -100
    pixels = torch.cat([s["pixel_values"] for s in samples])
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(longest).expand(len(samples), -1),
            "pixel_values": pixels if pixels.shape[0] else None}


def _timed_allreduce(state: dict[str, float], bucket):  # noqa: ANN001, ANN202
    """DDP communication hook: a blocking all-reduce (mean), its time added to ``state["allreduce_s"]``.

    ``bucket`` is a ``dist.GradBucket`` and the result a ``Future[Tensor]``; they carry no annotations
    because DDP checks annotations by identity and this module's are strings.
    """
    buf = bucket.buffer()
    start = time.perf_counter()
    dist.all_reduce(buf)
    state["allreduce_s"] += time.perf_counter() - start
    buf.div_(dist.get_world_size())
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _batches(mode: str, lengths: Lengths, samples: list, rank: int, cost: CostModel, seed: int) -> tuple[list, int]:
    """This rank's batches for one epoch of ``mode`` and the real (unpadded) tokens in them."""
    if mode == "random":
        plan = random_padded_plan(lengths, world_size=WORLD_SIZE, batch_size=BATCH, seed=seed)
        build = padded_batch
    else:
        plan = plan_packs(lengths, world_size=WORLD_SIZE, target_batch_size=BATCH, cost_model=cost, seed=seed)
        build = pack_batch
    ids = plan.rank_batches(rank)
    tokens = int(sum(lengths.llm[b].sum() for b in ids))
    return [build([samples[i] for i in b]) for b in ids], tokens


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, state: dict[str, float]) -> float:
    dist.barrier()
    state["allreduce_s"] = 0.0
    start = time.perf_counter()
    for batch in batches:
        logits = model(**batch)
        causal_lm_loss(logits, batch["labels"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _worker(rank: int, port: int, sizes: dict[str, int], seed: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        lengths = scaled_lengths(sizes["samples"], seed)
        samples = [make_sample(lengths, i, seed) for i in range(len(lengths))]
        torch.manual_seed(seed)
        base = TinyVLM(hidden=sizes["hidden"], vit_hidden=sizes["hidden"] // 2)
        cost = base.cost_model()
        batches = {m: _batches(m, lengths, samples, rank, cost, seed) for m in ("random", "balanced")}
        initial = {k: v.clone() for k, v in base.state_dict().items()}
        results: dict[str, list] = {m: [] for m in batches}
        # a few untimed steps of each mode first (allocator, thread pools, first-call paths); then the
        # modes take turns, the first of each round alternating
        plan = [(m, WARMUP_STEPS) for m in batches]
        for r in range(sizes["rounds"]):
            plan += [(m, None) for m in (("random", "balanced") if r % 2 == 0 else ("balanced", "random"))]
        for mode, limit in plan:
            mode_batches, tokens = batches[mode]
            base.load_state_dict(initial)
            model = nn.parallel.DistributedDataParallel(base)
            state = {"allreduce_s": 0.0}
            model.register_comm_hook(state, _timed_allreduce)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            seconds = _epoch(model, optimizer, mode_batches[:limit], state)
            if limit is None:
                # every rank's numbers, so the epoch lasts as long as the slowest rank
                stats = torch.tensor([seconds, state["allreduce_s"], tokens, len(mode_batches)], dtype=torch.float64)
                gathered = [torch.zeros_like(stats) for _ in range(WORLD_SIZE)]
                dist.all_gather(gathered, stats)
                results[mode].append(torch.stack(gathered).tolist())
            del model
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"results": results, "cost_model": cost.to_dict()}, f)
    finally:
        dist.destroy_process_group()



def summarize(results: dict[str, list], lengths: Lengths) -> dict[str, Any]:
    """The report entry from the per-round, per-rank ``[seconds, allreduce_s, tokens, steps]`` rows."""
    out: dict[str, Any] = {}
    for mode, rounds in results.items():
        per_round = np.asarray(rounds, dtype=np.float64)  # (rounds, ranks, 4)
        best = int(np.argmin(per_round[:, :, 0].max(axis=1)))
        r = per_round[best]
        seconds = float(r[:, 0].max())
        tokens = float(r[:, 2].sum())
        out[f"{mode}_s"] = seconds
        out[f"{mode}_tokens"] = int(tokens)
        out[f"{mode}_tokens_per_s"] = tokens / seconds
        out[f"{mode}_steps"] = int(r[:, 3].max())
        out[f"wait_fraction_{mode}"] = float(np.mean(r[:, 1] / r[:, 0]))
        out[f"{mode}_rounds_s"] = per_round[:, :, 0].max(axis=1).round(4).tolist()
    # the same samples each way; balanced may repeat a few to fill its last step, so the speed-up is the
    # ratio of tokens per second (equal to the ratio of epoch times when the tokens are equal)
    out["speedup"] = out["balanced_tokens_per_s"] / out["random_tokens_per_s"]
    out["samples"] = len(lengths)
    out["input_tokens"] = int(lengths.llm.sum())
    return out


@register("ddp")
def run(config: Config) -> dict[str, Any]:
    """Trains the tiny VLM both ways with DDP over 2 processes and returns ``measured_ddp``."""
    sizes = QUICK if config.quick else FULL
    warmup()  # the packing kernel, compiled once here and inherited by the ranks
    # fork where the platform has it: the ranks inherit the imported modules (seconds of start-up each on a
    # busy 2-core machine); every rank runs torch with one thread, so no OpenMP pool crosses the fork
    method = "fork" if "fork" in torch.multiprocessing.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ddp.json")
        torch.multiprocessing.start_processes(_worker, args=(free_port(), sizes, config.seed, out_path),
                                              nprocs=WORLD_SIZE, join=True, start_method=method)
        with open(out_path) as f:
            raw = json.load(f)
    result = summarize(raw["results"], scaled_lengths(sizes["samples"], config.seed))
    result.update(world_size=WORLD_SIZE, threads_per_rank=1, batch_size=BATCH, hidden=sizes["hidden"],
                  rounds=sizes["rounds"], cost_model=raw["cost_model"],
                  caveat="CPU processes: compute grows about linearly with tokens; GPU shapes differ")
    config.say(f"  random padded {result['random_s']:.2f} s/epoch (wait {result['wait_fraction_random']:.1%}), "
               f"balanced {result['balanced_s']:.2f} s/epoch (wait {result['wait_fraction_balanced']:.1%}): "
               f"{result['speedup']:.2f}x tokens/s")
    return {"measured_ddp": result}
