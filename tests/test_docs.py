"""Every ```python block of README.md and of the pages under docs/ runs as written and its asserts hold.

A page's blocks run in order in one namespace, each compiled at its line in the page (a failure points into the
page), with a fresh temporary folder as the working directory (a snippet may write files). Blocks in any other
fence (```bash, ```text, a bare ```) are not run. A python block is held back only by a marker on the line
right above its fence:

- ``<!-- docs-test: skip REASON -->``: not run here; the reason says why and what runs it instead (a process
  group, a GPU machine, another test that executes the block with its own inputs);
- ``<!-- docs-test: gpu -->``: run only where CUDA is available (put such blocks after the page's CPU ones).

A page with a line ``<!-- docs-test: slow -->`` anywhere is marked ``slow`` (it trains a model, say).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
_MARKER = re.compile(r"<!-- docs-test: (\w+)(.*?) -->")
_SLOW = "<!-- docs-test: slow -->"
# fences that hold Python under another name would never run: the page must say ```python
_PYTHON_ALIASES = {"py", "python3", "pycon", "ipython", "Python"}


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _marker(text: str, fence_start: int) -> tuple[str, str] | None:
    """The ``docs-test`` marker on the line above the fence at ``fence_start``, as ``(kind, reason)``."""
    above = text[:fence_start].rstrip("\n").rsplit("\n", 1)[-1]
    match = _MARKER.fullmatch(above.strip())
    return (match.group(1), match.group(2).strip()) if match else None


def _blocks(text: str) -> list[tuple[int, str, tuple[str, str] | None]]:
    """``(line of the first code line, code, marker)`` for every python block of a page."""
    return [
        (text.count("\n", 0, m.start(2)), m.group(2), _marker(text, m.start()))
        for m in _FENCE.finditer(text)
        if m.group(1) == "python"
    ]


def _param(page: Path) -> object:
    slow = any(line.strip() == _SLOW for line in page.read_text(encoding="utf-8").splitlines())
    return pytest.param(page, id=_name(page), marks=[pytest.mark.slow] if slow else [])


def test_the_pages_have_snippets() -> None:
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 1
    assert _blocks((ROOT / "README.md").read_text(encoding="utf-8")), "README.md has no python block"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_markers_are_well_formed(page: Path) -> None:
    """A marker sits above a python fence and a skip gives its reason; python hides under no other fence name."""
    text = page.read_text(encoding="utf-8")
    marked = {m.start() for m in _FENCE.finditer(text) if m.group(1) == "python" and _marker(text, m.start())}
    offset = 0
    for line in text.splitlines(keepends=True):  # a marker is a line of its own (a page may quote one inline)
        m = _MARKER.fullmatch(line.strip())
        offset += len(line)
        if m is None or m.group(0) == _SLOW:
            continue
        kind, reason = m.group(1), m.group(2).strip()
        assert kind in ("skip", "gpu"), f"{_name(page)}: unknown marker {m.group(0)}"
        assert kind != "skip" or reason, f"{_name(page)}: a skip without its reason"
        assert offset in marked, f"{_name(page)}: {m.group(0)} is not right above a ```python fence"
    for m in _FENCE.finditer(text):
        assert m.group(1) not in _PYTHON_ALIASES, f"{_name(page)}: write ```python, not ```{m.group(1)}"


@pytest.mark.parametrize("page", [_param(page) for page in PAGES])
# the Trainer pins memory by default and torch says so where there is no accelerator
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator:UserWarning")
def test_page_snippets_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem.replace('-', '_')}"}
    for line, code, marker in _blocks(page.read_text(encoding="utf-8")):
        if marker is not None and (marker[0] == "skip" or not torch.cuda.is_available()):
            continue
        exec(compile("\n" * line + code, str(page), "exec"), namespace)


def test_the_api_pages_are_current() -> None:
    """docs/api/ holds one entry per public class and function, at its module: regenerate with
    ``python tests/docs_api.py`` when the public API changes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_api", Path(__file__).with_name("docs_api.py"))
    assert spec is not None and spec.loader is not None
    docs_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_api)
    API, want = docs_api.API, docs_api.pages()
    assert sorted(p.name for p in API.glob("*.md")) == sorted(want)
    for name, text in want.items():
        assert (API / name).read_text(encoding="utf-8") == text, f"docs/api/{name} is stale: python tests/docs_api.py"


def test_ci_runs_the_readmes_test_command_and_builds_the_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    command = re.search(r'pip install -e "\.\[test\]" && (python -m pytest[^\n]*)', readme)
    assert command and command.group(1) == "python -m pytest -n auto"
    assert "python3 -m pytest -q -n auto" in ci  # the same, quiet
    assert any(line.startswith("python3 -m mkdocs build --strict") for line in ci)
    assert '-m "not slow"' in readme
