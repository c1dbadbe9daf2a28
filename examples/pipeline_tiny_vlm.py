"""Model and memory balance on a real pipeline: a tiny VLM split into 2 stages on 2 CPU processes (gloo).

    python examples/pipeline_tiny_vlm.py --steps 3 --micro-batches 4 [--schedule 1f1b|gpipe] [--json]

1. Balanced packs of the bundled InternVL-Chat SFT loads (``plan_packs``), scaled down: one pack is one
   micro-batch of at most 16 tiles (16 patches each) and 128 text tokens, padded to that fixed shape.
2. ``measure_profile`` measures the tiny VLM (ViT layers of width 96, LLM layers of width 128) layer by layer on
   one micro-batch: forward/backward time and the bytes each layer saves for backward.
3. ``partition`` searches the 2-stage split and the per-stage recompute plan under a memory budget (90% of the
   least peak any 2-stage split reaches without recomputation, so something must be recomputed); the uniform
   split (equal layer counts, one recompute setting for both stages) is the baseline.
4. Both run under ``torch.distributed.pipelining`` (``PipelineStage`` per rank from ``stage_modules``, the
   recomputed layers wrapped by ``apply_recompute``, ``Schedule1F1B`` or ``ScheduleGPipe``) for a few SGD
   steps; the losses are checked against the unsplit model trained the same way. Each rank then measures its
   stage alone: forward + backward time and the bytes its forward keeps alive (``measure_saved_bytes``), printed
   next to the prediction.

Times are CPU times of each process's one torch thread (the profile, each stage alone, each rank's busy time
per step), so other work on the machine does not enter them; the step's wall time is printed too, and on a
busy machine it is as noisy as the machine. The saved bytes are exact.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from omnibal_kernels.balance import plan_packs
from omnibal_kernels.lengths import default_lengths
from omnibal_kernels.pipeline import (
    PipelinePlan,
    apply_recompute,
    evaluate_partition,
    measure_profile,
    measure_saved_bytes,
    partition,
    stage_modules,
)
from omnibal_kernels.pipeline.tiny_vlm import TinyVLMConfig, build_tiny_vlm, tiny_vlm_kinds

CONFIG = TinyVLMConfig()
# --small: the same structure, narrower (the test suite's quick run)
SMALL = TinyVLMConfig(vit_layers=4, vit_width=32, patch_dim=12, llm_layers=3, llm_width=48, vocab=128)
TOKEN_SCALE = 42  # 5,376 real tokens per pack -> at most 128 here
LR = 0.05


def make_batches(micro_batches: int, steps: int, c: TinyVLMConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """``steps * micro_batches`` balanced packs as padded micro-batches (one pack per row)."""
    lengths = default_lengths()
    pick = np.random.default_rng(seed).choice(len(lengths), 4000, replace=False)
    sub = lengths[pick]
    plan = plan_packs(sub, world_size=1, vit_capacity=16, llm_capacity=5376, seed=seed)
    n = steps * micro_batches
    if plan.num_packs < n:
        raise ValueError(f"only {plan.num_packs} packs for {n} micro-batches")
    g = torch.Generator().manual_seed(seed)
    patches = torch.zeros(n, c.vision_tokens, c.patch_dim)
    ids = torch.zeros(n, c.text_tokens, dtype=torch.long)
    labels = torch.full((n, c.text_tokens), -100, dtype=torch.long)
    for row in range(n):
        pack = plan.pack(row)
        tiles = int(sub.vit[pack].sum())
        text = min(c.text_tokens, int(np.ceil(sub.llm[pack].sum() / TOKEN_SCALE)))
        nv = tiles * c.patches_per_tile
        patches[row, :nv] = torch.randn(nv, c.patch_dim, generator=g)
        ids[row, :text] = torch.randint(0, c.vocab, (text,), generator=g)
        labels[row, :text - 1] = ids[row, 1:text]
    return {"patches": patches, "ids": ids, "labels": labels}


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def reference_losses(batches: dict[str, torch.Tensor], micro_batches: int, steps: int,
                     c: TinyVLMConfig) -> list[float]:
    """The unsplit model, trained the same way: mean of the micro-batch losses, SGD."""
    model = build_tiny_vlm(c, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for step in range(steps):
        rows = slice(step * micro_batches, (step + 1) * micro_batches)
        p, i, l = batches["patches"][rows], batches["ids"][rows], batches["labels"][rows]
        losses = [loss_fn(model(p[j:j + 1], i[j:j + 1]), l[j:j + 1]) for j in range(micro_batches)]
        loss = torch.stack(losses).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _stage_alone(model: torch.nn.Module, plan: PipelinePlan, rank: int, batches: dict[str, torch.Tensor],
                 repeats: int = 3) -> tuple[float, int]:
    """This rank's stage on micro-batch 0, alone: median forward + backward CPU ms, bytes kept by its forward."""
    first, last = plan.stages[rank]
    layers = list(model)
    stage = stage_modules(model, plan)[rank]
    x: Any = (batches["patches"][:1], batches["ids"][:1])
    with torch.no_grad():
        for layer in layers[:first]:
            x = layer(*x) if isinstance(x, tuple) else layer(x)
    inputs = x if isinstance(x, tuple) else (x,)

    def fresh() -> tuple:
        return tuple(t.clone().requires_grad_(t.is_floating_point()) for t in inputs)

    times = []
    for _ in range(repeats + 1):
        args = fresh()
        t0 = time.process_time()
        out = stage(*args)
        loss = loss_fn(out, batches["labels"][:1]) if last == len(layers) - 1 else out.float().square().mean()
        loss.backward()
        times.append((time.process_time() - t0) * 1e3)
    _, kept = measure_saved_bytes(lambda: stage(*fresh()))
    return statistics.median(times[1:]), kept


