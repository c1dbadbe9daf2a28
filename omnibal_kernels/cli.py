"""Command line: ``omnibal-kernels plan ...`` (also ``python -m omnibal_kernels``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

__all__ = ["main", "build_parser"]

_REPORT_ROWS = (
    ("vit_capacity", "ViT capacity", "{:d}"),
    ("llm_capacity", "LLM capacity", "{:d}"),
    ("num_samples", "samples", "{:,d}"),
    ("num_packs", "packs", "{:,d}"),
    ("num_steps", "steps", "{:,d}"),
    ("ave_bs", "samples per pack", "{:.3f}"),
    ("vit_fill", "ViT fill", "{:.4f}"),
    ("llm_fill", "LLM fill", "{:.4f}"),
    ("vit_dist", "ViT dist ratio", "{:.4f}"),
    ("llm_dist", "LLM dist ratio", "{:.4f}"),
    ("step_efficiency", "step efficiency", "{:.4f}"),
    ("dropped", "dropped samples", "{:,d}"),
    ("duplicated", "duplicated samples", "{:,d}"),
    ("oversize", "oversize singles", "{:,d}"),
    ("seconds", "planning seconds", "{:.4f}"),
)


def build_parser() -> argparse.ArgumentParser:
    from .balance.plan import METHODS, OVERSIZE_POLICIES
    from .vision import add_lengths_parser

    parser = argparse.ArgumentParser(
        prog="omnibal-kernels",
        description="Balance variable-length (vision-)language training data across data-parallel ranks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser(
        "plan",
        help="group samples into packs and schedule them on ranks; print the balance report",
        description="Plan packs for PATHs (OmniBal JSON, meta JSON, JSONL, .npy, .npz). Without PATH: the "
        "bundled InternVL-Chat SFT loads (70,706 samples), with random, isf and balanced side by side.",
    )
    plan.add_argument("paths", nargs="*", metavar="PATH", help="length files (default: the bundled data)")
    plan.add_argument("--world-size", type=int, default=8, help="data-parallel ranks (default 8)")
    plan.add_argument("--target-batch-size", type=float, default=4.0,
                      help="mean samples per pack for the capacity search (default 4)")
    plan.add_argument("--vit-capacity", type=int, default=None, help="ViT tiles/patches per pack")
    plan.add_argument("--llm-capacity", type=int, default=None, help="LLM tokens per pack")
    plan.add_argument("--method", choices=METHODS, default=None,
                      help="planning method (default: all three side by side without PATH or --json, "
                      "else balanced)")
    plan.add_argument("--oversize", choices=OVERSIZE_POLICIES, default="error",
                      help="samples over a capacity: error (default), own pack, or drop")
    plan.add_argument("--drop-last", action="store_true", help="drop a ragged last step instead of reusing packs")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--epoch", type=int, default=0)
    plan.add_argument("--json", action="store_true", help="print one JSON object (one method)")
    plan.add_argument("--out", default=None, help="write the plan to this .npz file (one method)")
    plan.set_defaults(func=_run_plan)
    add_lengths_parser(sub)
    return parser


def _run_plan(args: argparse.Namespace) -> int:
    from .balance import balance_report, plan_packs
    from .lengths import default_lengths, load_lengths

    if args.paths:
        lengths = load_lengths(*args.paths)
        source = f"{len(args.paths)} file(s)"
    else:
        lengths = default_lengths()
        source = "bundled InternVL-Chat SFT loads"
    if args.method is not None:
        methods = [args.method]
    elif args.json or args.out or args.paths:
        methods = ["balanced"]
    else:
        methods = ["random", "isf", "balanced"]

    rows = []
    for method in methods:
        plan = plan_packs(
            lengths,
            world_size=args.world_size,
            method=method,
            target_batch_size=args.target_batch_size,
            vit_capacity=args.vit_capacity,
            llm_capacity=args.llm_capacity,
            oversize=args.oversize,
            drop_last=args.drop_last,
            seed=args.seed,
            epoch=args.epoch,
        )
        report = balance_report(plan, lengths).to_dict()
        report.update(method=method, vit_capacity=plan.vit_capacity, llm_capacity=plan.llm_capacity,
                      world_size=plan.world_size)
        rows.append(report)
        if args.out:
            plan.save(args.out)

    if args.json:
        print(json.dumps(rows[0]))
        return 0
    summary = lengths.summary()
    print(f"{source}: {summary['samples']:,} samples, ViT load mean {summary['vit_mean']:.2f} "
          f"(max {summary['vit_max']}), LLM tokens mean {summary['llm_mean']:.0f} (max {summary['llm_max']}); "
          f"world size {args.world_size}, target {args.target_batch_size:g} samples per pack")
    width = max(len(label) for _, label, _ in _REPORT_ROWS)
    print(f"{'':<{width}}  " + "  ".join(f"{r['method']:>10}" for r in rows))
    for key, label, fmt in _REPORT_ROWS:
        print(f"{label:<{width}}  " + "  ".join(f"{fmt.format(r[key]):>10}" for r in rows))
    if args.out:
        print(f"plan written to {args.out}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``omnibal-kernels``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"omnibal-kernels: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
