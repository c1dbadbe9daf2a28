"""``omnibal-kernels bench``: runs the suite, prints the Markdown report, writes JSON, Markdown and PNGs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .runner import PROVIDER_NAMES

__all__ = ["add_bench_parser", "write_atomic", "check_plot_dependency"]


def add_bench_parser(sub: Any) -> None:
    """Adds the ``bench`` subcommand to the CLI's subparsers."""
    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite: balance quality, simulated and measured training speed-up, planning, "
        "collate, GPU kernels",
        description="Run the benchmark suite and print its Markdown report (progress goes to stderr).",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes: within 3 minutes on 2 CPU cores")
    bench.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the report as JSON")
    bench.add_argument("--markdown", default=None, metavar="PATH", help="write the Markdown report")
    bench.add_argument("--plot", default=None, metavar="DIR", help="write PNG pictures (needs matplotlib)")
    bench.add_argument(
        "--only",
        nargs="+",
        choices=PROVIDER_NAMES,
        default=None,
        metavar="NAME",
        help=f"run only these parts ({', '.join(PROVIDER_NAMES)})",
    )
    bench.add_argument(
        "--paper-page",
        default=None,
        metavar="PATH",
        help="with the omniverse part: write the page 'Reproducing the paper' (and, with matplotlib, its plot in "
        "img/ beside it)",
    )
    bench.add_argument(
        "--docs-page",
        default=None,
        metavar="PATH",
        help="write the docs page of results (docs/benchmarks.md), its header naming machine, date and commit, "
        "and, with matplotlib, its pictures in img/benchmarks/ beside it",
    )
    bench.add_argument(
        "--from-json",
        default=None,
        metavar="PATH",
        help="write the outputs from a report saved with --json instead of running the suite",
    )
    bench.add_argument("--seed", type=int, default=None, help="seed of every draw and plan (default 0)")
    bench.set_defaults(func=run_bench)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file in the same folder, then renames it."""
    from .._files import atomic_write

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(target, "w") as f:
        f.write(text)


def check_plot_dependency() -> None:
    """Raises ``ValueError`` (a one-line CLI error) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'omnibal_kernels[plot]'") from None


def _write_paper_page(report: dict[str, Any], path: Path) -> None:
    from .omniverse import paper_page

    if "omniverse" not in report:
        raise ValueError("--paper-page needs the omniverse part (--only omniverse, or no --only)")
    image = None
    try:
        from .plots import plot_omniverse_steps

        plot_omniverse_steps(report, _mkdir(path.parent / "img") / "omniverse_steps.png")
        image = "img/omniverse_steps.png"
    except ImportError:
        print("[bench] no matplotlib: the page is written without its plot", file=sys.stderr)
    write_atomic(path, paper_page(report, image))
    print(f"[bench] wrote {path}", file=sys.stderr)


def _write_docs_page(report: dict[str, Any], path: Path) -> None:
    from .markdown import docs_page

    images: list[str] = []
    try:
        from .plots import plot_report

        folder = path.parent / "img" / "benchmarks"
        images = [p.relative_to(path.parent).as_posix() for p in plot_report(report, folder)]
    except ImportError:
        print("[bench] no matplotlib: the page is written without its pictures", file=sys.stderr)
    write_atomic(path, docs_page(report, sorted(images, key=_image_order)))
    print(f"[bench] wrote {path}", file=sys.stderr)


def _image_order(image: str) -> int:
    from .markdown import DOCS_PAGE_IMAGES

    names = list(DOCS_PAGE_IMAGES)
    name = image.rsplit("/", 1)[-1]
    return names.index(name) if name in names else len(names)


def _load_report(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """A report saved with ``--json``; the options that choose what to run do not apply to it."""
    given = [
        flag
        for flag, value in (
            ("--only", args.only is not None),
            ("--quick", args.quick),
            ("--seed", args.seed is not None),
        )
        if value
    ]
    if given:
        raise ValueError(f"--from-json writes a saved report: {', '.join(given)} cannot apply to it")
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--from-json {path}: not a report saved with --json ({e})") from None
    if not isinstance(report, dict) or "environment" not in report:
        raise ValueError(f"--from-json {path}: not a report saved with --json (no 'environment')")
    return report


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_bench(args: argparse.Namespace) -> int:
    from .markdown import to_markdown
    from .runner import run_suite

    if args.plot:
        check_plot_dependency()  # before minutes of benchmarks, not after
    if args.paper_page and args.only and "omniverse" not in args.only:
        raise ValueError("--paper-page needs the omniverse part (--only omniverse, or no --only)")
    if args.from_json:
        report = _load_report(args.from_json, args)
    else:
        seed = 0 if args.seed is None else args.seed
        report = run_suite(args.only, quick=args.quick, seed=seed, log=lambda line: print(line, file=sys.stderr))
    text = to_markdown(report)
    if args.json_path:
        write_atomic(args.json_path, json.dumps(report, indent=1))
    if args.markdown:
        write_atomic(args.markdown, text)
    if args.plot:
        from .plots import plot_report

        for path in plot_report(report, args.plot):
            print(f"[bench] wrote {path}", file=sys.stderr)
    if args.paper_page:
        _write_paper_page(report, Path(args.paper_page))
    if args.docs_page:
        _write_docs_page(report, Path(args.docs_page))
    print(text)
    return 0
