"""Loads the compiled extension ``omnibal_kernels._C`` once, with a clear message when it is missing."""

from __future__ import annotations

from types import ModuleType

_module: ModuleType | None = None
_error: ImportError | None = None


def load() -> ModuleType:
    """Return ``omnibal_kernels._C``; raise an ImportError that says how to build it if it is missing."""
    global _module, _error
    if _module is not None:
        return _module
    if _error is None:
        try:
            from . import _C  # type: ignore[attr-defined, unused-ignore]  # _C exists only once built

            _module = _C
            return _module
        except ImportError as exc:  # keep the cause, raise only when _C is actually needed
            _error = exc
    raise ImportError(
        "omnibal_kernels._C (the C++ balance engine) is not built. Install the package with "
        "`pip install .` (or `pip install -e .`), or build in place with "
        "`python setup.py build_ext --inplace`. Original error: " + str(_error)
    ) from _error
