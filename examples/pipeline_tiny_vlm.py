"""Model and memory balance on a real pipeline: a tiny VLM split over 2 CPU processes (gloo), interleaved.

    python examples/pipeline_tiny_vlm.py --steps 3 --micro-batches 4 [--schedule interleaved] [--json]

1. Balanced packs of the bundled InternVL-Chat SFT loads scaled by 1/16 (``testing.tiny_vlm``,
   ``plan_packs``): one pack is one micro-batch of at most 16 tiles and 336 tokens, padded to that fixed shape.
2. ``measure_profile`` measures the tiny VLM (``TinyVLM.as_chain()``: ViT layers of width 64, LLM layers of
   width 128) layer by layer on one micro-batch: forward/backward CPU time and the bytes each layer saves.
3. ``partition`` searches the split of least simulated step under the schedule (default ``interleaved``: 2
   ranks x 2 virtual stages, rank r running stages r and r + 2) and the per-rank recompute plan under a memory
   budget (90% of the least peak any split reaches without recomputation, so something must be recomputed);
   the uniform split (equal layer counts, one recompute setting for every rank) is the baseline.
4. Both run under ``torch.distributed.pipelining`` (a ``PipelineStage`` per virtual stage from
   ``stage_modules``, recomputed layers wrapped by ``apply_recompute``, the schedule class
   ``TORCH_SCHEDULES[schedule]``) for a few SGD steps; the losses are checked against the unsplit model trained
   the same way. Each rank then measures its stages alone: forward + backward time and the bytes their forwards
   keep alive (``measure_saved_bytes``), printed next to the prediction.

Times are CPU times of each process's one torch thread (the profile, each stage alone, each rank's busy time
per step), so other work on the machine does not enter them; the step's wall time is printed too, and on a
busy machine it is as noisy as the machine. The saved bytes are exact.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnibal_kernels import PlanOptions
from omnibal_kernels.balance import plan_packs
from omnibal_kernels.pipeline import (
    TORCH_SCHEDULES,
    PipelinePlan,
    apply_recompute,
    evaluate_partition,
    measure_profile,
    measure_saved_bytes,
    partition,
    stage_modules,
)
from omnibal_kernels.testing.models import causal_lm_loss
from omnibal_kernels.testing.processes import free_port
from omnibal_kernels.testing.tiny_vlm import (
    PATCHES,
    TinyVLM,
    chain_kinds,
    dense_micro_batch,
    make_sample,
    scaled_lengths,
)

SIZES = {"hidden": 128, "vit_hidden": 64, "vit_layers": 6, "llm_layers": 4}
SMALL = {"hidden": 48, "vit_hidden": 32, "vit_layers": 4, "llm_layers": 3}  # the test suite's quick run
TILES, TEXT = 16, 5376 // 16  # a pack's capacities, scaled as the samples are
TOKENS = TEXT + TILES * PATCHES  # room for the placeholders of the blank tiles that pad a pack
LR = 0.05
RANKS = 2


def make_batches(micro_batches: int, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``steps * micro_batches`` balanced packs as fixed-shape micro-batches, stacked along dim 0."""
    lengths = scaled_lengths(4000, seed)
    plan = plan_packs(lengths, PlanOptions(vit_capacity=TILES, llm_capacity=TEXT, seed=seed), world_size=1)
    n = steps * micro_batches
    if plan.num_packs < n:
        raise ValueError(f"only {plan.num_packs} packs for {n} micro-batches")
    rows = [
        dense_micro_batch([make_sample(lengths, int(i), seed) for i in plan.pack(p)], TOKENS, TILES) for p in range(n)
    ]
    return {key: torch.cat([r[key] for r in rows]) for key in ("input_ids", "labels", "pixel_values")}


def _rows(batches: dict[str, torch.Tensor], first: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, pixel_values, labels of micro-batches first .. first + count - 1."""
    ids = batches["input_ids"][first : first + count]
    pix = batches["pixel_values"][first * TILES : (first + count) * TILES]
    return ids, pix, batches["labels"][first : first + count]


def build(sizes: dict[str, int]) -> TinyVLM:
    torch.manual_seed(0)
    return TinyVLM(**sizes)


def reference_losses(
    batches: dict[str, torch.Tensor], micro_batches: int, steps: int, sizes: dict[str, int]
) -> list[float]:
    """The unsplit model, trained the same way: mean of the micro-batch losses, SGD."""
    model = build(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for step in range(steps):
        losses = []
        for j in range(micro_batches):
            ids, pix, labels = _rows(batches, step * micro_batches + j, 1)
            pos = torch.arange(ids.shape[1])[None]
            losses.append(causal_lm_loss(model(ids, pos, pixel_values=pix), labels))
        loss = torch.stack(losses).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _stage_examples(chain: Any, plan: PipelinePlan, batches: dict[str, torch.Tensor]) -> list[tuple[tuple, tuple]]:
    """(inputs, outputs) of every virtual stage on micro-batch 0, for the stages' static shapes."""
    ids, pix, _ = _rows(batches, 0, 1)
    x: Any = (ids, pix)
    out = []
    for module in stage_modules(chain, plan):
        inputs = x if isinstance(x, tuple) else (x,)
        y = module(*inputs)
        outputs = y if isinstance(y, tuple) else (y,)
        out.append(
            (
                tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs),
                tuple(t.detach().requires_grad_(t.requires_grad) for t in outputs),
            )
        )
        x = y
    return out


