"""Lazy re-exports for package ``__init__`` files: a name is imported from its module on first use."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any, Callable


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any], subpackages: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to its module (relative to the
    package); the first lookup imports that module and caches the name in ``namespace`` (the package's globals).
    ``subpackages`` are modules of the package reachable as attributes (``package.pipeline``), imported on first
    use. ``__dir__`` lists the public names, the subpackages and ``__version__`` where the package has one."""
    modules = frozenset(subpackages)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            if name in modules:
                value = importlib.import_module(f".{name}", package)
                namespace[name] = value
                return value
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | modules | ({"__version__"} & set(namespace)))

    return __getattr__, __dir__
