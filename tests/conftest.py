"""Shared test setup: the ``gpu`` marker skips without CUDA; nothing here touches CUDA at import."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator

import pytest
from hypothesis import seed, settings

from omnibal_kernels.sampler.epochs import PLAN_AHEAD_THREAD

# CI runs the property tests on a fixed seed, so a submission's result does not depend on the draw; local
# runs keep exploring new examples (and store failures in .hypothesis/ to replay).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
# OMNIBAL_HYPOTHESIS_SEED=N loads the "seeded" profile and draws every hypothesis test from seed N (the property
# tests are marked ``property``): CI reruns them on a few extra seeds, each run reproducible from its seed.
settings.register_profile("seeded", derandomize=False, database=None, print_blob=True)
_SEED = os.environ.get("OMNIBAL_HYPOTHESIS_SEED")
if _SEED:
    settings.load_profile("seeded")


def _hypothesis_tests(items: list[pytest.Item]) -> list[tuple[pytest.Item, object]]:
    found = []
    for item in items:
        obj = getattr(item, "obj", None)
        test = getattr(obj, "__func__", obj)
        if getattr(test, "is_hypothesis_test", False):
            found.append((item, test))
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # every hypothesis test is a property test, marked or not, so that ``-m property`` selects them all;
    # this runs before ``-m`` deselects
    for item, test in _hypothesis_tests(items):
        item.add_marker(pytest.mark.property)
        if _SEED:
            seed(int(_SEED))(test)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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


# A test marked ``alone`` times CPU work against a prediction: under pytest-xdist it runs with no other test
# computing. Every test holds the run's lock shared; an ``alone`` test waits for it exclusively, and the gate in
# front of it keeps new tests from starting meanwhile (else a worker that takes the shared lock again as soon as
# it lets go could keep the exclusive one waiting for ever). A test lets go only once the epochs its samplers
# plan ahead on background threads are planned, so that no such plan runs beside an ``alone`` test either.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")


@contextlib.contextmanager
def _locked(name: str, mode: int) -> Iterator[None]:
    with open(os.path.join(tempfile.gettempdir(), f"omnibal-tests-{_RUN}.{name}"), "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _alone_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    if not _RUN:
        yield
        return
    if request.node.get_closest_marker("alone"):
        with _locked("gate", fcntl.LOCK_EX), _locked("run", fcntl.LOCK_EX):
            yield
        return
    with _locked("gate", fcntl.LOCK_SH):
        pass
    with _locked("run", fcntl.LOCK_SH):
        yield
        _join_plans_ahead()


def _join_plans_ahead() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith(PLAN_AHEAD_THREAD):
            thread.join()