def _worker(rank: int, port: int, plans: dict[str, PipelinePlan], batches: dict[str, torch.Tensor],
            micro_batches: int, steps: int, schedule: str, c: TinyVLMConfig, out_dir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = {}
        for label, plan in plans.items():
            model = build_tiny_vlm(c, seed=0)
            apply_recompute(model, plan.recompute_names(rank))
            module = stage_modules(model, plan)[rank]
            stage = PipelineStage(module, rank, 2, torch.device("cpu"))
            kind = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
            sched = kind(stage, n_microbatches=micro_batches, loss_fn=loss_fn)
            opt = torch.optim.SGD(module.parameters(), lr=LR)
            losses, step_ms, busy_ms = [], [], []
            for step in range(steps):
                rows = slice(step * micro_batches, (step + 1) * micro_batches)
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                if rank == 0:
                    sched.step(batches["patches"][rows], batches["ids"][rows])
                else:
                    mb_losses: list = []
                    sched.step(target=batches["labels"][rows], losses=mb_losses)
                    losses.append(float(torch.stack(mb_losses).mean()))
                busy_ms.append((time.process_time() - c0) * 1e3)
                dist.barrier()
                step_ms.append((time.perf_counter() - t0) * 1e3)
                opt.step()
                opt.zero_grad()
            # One rank at a time, so the two stages do not share the cores while they are timed.
            for turn in range(2):
                dist.barrier()
                if turn == rank:
                    alone_ms, kept = _stage_alone(model, plan, rank, batches)
            result[label] = {"losses": losses, "step_ms": step_ms, "busy_ms": busy_ms, "alone_ms": alone_ms,
                             "saved_bytes": kept}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(steps: int = 3, micro_batches: int = 4, schedule: str = "1f1b", memory_fraction: float = 0.9,
        repeats: int = 3, c: TinyVLMConfig = CONFIG) -> dict[str, Any]:
    """Profiles, plans, runs both partitions on 2 processes and returns everything measured."""
    torch.set_num_threads(1)
    batches = make_batches(micro_batches, steps, c)
    model = build_tiny_vlm(c, seed=0)
    # CPU time of the one torch thread: what the layer costs, not what other processes on the machine take.
    profile = measure_profile(model, (batches["patches"][:1], batches["ids"][:1]), kinds=tiny_vlm_kinds(model),
                              repeats=repeats, timer=time.process_time)
    # A budget below the least peak any 2-stage split reaches without recomputation: memory must be balanced
    # by recomputing, not by moving layers alone.
    L = len(profile)
    least = min(max(evaluate_partition(profile, [(0, cut - 1), (cut, L - 1)], micro_batches=micro_batches,
                                       schedule=schedule, recompute="none").peak_bytes) for cut in range(1, L))
    budget = memory_fraction * least
    plans = {
        "searched": partition(profile, 2, micro_batches=micro_batches, schedule=schedule, memory_bytes=budget),
        "uniform": partition(profile, 2, micro_batches=micro_batches, schedule=schedule, memory_bytes=budget,
                             method="uniform", recompute="uniform"),
    }
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_worker, args=(_free_port(), plans, batches, micro_batches, steps, schedule, c,
                                                out_dir), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError("pipeline workers did not finish within 120 s")
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    report: dict[str, Any] = {"budget_bytes": budget, "layers": profile.names,
                              "reference_losses": reference_losses(batches, micro_batches, steps, c), "plans": {}}
    for label, plan in plans.items():
        entry = plan.to_dict()
        entry["recompute_names"] = [plan.recompute_names(s) for s in range(2)]
        entry["predicted_compute_ms"] = [f + b for f, b in zip(plan.forward_ms, plan.backward_ms)]
        entry["measured_compute_ms"] = [ranks[r][label]["alone_ms"] for r in range(2)]
        entry["measured_saved_bytes"] = [ranks[r][label]["saved_bytes"] for r in range(2)]
        entry["losses"] = ranks[1][label]["losses"]
        entry["measured_step_ms"] = [max(a, b) for a, b in zip(ranks[0][label]["step_ms"], ranks[1][label]["step_ms"])]
        entry["predicted_busy_ms"] = [micro_batches * t for t in entry["predicted_compute_ms"]]
        entry["measured_busy_ms"] = [statistics.median(ranks[r][label]["busy_ms"][1:] or ranks[r][label]["busy_ms"])
                                     for r in range(2)]
        report["plans"][label] = entry
    return report


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--memory-fraction", type=float, default=0.9,
                        help="memory budget per stage, as a fraction of the least peak any split reaches without "
                        "recomputation (default 0.9)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per layer when profiling")
    parser.add_argument("--small", action="store_true", help="a narrower model (quick check)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = run(args.steps, args.micro_batches, args.schedule, args.memory_fraction, args.repeats,
                 SMALL if args.small else CONFIG)
    if args.json:
        print(json.dumps(report))
        return 0
    names = report["layers"]
    print(f"tiny VLM, {len(names)} layers, 2 stages on 2 processes (gloo), {args.schedule}, "
          f"{args.micro_batches} micro-batches, budget {report['budget_bytes'] / 2**20:.1f} MiB per stage")
    print(f"unsplit model losses: {', '.join(f'{x:.5f}' for x in report['reference_losses'])}")
    for label, p in report["plans"].items():
        timed = p["measured_step_ms"][1:] or p["measured_step_ms"]  # the first step sets up the pipeline
        print(f"\n{label}: losses {', '.join(f'{x:.5f}' for x in p['losses'])}; predicted step "
              f"{p['step_ms']:.1f} ms, measured {statistics.median(timed):.1f} ms (median after the first)")
        print("  stage  layers               recomputed  micro-batch CPU ms   step CPU ms       saved MiB")
        print("                                              pred / alone     pred / in pipe    pred / meas")
        for s, (a, b) in enumerate(p["stages"]):
            print(f"  {s:>5}  {names[a] + ' .. ' + names[b]:<20} {len(p['recompute_names'][s]):>10}  "
                  f"{p['predicted_compute_ms'][s]:>6.1f} / {p['measured_compute_ms'][s]:<6.1f}  "
                  f"{p['predicted_busy_ms'][s]:>6.1f} / {p['measured_busy_ms'][s]:<6.1f}  "
                  f"{p['activation_bytes'][s] / 2**20:>6.2f} / {p['measured_saved_bytes'][s] / 2**20:.2f}")
        print(f"  recomputed: {p['recompute_names']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
