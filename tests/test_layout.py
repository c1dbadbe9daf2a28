"""The package's imports follow its layers: no cycles, no import that runs back up, lazy imports included.

Every ``import`` statement of every module is read (function bodies too), so a lazy import inside a function
counts like one at the top. A module may import a module of a lower layer, or one of its own subpackage
(``balance.*``, ``vision.*``, ...) as long as no cycle forms. The layers, from the bottom:
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "omnibal_kernels"

# Lowest first. A new module must be placed here (the test fails until it is).
LAYERS: list[tuple[str, ...]] = [
    # helpers that know nothing of the flow
    (
        "_ext",
        "_lazy",
        "_warnings",
        "_progress",
        "_checks",
        "_cli_args",
        "_files",
        "_shared_memory",
        "_csr",
        "_flops",
        "_tiny_models",
        "data",
    ),
    ("_contracts",),  # per op: argument checks and result types, shared by the kernels and their CPU twins
    ("cpu",),  # the CPU twins (numba, numpy, torch); never import ops/
    ("ops",),  # Triton kernels; CPU data goes down to cpu/
    ("attention",),  # varlen attention adapters
    ("context_parallel",),  # CP shards, their predicted times, CP attention (below the planner and the collator)
    ("lengths",),  # per-sample loads
    ("vision", "model_inputs"),  # counts, loads, buckets, mrope, batch fields; what a transformers model reads
    ("context_parallel.models",),  # a transformers model prepared for CP shards (reads what the model takes)
    ("balance",),  # planning
    ("context_parallel.report",),  # a plan's packs priced per CP rank (the CP package's one module above planning)
    ("synthetic", "pipeline"),  # load distributions; model and memory balance (pipeline partitions)
    ("sampler", "streaming"),  # samplers over plans
    ("packing",),  # pack_batch (calls vision.fields and cpu.varlen_metadata)
    ("calibration", "loss"),  # models timed on packed batches and cost models fitted to them; the loss of a
    # packed micro-step over its optimizer step (counts from the plan or one all-reduce)
    ("hf", "testing", "raw_lengths"),  # integrations, references and tiny models, length files from raw data
    ("omniverse",),  # data, model and memory balance composed in one simulated run
    ("bench",),  # the benchmarks suite (measures everything below)
    ("cli",),  # every subcommand
    ("__main__", "__init__"),  # entry points
]


# Modules of a package that sit on a layer of their own, above the rest of their package.
_OWN_LAYER = ("context_parallel.report", "context_parallel.models")


def _unit(module: str) -> str:
    """The layer unit of a dotted module name relative to the package (``balance.plan`` -> ``balance``)."""
    for own in _OWN_LAYER:
        if module == own or module.startswith(own + "."):
            return own
    return module.split(".")[0]


def _layer(module: str) -> int:
    unit = _unit(module)
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"omnibal_kernels.{module} is in no layer of tests/test_layout.py: place it there")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Package modules that ``module`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    if module == "__init__":
        base = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("omnibal_kernels"):
                target = node.module[len("omnibal_kernels") :].lstrip(".")
            else:
                continue
            names = [f"{target}.{a.name}" if target else a.name for a in node.names] + [target]
        elif isinstance(node, ast.Import):
            names = [
                a.name[len("omnibal_kernels") :].lstrip(".") for a in node.names if a.name.startswith("omnibal_kernels")
            ]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            continue  # the lazy re-exports of __init__ files: checked through _EXPORTS below
        for name in names:
            # the longest known module the name refers to ("ops.unpad.unpad" -> "ops.unpad")
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                candidate = ".".join(parts[:k])
                if candidate in known and candidate != module:
                    found.add(candidate)
                    break
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(m, p, known) for m, p in modules.items()}


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_no_import_runs_back_up() -> None:
    bad = []
    for module, targets in _graph().items():
        for target in targets:
            same_package = _unit(module) == _unit(target) and "." in module
            if _layer(target) > _layer(module) or (
                _layer(target) == _layer(module) and not same_package and _unit(target) != _unit(module)
            ):
                bad.append(f"{module} -> {target}")
    assert not bad, "imports that run back up (or sideways) the flow:\n" + "\n".join(sorted(bad))


def test_no_import_cycles() -> None:
    graph = _graph()
    # a subpackage's __init__ re-exports its modules; edges into it from its own modules would be cycles
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_check_sees_lazy_imports_and_cycles(tmp_path: Path) -> None:
    """Negative control: a lazy import inside a function is an edge, and a cycle through it is found."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from .b import g\n    return g\n")
    b = tmp_path / "b.py"
    b.write_text("from .a import f\n")
    known = {"a", "b"}
    assert _imports("a", a, known) == {"b"}
    assert _imports("b", b, known) == {"a"}


def test_public_names_resolve_to_their_modules() -> None:
    import importlib

    import omnibal_kernels as ok

    assert set(ok.__all__) == {"__version__", *ok._EXPORTS}
    for name, module in ok._EXPORTS.items():
        defined = getattr(importlib.import_module(f"omnibal_kernels.{module}"), name)
        # the lazy export hands out the very object of the module it names, and lists it
        assert getattr(ok, name) is defined, name
        assert name in dir(ok)
