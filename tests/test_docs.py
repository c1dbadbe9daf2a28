"""Every ```python block of the guides in docs/guides/ runs as written and its asserts hold: a page's blocks run in
order in one namespace, each compiled at its line in the page, so a failure points into the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDES = Path(__file__).resolve().parents[1] / "docs" / "guides"
PAGES = sorted(GUIDES.glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def _blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for every python block of a page."""
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_guides_have_snippets() -> None:
    assert PAGES, "docs/guides has no page"
    assert any(_blocks(page.read_text(encoding="utf-8")) for page in PAGES)


# Pages whose snippets start processes (seconds, not milliseconds).
SLOW_PAGES = {"vlm-context-parallel.md"}


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=pytest.mark.slow) if page.name in SLOW_PAGES else page for page in PAGES],
    ids=[page.name for page in PAGES],
)
def test_guide_snippets_run(page: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs.guides.{page.stem}"}
    for line, code in _blocks(page.read_text(encoding="utf-8")):
        exec(compile("\n" * line + code, str(page), "exec"), namespace)
