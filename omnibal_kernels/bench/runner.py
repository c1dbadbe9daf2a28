"""The suite's runner: providers registered by name, run in order, their results merged into one report.

A provider is a function ``(config) -> dict``; the keys it returns become top-level keys of the report
(``simulated_speedup``, ``planning``, ...). ``run_suite`` records each provider's wall time and the
environment next to them.
"""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["Config", "PROVIDER_NAMES", "register", "provider", "run_suite", "environment"]


@dataclass(frozen=True)
class Config:
    """What every provider is told.

    Attributes:
        quick: the small sizes (the whole suite within 3 minutes on 2 CPU cores), else the full ones.
        seed: seed of every draw and plan.
        log: where progress lines go (``None``: nowhere).
    """

    quick: bool = False
    seed: int = 0
    log: Optional[Callable[[str], None]] = None

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)


Provider = Callable[[Config], dict]

# provider name -> module (relative to this package) that registers it; the order is the run order
_MODULES: dict[str, str] = {
    "quality": "quality",
    "targets": "targets",
    "cp": "context_parallel",
    "planning": "planning",
    "collate": "collate",
    "ddp": "ddp",
    "gpu": "gpu",
    "omniverse": "omniverse",
}
PROVIDER_NAMES: tuple[str, ...] = tuple(_MODULES)
_REGISTRY: dict[str, Provider] = {}


def register(name: str) -> Callable[[Provider], Provider]:
    """Decorator: registers ``fn`` as the provider ``name`` (one of :data:`PROVIDER_NAMES`)."""
    if name not in _MODULES:
        raise ValueError(f"provider name must be one of {PROVIDER_NAMES}, got {name!r}")

    def wrap(fn: Provider) -> Provider:
        _REGISTRY[name] = fn
        return fn

    return wrap


def provider(name: str) -> Provider:
    """The provider registered as ``name`` (its module is imported on first use)."""
    if name not in _MODULES:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(PROVIDER_NAMES)}")
    if name not in _REGISTRY:
        importlib.import_module(f".{_MODULES[name]}", __package__)
    return _REGISTRY[name]


def _git_commit() -> Optional[str]:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_name() -> str:
    """The CPU model (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """Date, machine and versions, recorded with every report."""
    import numpy
    import torch

    from .. import __version__

    versions = {
        "omnibal_kernels": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    for name in ("numba", "triton", "transformers"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except ImportError:
            versions[name] = None
    cuda = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
        "cpu": _cpu_name(),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "commit": _git_commit(),
        "versions": versions,
    }


def run_suite(
    names: Optional[Sequence[str]] = None,
    *,
    quick: bool = False,
    seed: int = 0,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, Any]:
    """Runs the providers ``names`` (default: all, in :data:`PROVIDER_NAMES` order) and returns the report.

    Args:
        names: providers to run; unknown names raise ``ValueError``.
        quick: the small sizes.
        seed: seed of every draw and plan.
        log: progress lines (e.g. ``print``).

    Returns:
        ``{"environment", "quick", "seed", "seconds": {provider: s}, <each provider's keys>}``.
    """
    names = list(PROVIDER_NAMES if names is None else names)
    for name in names:
        if name not in _MODULES:
            raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(PROVIDER_NAMES)}")
    config = Config(quick=quick, seed=seed, log=log)
    report: dict[str, Any] = {"environment": environment(), "quick": quick, "seed": seed, "seconds": {}}
    for name in PROVIDER_NAMES:
        if name not in names:
            continue
        config.say(f"[bench] {name} ...")
        start = time.perf_counter()
        report.update(provider(name)(config))
        report["seconds"][name] = round(time.perf_counter() - start, 2)
        config.say(f"[bench] {name} done in {report['seconds'][name]:.1f} s")
        sys.stdout.flush()
    return report
