"""docs/guides/planning-bound.md: its Python blocks run as written, in order, and assert what they claim."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "planning-bound.md"


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` blocks of a Markdown page, dedented (blocks inside list items are indented)."""
    pattern = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
    return [textwrap.dedent(m.group(2)) for m in pattern.finditer(text)]


def test_the_page_runs_as_written() -> None:
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    assert namespace["report4"].bound_over_ideal < namespace["report"].bound_over_ideal
