"""The guarantees guide (docs/guides/guarantees.md) names tests that exist: every promise stays tied to a test that
runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _guarantees_section() -> str:
    text = (ROOT / "docs" / "guides" / "guarantees.md").read_text(encoding="utf-8")
    match = re.match(r"# Guarantees\n(.*)", text, flags=re.S)
    assert match, "docs/guides/guarantees.md does not start with '# Guarantees'"
    return match.group(1)


def _cited_tests(section: str) -> list[tuple[str, str]]:
    """``(file, test)`` pairs; a bare ``::test`` belongs to the file cited last."""
    cited, current = [], None
    for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", section):
        current = path or current
        assert current, f"::{name} cited before any file"
        cited.append((current, name))
    return cited


def test_every_promise_cites_tests_that_exist():
    section = _guarantees_section()
    promises = re.split(r"^- ", section, flags=re.M)[1:]
    assert len(promises) >= 5
    for promise in promises:
        assert _cited_tests(promise), f"a promise without tests: {promise[:60]!r}"
    for path, name in _cited_tests(section):
        source = ROOT / path
        assert source.is_file(), f"{path} does not exist"
        functions = {
            node.name
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef)
        }
        assert name in functions, f"{path} has no {name}"
