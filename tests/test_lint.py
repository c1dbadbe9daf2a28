"""The linter, the formatters and the type checker, as configured in ``pyproject.toml`` and ``.clang-format``,
find nothing in the checkout.

Each runs from the repository root, as CI runs it, when it is installed; the test is skipped, saying which is
missing, when it is not.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _command(name: str) -> list[str]:
    """How to run ``name``: its module under this interpreter, else its executable; skips when neither exists."""
    if importlib.util.find_spec(name) is not None:
        return [sys.executable, "-m", name]
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return [found]


def _csrc() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").iterdir() if p.suffix in (".cpp", ".hpp"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "tool, arguments",
    [
        ("ruff", ["check"]),
        ("ruff", ["format", "--check"]),
        ("mypy", []),
        ("clang-format", ["--dry-run", "--Werror", *_csrc()]),
    ],
    ids=["ruff-check", "ruff-format", "mypy", "clang-format"],
)
def test_tool_reports_nothing(tool: str, arguments: list[str]) -> None:
    result = subprocess.run([*_command(tool), *arguments], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{tool} {' '.join(arguments)} failed:\n{result.stdout}\n{result.stderr}"
