"""Every ```python block of the guides in docs/guides/ runs as written (each page's blocks in order, in one
namespace) and asserts what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDES = sorted((Path(__file__).resolve().parents[1] / "docs" / "guides").glob("*.md"))


@pytest.mark.parametrize("page", GUIDES, ids=[p.stem for p in GUIDES])
def test_guide_snippets_run(page: Path) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.M | re.S)
    assert blocks, f"{page.name} has no python block"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
