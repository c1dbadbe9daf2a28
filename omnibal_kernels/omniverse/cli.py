"""``omnibal-kernels omniverse``: argument registration and the run function."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parsers", "format_result"]

_GIB = 2**30


def add_parsers(sub: Any) -> None:
    """Registers ``omniverse`` on an argparse sub-parser set."""
    from .._cli_args import fraction, int_in, non_negative_float, positive_float
    from ..pipeline.estimate import CONFIGS
    from ..pipeline.schedule import MAX_MICRO_BATCHES

    p = sub.add_parser(
        "omniverse",
        help="data, model and memory balance in one simulated run: each alone, the paper's order, all three",
        description="Simulate one epoch of LENGTHS (default: the bundled InternVL-Chat SFT loads) on --model "
        "over --gpus GPUs (--pp pipeline stages x --tp tensor-parallel ranks x the rest data-parallel): the "
        "baseline (random padded micro-batches, a uniform layer split, every layer recomputed), data, model and "
        "memory balance alone, data+model (the paper's order) and all three; step and epoch time, speed-up, "
        "peak memory per stage, bubble.",
    )
    p.add_argument("paths", nargs="*", metavar="LENGTHS", help="length files (default: the bundled data)")
    p.add_argument("--model", default="internvl-6b-20b", help=f"one of {', '.join(CONFIGS)} (default internvl-6b-20b)")
    p.add_argument("--gpus", type=int, default=256, help="all GPUs (default 256)")
    p.add_argument("--pp", type=int, default=8, help="pipeline stages (default 8)")
    p.add_argument("--tp", type=int, default=4, help="tensor-parallel ranks per stage (default 4)")
    p.add_argument(
        "--micro-batches",
        type=int_in(1, MAX_MICRO_BATCHES),
        default=32,
        help="micro-batches per pipeline and step (default 32, at most 10**9)",
    )
    p.add_argument("--memory-gb", type=positive_float, default=80.0, help="GiB per GPU (default 80)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per random padded micro-batch (default 4)")
    p.add_argument(
        "--capacities",
        type=int,
        nargs=2,
        default=None,
        metavar=("VIT", "LLM"),
        help="capacities of the balanced packs (default: searched for --batch-size samples per pack)",
    )
    p.add_argument(
        "--baseline-split",
        choices=("uniform", "vit-first"),
        default="uniform",
        help="the split of the configurations that search none: equal layer counts (default) or the vision "
        "encoder on the first stage (Megatron's VLM layout)",
    )
    p.add_argument("--samples", type=int, default=None, help="resample the data to this many samples (seeded)")
    p.add_argument("--tflops", type=positive_float, default=312.0, help="device peak TFLOP/s (default 312, an A100)")
    p.add_argument("--efficiency", type=fraction, default=0.5, help="fraction of peak reached (default 0.5)")
    p.add_argument(
        "--link-gb-per-s", type=non_negative_float, default=25.0, help="GB/s between pipeline stages (default 25)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)


def _row(c: Any, budget: float) -> str:
    peak = max(c.peak_bytes) / _GIB
    fits = "" if c.fits else "  DOES NOT FIT"
    return (
        f"  {c.name:<11} {c.data:<9} {c.split:<9} {c.recompute:<9} {c.step_seconds:>8.2f} {c.epoch_seconds:>9.1f} "
        f"{c.gpu_days:>8.2f} {c.speedup:>7.3f}x {c.bubble_fraction:>7.1%} {c.bubble_from_data:>6.0%} "
        f"{c.recompute_fraction:>7.1%} {peak:>6.1f} / {budget:g}{fits}"
    )


def format_result(result: Any) -> str:
    """The human-readable table of an :class:`~omnibal_kernels.omniverse.OmniverseResult`."""
    lay = result.layout
    lines = [
        f"{result.model}: {lay.gpus} GPUs = {lay.dp} data-parallel x {lay.pp} pipeline x {lay.tp} tensor-parallel, "
        f"{lay.micro_batches} micro-batches per step, {lay.schedule}, {lay.memory_gb:g} GiB per GPU; "
        f"{result.samples:,} samples",
        "",
        f"  {'config':<11} {'data':<9} {'split':<9} {'recompute':<9} {'step s':>8} {'epoch s':>9} {'GPU-days':>8} "
        f"{'speed-up':>8} {'bubble':>7} {'data':>6} {'recomp.':>7} {'peak GiB / budget':>17}",
    ]
    lines += [_row(c, lay.memory_gb) for c in result.configurations]
    f, cum = result.factors, result.cumulative
    lines += [
        "",
        f"each part alone: data {f['data']:.3f}x, model {f['model']:.3f}x, memory {f['memory']:.3f}x; "
        f"product {f['product']:.3f}x; all three together {f['joint']:.3f}x",
        f"the paper's order: data {cum['data']:.3f}x -> model {cum['model']:.3f}x -> memory {cum['memory']:.3f}x "
        f"= {cum['total']:.3f}x (paper, InternVL-Chat-1.5 6+20B, Megatron: 1.19x -> 1.79x -> 1.36x = 2.90x)",
        "bubble: idle share of the epoch's GPU time; data: the share of that idle time unequal micro-batches add",
    ]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from ..lengths import load_lengths
    from .layout import Hardware, Layout
    from .run import omniverse

    layout = Layout(
        gpus=args.gpus,
        pp=args.pp,
        tp=args.tp,
        micro_batches=args.micro_batches,
        memory_gb=args.memory_gb,
        schedule=args.schedule,
    )
    hardware = Hardware(tflops=args.tflops, efficiency=args.efficiency, link_gb_per_s=args.link_gb_per_s)
    lengths = load_lengths(*args.paths) if args.paths else None
    result = omniverse(
        args.model,
        layout,
        lengths,
        samples=args.samples,
        batch_size=args.batch_size,
        capacities=tuple(args.capacities) if args.capacities else None,
        hardware=hardware,
        baseline_split=args.baseline_split,
        seed=args.seed,
    )
    print(json.dumps(result.to_dict()) if args.json else format_result(result))
    return 0