def _stage_alone(chain: Any, plan: PipelinePlan, stage: int, examples: list, repeats: int = 3) -> tuple[float, int]:
    """One virtual stage on micro-batch 0, alone: median forward + backward CPU ms, bytes kept by its forward."""
    module = stage_modules(chain, plan)[stage]
    inputs = examples[stage][0]

    def fresh() -> tuple:
        return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)

    times = []
    for _ in range(repeats + 1):
        args = fresh()
        t0 = time.process_time()
        out = module(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(
            [o for o in outs if o.requires_grad], [torch.ones_like(o) for o in outs if o.requires_grad]
        )
        times.append((time.process_time() - t0) * 1e3)
    _, kept = measure_saved_bytes(lambda: module(*fresh()))
    return statistics.median(times[1:]), kept


def _run_plan(
    rank: int,
    plan: PipelinePlan,
    batches: dict[str, torch.Tensor],
    micro_batches: int,
    steps: int,
    sizes: dict[str, int],
) -> dict[str, Any]:
    import torch.distributed.pipelining as pipelining

    model = build(sizes)
    chain = model.as_chain()
    examples = _stage_examples(chain, plan, batches)
    own = plan.rank_stages(rank)
    apply_recompute(chain, [name for j in own for name in plan.recompute_names(j)])
    modules = stage_modules(chain, plan)
    stages = [
        pipelining.PipelineStage(
            modules[j], j, plan.num_stages, torch.device("cpu"), input_args=examples[j][0], output_args=examples[j][1]
        )
        for j in own
    ]
    kind = getattr(pipelining, TORCH_SCHEDULES[plan.schedule])
    sched = kind(stages if plan.virtual_stages > 1 else stages[0], n_microbatches=micro_batches, loss_fn=causal_lm_loss)
    opt = torch.optim.SGD([p for j in own for p in modules[j].parameters()], lr=LR)
    losses, step_ms, busy_ms = [], [], []
    for step in range(steps):
        ids, pix, labels = _rows(batches, step * micro_batches, micro_batches)
        args = (ids, pix) if 0 in own else ()
        mb_losses: list = []
        kwargs = {"target": labels, "losses": mb_losses} if plan.num_stages - 1 in own else {}
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        sched.step(*args, **kwargs)
        busy_ms.append((time.process_time() - c0) * 1e3)
        dist.barrier()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if mb_losses:
            losses.append(float(torch.stack(mb_losses).mean()))
        opt.step()
        opt.zero_grad()
    alone: dict[int, tuple[float, int]] = {}
    # One rank at a time, so the two do not share the cores while they are timed.
    for turn in range(RANKS):
        dist.barrier()
        if turn == rank:
            alone = {j: _stage_alone(chain, plan, j, examples) for j in own}
    return {"losses": losses, "step_ms": step_ms, "busy_ms": busy_ms, "alone": alone}


def _worker(
    rank: int,
    port: int,
    plans: dict[str, PipelinePlan],
    batches: dict[str, torch.Tensor],
    micro_batches: int,
    steps: int,
    sizes: dict[str, int],
    out_dir: str,
) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        result = {label: _run_plan(rank, plan, batches, micro_batches, steps, sizes) for label, plan in plans.items()}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _least_free_peak(profile: Any, micro_batches: int, schedule: str, chunks: int) -> float:
    """The least peak memory (worst rank) of any split when nothing is recomputed."""
    L, S = len(profile), RANKS * chunks
    best = float("inf")
    for cuts in itertools.combinations(range(1, L), S - 1):
        starts = (0, *cuts)
        stages = list(zip(starts, [c - 1 for c in cuts] + [L - 1]))
        plan = evaluate_partition(
            profile, stages, micro_batches=micro_batches, schedule=schedule, virtual_stages=chunks, recompute="none"
        )
        best = min(best, max(plan.memory_bytes))
    return best


def run(
    steps: int = 3,
    micro_batches: int = 4,
    schedule: str = "interleaved",
    virtual_stages: int = 2,
    memory_fraction: float = 0.9,
    repeats: int = 3,
    sizes: dict[str, int] = SIZES,
) -> dict[str, Any]:
    """Profiles, plans, runs both partitions on 2 processes and returns everything measured."""
    torch.set_num_threads(1)
    batches = make_batches(micro_batches, steps)
    chain = build(sizes).as_chain()
    ids, pix, _ = _rows(batches, 0, 1)
    # CPU time of the one torch thread: what the layer costs, not what other processes on the machine take.
    profile = measure_profile(chain, (ids, pix), kinds=chain_kinds(chain), repeats=repeats, timer=time.process_time)
    # A budget below the least peak any split reaches without recomputation: memory must be balanced by
    # recomputing, not by moving layers alone.
    budget = memory_fraction * _least_free_peak(profile, micro_batches, schedule, virtual_stages)
    common = dict(micro_batches=micro_batches, schedule=schedule, virtual_stages=virtual_stages, memory_bytes=budget)
    plans = {
        "searched": partition(profile, RANKS, **common),
        "uniform": partition(profile, RANKS, method="uniform", recompute="uniform", **common),
    }
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(free_port(), plans, batches, micro_batches, steps, sizes, out_dir),
            nprocs=RANKS,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + 300
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError("pipeline workers did not finish within 300 s")
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(RANKS)]
    report: dict[str, Any] = {
        "budget_bytes": budget,
        "layers": profile.names,
        "schedule": schedule,
        "reference_losses": reference_losses(batches, micro_batches, steps, sizes),
        "plans": {},
    }
    for label, plan in plans.items():
        entry = plan.to_dict()
        entry["recompute_names"] = [plan.recompute_names(j) for j in range(plan.num_stages)]
        entry["predicted_compute_ms"] = [f + b for f, b in zip(plan.forward_ms, plan.backward_ms)]
        alone = {j: v for r in ranks for j, v in r[label]["alone"].items()}
        entry["measured_compute_ms"] = [alone[j][0] for j in range(plan.num_stages)]
        entry["measured_saved_bytes"] = [alone[j][1] for j in range(plan.num_stages)]
        last = plan.stage_ranks[-1]
        entry["losses"] = ranks[last][label]["losses"]
        entry["measured_step_ms"] = [max(x) for x in zip(*(r[label]["step_ms"] for r in ranks))]
        entry["predicted_busy_ms"] = [micro_batches * t for t in plan.rank_ms]
        entry["measured_busy_ms"] = [statistics.median(r[label]["busy_ms"][1:] or r[label]["busy_ms"]) for r in ranks]
        report["plans"][label] = entry
    return report


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--schedule", choices=tuple(TORCH_SCHEDULES), default="interleaved")
    parser.add_argument(
        "--virtual-stages", type=int, default=None, help="chunks per rank (default: 2, 1 for 1f1b and gpipe)"
    )
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.9,
        help="memory budget per rank, as a fraction of the least peak any split reaches without "
        "recomputation (default 0.9)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per layer when profiling")
    parser.add_argument("--small", action="store_true", help="a narrower model (quick check)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    chunks = args.virtual_stages or (1 if args.schedule in ("1f1b", "gpipe") else 2)
    report = run(
        args.steps,
        args.micro_batches,
        args.schedule,
        chunks,
        args.memory_fraction,
        args.repeats,
        SMALL if args.small else SIZES,
    )
    if args.json:
        print(json.dumps(report))
        return 0
    names = report["layers"]
    print(
        f"tiny VLM, {len(names)} layers, {RANKS} processes (gloo) x {chunks} stages, {args.schedule}, "
        f"{args.micro_batches} micro-batches, budget {report['budget_bytes'] / 2**20:.1f} MiB per rank"
    )
    print(f"unsplit model losses: {', '.join(f'{x:.5f}' for x in report['reference_losses'])}")
    for label, p in report["plans"].items():
        timed = p["measured_step_ms"][1:] or p["measured_step_ms"]  # the first step sets up the pipeline
        print(
            f"\n{label}: losses {', '.join(f'{x:.5f}' for x in p['losses'])}; predicted step "
            f"{p['step_ms']:.1f} ms, measured {statistics.median(timed):.1f} ms (median after the first)"
        )
        print("  stage rank  layers                recomputed  micro-batch CPU ms    saved MiB")
        print("                                                  pred / alone        pred / meas")
        for s, (a, b) in enumerate(p["stages"]):
            print(
                f"  {s:>5} {p['stage_ranks'][s]:>4}  {names[a] + ' .. ' + names[b]:<21} "
                f"{len(p['recompute_names'][s]):>10}  {p['predicted_compute_ms'][s]:>7.1f} / "
                f"{p['measured_compute_ms'][s]:<7.1f}  {p['activation_bytes'][s] / 2**20:>6.2f} / "
                f"{p['measured_saved_bytes'][s] / 2**20:.2f}"
            )
        print(
            "  busy per step (CPU ms), per rank: predicted "
            + " / ".join(f"{x:.0f}" for x in p["predicted_busy_ms"])
            + ", measured "
            + " / ".join(f"{x:.0f}" for x in p["measured_busy_ms"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
