"""Command line: ``omnibal-kernels plan|lengths ...`` (also ``python -m omnibal_kernels``).

* ``plan``: plan packs for length files (or the bundled data) and print the balance report.
* ``lengths``: build a length file from records of image sizes and text lengths.
* ``calibrate``: time a model on packed batches and write the fitted cost model (JSON).

Errors in the input (the package's ``ValueError``/``TypeError``, a missing file) print one line on stderr and
exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, TextIO

from ._cli_args import OneLineParser, fraction

__all__ = ["add_calibrate_parser", "add_lengths_parser", "build_parser", "main"]

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
    ("epoch_cost", "epoch cost", "{:.4g}"),
    ("epoch_bound", "epoch lower bound", "{:.4g}"),
    ("epoch_over_ideal", "epoch / ideal", "{:.4f}"),
    ("epoch_over_bound", "epoch / bound", "{:.4f}"),
    ("num_dropped", "dropped samples", "{:,d}"),
    ("num_duplicated", "duplicated samples", "{:,d}"),
    ("num_oversize", "oversize singles", "{:,d}"),
    ("seconds", "planning seconds", "{:.4f}"),
)


def _add_no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        default=None,
        help="no progress bar (default: one when stderr is a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
    from .balance.options import METHODS, OVERSIZE_POLICIES
    from .bench.cli import add_bench_parser
    from .omniverse.cli import add_parsers as add_omniverse_parsers
    from .pipeline.cli import add_parsers as add_pipeline_parsers

    parser = OneLineParser(
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
    plan.add_argument(
        "--target-batch-size", type=float, default=4.0, help="mean samples per pack for the capacity search (default 4)"
    )
    plan.add_argument("--vit-capacity", type=int, default=None, help="ViT tiles/patches per pack")
    plan.add_argument("--llm-capacity", type=int, default=None, help="LLM tokens per pack")
    plan.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="planning method (default: all three side by side without PATH or --json, else balanced)",
    )
    plan.add_argument(
        "--oversize",
        choices=OVERSIZE_POLICIES,
        default="error",
        help="samples over a capacity: error (default), own pack, or drop",
    )
    plan.add_argument("--drop-last", action="store_true", help="drop a ragged last step instead of reusing packs")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--epoch", type=int, default=0)
    plan.add_argument(
        "--cost-model",
        default="internvl_7b",
        metavar="NAME|FILE.json|CONFIG_DIR",
        help="the cost model to plan with and report in: a name (internvl_7b, the default; "
        "qwen2_vl_7b, qwen2_5_vl_7b, llama_7b, tokens_only), a JSON file of its terms (as calibrate "
        "writes) or a transformers config folder",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object (one method)")
    plan.add_argument("--out", default=None, help="write the plan to this .npz file (one method)")
    plan.add_argument(
        "--plot",
        default=None,
        metavar="DIR",
        help="draw each rank's load per step, random vs balanced, into DIR (needs matplotlib)",
    )
    plan.set_defaults(func=_run_plan)
    add_lengths_parser(sub)
    add_calibrate_parser(sub)
    add_pipeline_parsers(sub)
    add_omniverse_parsers(sub)
    add_bench_parser(sub)
    return parser


def _run_plan(args: argparse.Namespace) -> int:
    from .balance import PlanOptions, balance_report, plan_packs
    from .lengths import default_lengths, load_lengths

    if args.out:
        _check_output_path(args.out)
    cost_model = _cost_model_argument(args.cost_model)
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
    options = PlanOptions(
        method=methods[0],
        target_batch_size=args.target_batch_size,
        vit_capacity=args.vit_capacity,
        llm_capacity=args.llm_capacity,
        oversize=args.oversize,
        drop_last=args.drop_last,
        seed=args.seed,
        cost_model=cost_model,
    )

    rows, plans = [], {}
    for method in methods:
        plan = plan_packs(lengths, options.replace(method=method), world_size=args.world_size, epoch=args.epoch)
        report = balance_report(plan, lengths, cost_model).to_dict()
        report.update(
            method=method,
            vit_capacity=plan.vit_capacity,
            llm_capacity=plan.llm_capacity,
            world_size=plan.world_size,
            cost_model=cost_model.to_dict(),
        )
        rows.append(report)
        plans[method] = plan
        if args.out:
            written = plan.save(args.out)
    if args.plot:
        from .bench.cli import check_plot_dependency
        from .bench.plots import plot_plans

        check_plot_dependency()
        drawn = {
            m: plans.get(m)
            or plan_packs(lengths, options.replace(method=m), world_size=args.world_size, epoch=args.epoch)
            for m in ("random", "balanced")
        }
        print(f"picture written to {plot_plans(drawn, lengths, args.plot)}", file=sys.stderr)

    if args.json:
        print(json.dumps(rows[0]))
        return 0
    summary = lengths.summary()
    print(
        f"{source}: {summary['samples']:,} samples, ViT load mean {summary['vit_mean']:.2f} "
        f"(max {summary['vit_max']}), LLM tokens mean {summary['llm_mean']:.0f} (max {summary['llm_max']}); "
        f"world size {args.world_size}, target {args.target_batch_size:g} samples per pack"
    )
    width = max(len(label) for _, label, _ in _REPORT_ROWS)
    print(f"{'':<{width}}  " + "  ".join(f"{r['method']:>10}" for r in rows))
    for key, label, fmt in _REPORT_ROWS:
        print(f"{label:<{width}}  " + "  ".join(f"{fmt.format(r[key]):>10}" for r in rows))
    if args.out:
        print(f"plan written to {written}")
    return 0


def _cost_model_argument(spec: str) -> Any:
    """The ``--cost-model`` value as a ``CostModel``; every refusal a one-line error naming the argument."""
    from .balance.cost_models import cost_model_from_spec

    try:
        return cost_model_from_spec(spec)
    except (ValueError, TypeError, OSError) as exc:
        raise ValueError(f"--cost-model: {exc}") from exc


def _check_output_path(path: str) -> None:
    """Fails before the work, not after it, when the plan file ``path`` cannot be written."""
    import errno
    import os
    from pathlib import Path

    if not path.endswith(".npz"):
        path += ".npz"  # what Plan.save writes
    folder = Path(path).parent
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not folder.is_dir():
        problem = "is not a directory" if folder.exists() else "does not exist"
        raise NotADirectoryError(errno.ENOTDIR, f"cannot write {path}: its folder {str(folder)!r} {problem}")


# ------------------------------------------------------------------------------------------------ lengths


def _read_lengths_records(path: Path) -> list[Mapping[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"records file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a records file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark is skipped
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON list of records ({exc})") from exc
    else:
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                records.extend([json.loads(line)] if line.strip() else [])
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {n} is not a JSON record ({exc.msg}, column {exc.colno})") from exc
    if not isinstance(records, list) or not records:
        raise ValueError(f"{path}: no records (expected a JSON list of objects or JSON Lines)")
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise ValueError(f"{path}: record {i} is not a JSON object")
    return records


def _record_fields(
    records: Sequence[Mapping[str, Any]], sizes_key: str, text_key: str, frames_key: str | None
) -> tuple[list[Any], list[Any], list[int] | None]:
    sizes: list[Any] = []
    text: list[Any] = []  # counts as given (a float is refused where the loads are checked)
    frames: list[int] = [] if frames_key else None  # type: ignore[assignment]
    for i, rec in enumerate(records):
        entry = rec.get(sizes_key)
        if entry is None and "width" in rec and "height" in rec:
            entry = [rec["width"], rec["height"]]
        sizes.append(entry)
        if text_key not in rec:
            raise ValueError(f"record {i}: no {text_key!r} field (text tokens, an int or a token list)")
        value = rec[text_key]
        if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
            raise ValueError(f"record {i}: {text_key!r} must be a token count or a token list, got {value!r}")
        text.append(len(value) if isinstance(value, (list, tuple)) else value)
        if frames is not None and frames_key is not None:
            frames.append(rec.get(frames_key, 1))
    return sizes, text, frames


def add_lengths_parser(subparsers: Any) -> None:
    """Adds the ``lengths`` subcommand to an ``argparse`` subparsers object."""
    from .raw_lengths.cli import add_arguments as add_raw_arguments
    from .vision.loads import MODELS

    p = subparsers.add_parser(
        "lengths",
        help="build a length file (vit/llm loads) from image sizes and text lengths",
        description="Read records (JSON list or JSON lines) with image sizes and text token counts and write the "
        "per-sample vit/llm loads and ViT sequence lengths (one per InternVL tile, one per Qwen2-VL "
        "image or video frame group) as an OmniBal .json, a .jsonl or an .npz length file.",
    )
    p.add_argument("input", type=Path, nargs="?", help="records: JSON list or JSON lines (raw data with --tokenizer)")
    p.add_argument("-o", "--output", type=Path, required=True, help="length file to write (.json, .jsonl or .npz)")
    p.add_argument("--model", choices=MODELS, default="internvl")
    p.add_argument(
        "--sizes-key",
        default="image_sizes",
        help="field with [width, height] or a list of them (else 'width'/'height' fields)",
    )
    p.add_argument("--text-key", default="text_tokens", help="field with the text token count or token list")
    p.add_argument("--frames-key", default=None, help="qwen2vl: field with frames per record (one video each)")
    p.add_argument("--num-image-token", type=int, default=256, help="internvl: LLM tokens per tile")
    p.add_argument("--min-num", type=int, default=1, help="internvl: fewest tiles")
    p.add_argument("--max-num", type=int, default=12, help="internvl: most tiles")
    p.add_argument("--image-size", type=int, default=448, help="internvl: tile side")
    p.add_argument("--no-thumbnail", dest="use_thumbnail", action="store_false", help="internvl: no thumbnail tile")
    p.add_argument("--patch-size", type=int, default=14, help="qwen2vl: ViT patch side")
    p.add_argument("--merge-size", type=int, default=2, help="qwen2vl: spatial merge")
    p.add_argument("--temporal-patch-size", type=int, default=2, help="qwen2vl: frames per temporal patch")
    p.add_argument("--min-pixels", type=int, default=56 * 56, help="qwen2vl: smart_resize min_pixels")
    p.add_argument("--max-pixels", type=int, default=28 * 28 * 1280, help="qwen2vl: smart_resize max_pixels")
    _add_no_progress(p)
    p.set_defaults(func=_run_lengths)
    add_raw_arguments(p)


def _run_lengths(args: argparse.Namespace) -> int:
    import numpy as np

    from .lengths import write_lengths
    from .vision.loads import compute_loads, flatten_image_sizes

    if getattr(args, "tokenizer", None) is not None or getattr(args, "merge", None):
        from .raw_lengths.cli import run as run_raw

        return run_raw(args)
    if args.input is None:
        raise ValueError("lengths: give the records file (or --tokenizer to count raw data, --merge to join parts)")
    records = _read_lengths_records(Path(args.input))
    try:  # errors in the records name the input file
        sizes, text, frames = _record_fields(records, args.sizes_key, args.text_key, args.frames_key)
        common = dict(
            model=args.model,
            num_image_token=args.num_image_token,
            min_num=args.min_num,
            max_num=args.max_num,
            image_size=args.image_size,
            use_thumbnail=args.use_thumbnail,
            patch_size=args.patch_size,
            merge_size=args.merge_size,
            temporal_patch_size=args.temporal_patch_size,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
            progress=args.progress,
        )
        if frames is not None:
            flat, owner = flatten_image_sizes(sizes, False)
            counts = np.bincount(owner, minlength=len(sizes)) if owner.size else np.zeros(len(sizes), np.int64)
            if (counts > 1).any():
                raise ValueError(
                    f"record {int(np.flatnonzero(counts > 1)[0])}: --frames-key needs one video per record"
                )
            loads = compute_loads(
                flat, text, image_to_sample=owner, num_frames=np.asarray(frames, dtype=np.int64)[owner], **common
            )
        else:
            loads = compute_loads(sizes, text, **common)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{args.input}: {exc}") from exc
    out = write_lengths(args.output, loads)
    print(f"wrote {len(text)} samples to {out}: vit total {int(loads.vit.sum())}, llm total {int(loads.llm.sum())}")
    return 0


# ------------------------------------------------------------------------------------------------ calibrate


def add_calibrate_parser(subparsers: Any) -> None:
    """Adds the ``calibrate`` subcommand to an ``argparse`` subparsers object."""
    from .calibration.models import TINY_MODELS
    from .calibration.timing import CLOCKS

    p = subparsers.add_parser(
        "calibrate",
        help="time a model on packed batches and write the cost model fitted to the times (JSON)",
        description="Time forward + backward of MODEL on varied packs of real loads and fit the six cost terms "
        "(seconds) by non-negative least squares on half of the packs; report the error on the other "
        "half beside that of the FLOP estimate of the same config, and write the terms as JSON (the "
        "file a cost model is read from). MODEL: a named tiny model "
        f"({', '.join(TINY_MODELS)}) or a folder holding a transformers config.json (random weights).",
    )
    p.add_argument("model", metavar="MODEL", help="named tiny model, or a folder holding config.json")
    p.add_argument("-o", "--output", type=Path, required=True, help="cost model JSON to write")
    p.add_argument(
        "--lengths",
        nargs="+",
        default=None,
        metavar="PATH",
        help="length files to draw the packs from (default: loads drawn from the bundled data)",
    )
    p.add_argument("--packs", type=int, default=80, help="packs to time (default 80: 40 fitted, 40 predicted)")
    p.add_argument("--samples", type=int, default=2000, help="samples drawn for the packs (without --lengths)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of every pack; the median is kept")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        default="auto",
        help="cuda events (GPU), wall, or thread CPU time (CPU, robust to other processes); auto: "
        "cuda on a GPU, wall on the CPU",
    )
    p.add_argument("--device", default=None, help="device of the model (default: cuda when available, else cpu)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="model dtype (default: bfloat16 on CUDA, float32 on the CPU)",
    )
    p.add_argument(
        "--image-scale",
        type=fraction,
        default=None,
        help="Qwen-VL images at this share of their resolution, in (0, 1] (default: 1, or the tiny model's own)",
    )
    p.add_argument("--holdout", type=float, default=0.5, help="share of packs predicted, not fitted (default 0.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the fit and the timing as one JSON object")
    _add_no_progress(p)
    p.set_defaults(func=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    from .calibration import calibrate
    from .calibration.models import check_device
    from .lengths import load_lengths

    check_device(args.device, "--device")

    folder = Path(args.output).parent
    if not folder.is_dir():
        raise NotADirectoryError(f"cannot write {args.output}: its folder {str(folder)!r} does not exist")
    lengths = load_lengths(*args.lengths) if args.lengths else None
    result = calibrate(
        args.model,
        lengths=lengths,
        num_packs=args.packs,
        num_samples=args.samples,
        repeats=args.repeats,
        warmup=args.warmup,
        clock=args.clock,
        holdout=args.holdout,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        image_scale=args.image_scale,
        progress=args.progress,
    )
    result.fit.model.to_json(args.output)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    timing, held, ref = summary["timing"], summary["heldout_error"], summary.get("reference_heldout_error")
    print(
        f"timed {timing['batches']} packs on {timing['device']} ({timing['clock']} clock, median of "
        f"{timing['repeats']}; runs of a pack spread {timing['spread_median']:.1%} median)"
    )
    if held is not None:
        line = (
            f"fitted on {summary['fit_packs']}, predicting {summary['heldout_packs']}: median error "
            f"{held['median']:.1%}"
        )
        if ref is not None:
            line += f" (FLOP estimate scaled to seconds: {ref['median']:.1%})"
        print(line)
    terms = ", ".join(f"{k} {v:.4g}" for k, v in summary["model"].items())
    print(f"cost model (seconds) written to {args.output}: {terms}")
    return 0


def _said(exc: Exception) -> str:
    """An error as one line: an OSError that carries its file says which file and what went wrong with it,
    never a bare ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None and str(exc.filename) not in exc.args:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split())


_PYTHON_SHOWWARNING = warnings.showwarning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Optional[TextIO] = None,
    line: Optional[str] = None,
) -> None:
    """The library's warnings as one line of the command line's own; other warnings as Python shows them."""
    from ._warnings import OmnibalWarning

    if issubclass(category, OmnibalWarning):
        print(f"omnibal-kernels: warning: {message}", file=sys.stderr)
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``omnibal-kernels``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, status 2) or --help (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.func(args))
    except (ValueError, TypeError, OSError) as exc:
        # Bad input (the project raises ValueError/TypeError naming it) or a file that cannot be read or
        # written: one line and status 2. Anything else is a defect and keeps its traceback.
        print(f"omnibal-kernels: error: {_said(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
