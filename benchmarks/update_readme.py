"""Puts the suite's Markdown report into ``benchmarks/README.md``, between the results markers.

    omnibal-kernels bench --json benchmarks/results/latest.json --markdown benchmarks/results/latest.md \
        --plot benchmarks/results
    python benchmarks/update_readme.py [benchmarks/results/latest.md]

The table in the README is then the suite's own output, never typed by hand. Headings of the report move
one level down to sit under the README's "Latest results".
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


def splice(readme: str, report: str) -> str:
    """``readme`` with the text between the markers replaced by ``report``."""
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        raise ValueError(f"README must hold one {START} before one {END}")
    head, rest = readme.split(START)
    _, tail = rest.split(END)
    body = "\n".join("#" + line if line.startswith("###") else line for line in report.strip().splitlines())
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv: list[str]) -> int:
    report = Path(argv[0]) if argv else HERE / "results" / "latest.md"
    readme = HERE / "README.md"
    text = splice(readme.read_text(), report.read_text())
    tmp = readme.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(readme)
    print(f"{readme}: results from {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
