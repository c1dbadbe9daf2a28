"""Every function of the package is one step: at most 100 lines of code.

The rule: a function's lines of code are the lines from the first statement of its body (after the docstring)
to its last line, less the blank lines and the lines that hold only a comment. The signature, the decorators and
the docstring do not count. Functions, methods and nested functions are all measured; a nested function's lines
count in the function around it too (it is part of that step).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "omnibal_kernels"
MAX_LINES = 100

Function = (ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every docstring (of the module, classes and functions) of ``tree``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, *Function)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return out


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], docstrings: set[int]) -> int:
    """Lines of code of ``node``'s body (the rule of the module docstring)."""
    start = node.body[0].lineno
    first = node.body[0]
    if isinstance(first, (*Function, ast.ClassDef)) and first.decorator_list:
        start = first.decorator_list[0].lineno
    code = 0
    for number in range(start, (node.end_lineno or start) + 1):
        stripped = lines[number - 1].strip()
        if stripped and not stripped.startswith("#") and number not in docstrings:
            code += 1
    return code


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines of code)`` of every function of ``source`` over ``limit``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    docstrings = _docstring_lines(tree)
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Function):
                name = f"{prefix}{child.name}"
                n = _code_lines(child, lines, docstrings)
                if n > limit:
                    found.append((name, child.lineno, n))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_no_function_over_100_lines_of_code() -> None:
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, line, n in long_functions(path.read_text()):
            over.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}: {n} lines of code")
    assert not over, f"functions over {MAX_LINES} lines of code (split them into steps):\n" + "\n".join(over)


def _function(code_lines: int, *, docstring: bool = True, filler: bool = True) -> str:
    body = ['    """A docstring', "", "    of several lines.", '    """'] if docstring else []
    for i in range(code_lines):
        body.append(f"    x{i} = {i}")
        if filler:
            body += ["", "    # a comment", "        # an indented comment"]
    return "def f():\n" + "\n".join(body) + "\n"


def test_the_rule_counts_code_lines_only() -> None:
    """Negative control: 101 lines of code fail, 100 pass, whatever the docstring, blank and comment lines."""
    assert long_functions(_function(100)) == []
    assert long_functions(_function(101)) == [("f", 1, 101)]
    assert long_functions(_function(101, docstring=False, filler=False)) == [("f", 1, 101)]
    # methods and nested functions are measured, and a nested function counts in the one around it
    nested = "class C:\n    def g(self):\n" + "\n".join("        " + line for line in _function(101).splitlines())
    assert long_functions(nested) == [("C.g", 2, 102), ("C.g.f", 3, 101)]
    # a statement over several lines counts each of its lines
    assert long_functions("def f():\n    return (\n" + "        1,\n" * 100 + "    )\n") == [("f", 1, 102)]
