"""Every warning the library gives is an OmnibalWarning, so users and this suite can hold it to account."""

from __future__ import annotations

import ast
import inspect
import pathlib
import warnings

import numpy as np
import pytest

import omnibal_kernels as ok
from omnibal_kernels import _warnings

PACKAGE = pathlib.Path(ok.__file__).parent
CATEGORIES = {
    name for name, value in vars(_warnings).items() if inspect.isclass(value) and issubclass(value, ok.OmnibalWarning)
}


def _warn_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("warnings.warn", "warn"):
                calls.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return calls


def test_every_warning_of_the_package_names_a_library_category():
    calls = _warn_calls()
    assert calls, "the package gives warnings; finding none means this scan is broken"
    wrong = []
    for where, call in calls:
        given = (
            call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "category"), None)
        )
        if given is None or ast.unparse(given) not in CATEGORIES:
            wrong.append(where)
    assert not wrong, f"warnings without an OmnibalWarning category: {wrong}"


def test_categories_are_one_family_exported_at_the_top_level():
    for name in CATEGORIES:
        assert issubclass(getattr(ok, name), ok.OmnibalWarning)
    assert issubclass(ok.OmnibalWarning, UserWarning)


def test_a_user_can_make_them_errors_by_the_base_category():
    lengths = ok.Lengths(vit=np.array([1, 1, 1, 40]), llm=np.array([100, 100, 100, 4000]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ok.OmnibalWarning)
        with pytest.raises(ok.CapacityWarning, match="raised"):
            ok.search_capacity(lengths, ok.PlanOptions(target_batch_size=2), world_size=1)
