"""``omnibal-kernels lengths DATA --tokenizer PATH --model M``: the raw-data mode of the ``lengths`` subcommand.

:func:`add_arguments` adds this mode's options to the ``lengths`` parser; its ``run`` sends a parsed command
here when ``--tokenizer`` or ``--merge`` is given. The counting options of the plain ``lengths`` mode
(``--max-num``, ``--min-pixels``, ...) keep their meaning here as overrides of the settings read from the
folder, but only when given on the command line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from .._checks import check_positive_int
from .api import lengths_from_raw, parse_shard
from .issues import ON_ERROR
from .media import pil_pixel_limit
from .merge import merge_length_parts
from .options import DEFAULT_MAX_FRAMES, CountOptions
from .result import RawLengths

__all__ = ["add_arguments", "run"]

# the plain mode's options (dest) -> the ModelSpec field they override in raw mode
_OVERRIDABLE = {
    "num_image_token": "num_image_token",
    "min_num": "min_num",
    "max_num": "max_num",
    "image_size": "image_size",
    "patch_size": "patch_size",
    "merge_size": "merge_size",
    "temporal_patch_size": "temporal_patch_size",
    "min_pixels": "min_pixels",
    "max_pixels": "max_pixels",
}


class _ParserDefault(int):
    """An option's default: behaves as the int it is, and tells raw mode that the option was not given."""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the raw-data options to the ``lengths`` parser (which already has ``input``, ``-o`` and ``--model``)."""
    g = parser.add_argument_group(
        "raw data (with --tokenizer)",
        "Count LLaVA / InternVL-Chat / ShareGPT / OpenAI-style records (JSON or JSON Lines) with the model's own "
        "tokenizer, chat template and image-processor settings, all read from the --tokenizer folder. "
        "Image sizes come from file headers; video frames from the record or PyAV.",
    )
    g.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="folder saved by save_pretrained (tokenizer, chat template, preprocessor_config.json)",
    )
    g.add_argument("--image-root", type=Path, default=None, help="folder that relative media paths start from")
    g.add_argument("--max-length", type=int, default=None, help="samples with more LLM tokens are a problem")
    g.add_argument(
        "--on-error",
        choices=ON_ERROR,
        default="error",
        help="error: stop at the first problem sample (default); skip: leave problem samples out; "
        "report: keep the samples whose loads are defined (placeholder count, max length). "
        "Every problem is listed in OUTPUT's .report.json with its sample index",
    )
    g.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU)")
    g.add_argument("--chunk-size", type=int, default=1024, help="samples per chunk (default 1024)")
    g.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="count only the I-th of N slices and write it as a part (-o part.npz)",
    )
    g.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        metavar="PART",
        help="join the parts of all N shards into one length file (-o)",
    )
    g.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="finished chunks are kept here, so a run that dies resumes (default: OUTPUT.chunks, "
        "removed after success and started over when it holds another run's chunks)",
    )
    g.add_argument(
        "--max-frames",
        type=int,
        default=DEFAULT_MAX_FRAMES,
        help="a sample whose videos give the model more frames (after the video processor's sampling) "
        f"is a problem of kind over_max_frames (default {DEFAULT_MAX_FRAMES}; bounds memory)",
    )
    g.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        help="an image or video frame with more pixels is a problem of kind over_max_image_pixels "
        "(default: PIL's decompression-bomb limit, 2 * PIL.Image.MAX_IMAGE_PIXELS; a larger value "
        "raises PIL's limit in this process)",
    )
    g.add_argument("--trust-remote-code", action="store_true", help="for tokenizers with their own code")
    g.add_argument(
        "--add-special-tokens",
        choices=("auto", "yes", "no"),
        default="auto",
        help="the tokenizer adds its BOS/EOS to the rendered chat: auto (default) unless the chat "
        "already starts with BOS, as the processor's apply_chat_template does",
    )
    g.add_argument(
        "--exif-transpose",
        action="store_true",
        help="swap width and height of EXIF-rotated images (as transformers' load_image)",
    )
    g.add_argument(
        "--labels",
        choices=("auto", "yes", "no"),
        default="auto",
        help="count each sample's label tokens (label_num / label in OUTPUT): the tokens the chat "
        "template marks for training with {%% generation %%} blocks, the first token left out; auto "
        "(default): when the template marks them; yes: stop if it does not",
    )
    parser.set_defaults(
        **{
            dest: _ParserDefault(parser.get_default(dest))
            for dest in _OVERRIDABLE
            if isinstance(parser.get_default(dest), int)
        }
    )
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    out = {
        field: getattr(args, dest)
        for dest, field in _OVERRIDABLE.items()
        if hasattr(args, dest) and not isinstance(getattr(args, dest), _ParserDefault)
    }
    if getattr(args, "use_thumbnail", True) is False:
        out["use_thumbnail"] = False
    return {k: int(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in out.items()}


def _allow_image_pixels(limit: int | None) -> None:
    """Raise PIL's decompression-bomb limit of this process to ``--max-image-pixels`` when that is larger:
    the option is the bound the user chose for the run."""
    if limit is None:
        return
    limit = check_positive_int("--max-image-pixels", limit)
    current = pil_pixel_limit()
    if current is not None and limit > current:
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = limit  # PIL warns above this and refuses above twice this


def _summary(result: RawLengths, out: Path, extra: str = "") -> None:
    total = result.stop - result.start
    labels = "" if result.label is None else f", label total {int(result.label.sum()):,}"
    print(
        f"wrote {result.index.shape[0]:,} of {total:,} samples to {out}: vit total {int(result.vit.sum()):,}, "
        f"llm total {int(result.llm.sum()):,}{labels}{extra}"
    )
    counts = {k: v for k, v in result.counts().items() if v}
    if counts:
        skipped = result.skipped.shape[0]
        print(
            f"omnibal-kernels: {sum(counts.values()):,} problem(s): "
            + ", ".join(f"{k} {v:,}" for k, v in counts.items())
            + f"; {skipped:,} sample(s) left out (indices in the report)",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    """Run raw mode (``--tokenizer``) or merge mode (``--merge``) of ``lengths``; returns the exit status."""
    output = Path(args.output)
    if args.merge:
        if args.tokenizer is not None or args.input is not None or args.shard is not None:
            raise ValueError("--merge takes only the parts and -o (no DATA, --tokenizer or --shard)")
        result = merge_length_parts(args.merge)
        out, report = result.write(output)
        _summary(result, out, f" (report: {report})")
        return 0
    if args.input is None:
        raise ValueError("lengths: give the DATA file to count")
    shard = None if args.shard is None else parse_shard(args.shard)
    if shard is not None and output.suffix != ".npz":
        raise ValueError(f"--shard writes one part for --merge: give -o a .npz path, got {str(output)!r}")
    work_dir = args.work_dir if args.work_dir is not None else output.with_name(output.name + ".chunks")
    _allow_image_pixels(args.max_image_pixels)
    options = CountOptions(
        model=args.model,
        image_root=args.image_root,
        max_length=args.max_length,
        on_error=args.on_error,
        trust_remote_code=args.trust_remote_code,
        add_special_tokens={"auto": None, "yes": True, "no": False}[args.add_special_tokens],
        exif_transpose=args.exif_transpose,
        overrides=_overrides(args),
        max_frames=args.max_frames,
        max_image_pixels=args.max_image_pixels,
        labels={"auto": None, "yes": True, "no": False}[args.labels],
    )
    result = lengths_from_raw(
        args.input,
        args.tokenizer,
        options,
        num_workers=args.workers,
        chunk_size=args.chunk_size,
        shard=shard,
        work_dir=work_dir,
        stale_work_dir="error" if args.work_dir is not None else "restart",
        progress=None if args.progress else False,
    )
    if result.label is None and args.labels == "auto":
        print(
            f"omnibal-kernels: no label tokens counted: the chat template of {args.tokenizer} marks no text for "
            "training ({% generation %} blocks) or the tokenizer gives no offsets",
            file=sys.stderr,
        )
    if shard is not None:
        out = result.save_part(output)
        _summary(result, out, f" (shard {shard[0]}/{shard[1]}: samples {result.start}..{result.stop - 1})")
    else:
        out, report = result.write(output)
        _summary(result, out, f" (report: {report})")
    if args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0
