"""Shared test setup: the ``gpu`` marker skips without CUDA; nothing here touches CUDA at import."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed seed, so a submission's result does not depend on the draw; local
# runs keep exploring new examples (and store failures in .hypothesis/ to replay).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    # Without CUDA, Triton kernels run in the interpreter on CPU tensors. The variable is read when a
    # kernel is decorated, so it is set here, before any test module imports omnibal_kernels.ops.
    if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
