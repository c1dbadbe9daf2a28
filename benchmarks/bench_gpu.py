"""GPU kernels: the ``gpu`` provider of ``omnibal_kernels.bench`` (``bench_ops_gpu.py`` and
``bench_vision_gpu.py``, timed by ``triton.testing.do_bench``) under pytest; skipped without CUDA.

    python -m pytest benchmarks/bench_gpu.py --benchmark-only
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from omnibal_kernels.bench import Config, environment
from omnibal_kernels.bench.runner import provider


def test_gpu_kernels(benchmark: Any) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    benchmark.group = "GPU kernels (do_bench medians inside)"
    result = benchmark.pedantic(lambda: provider("gpu")(Config())["gpu"], rounds=1, iterations=1)
    benchmark.extra_info.update(environment(), rows=result["rows"], errors=result["errors"])
    assert not result["errors"], result["errors"]
