"""pack_batch on the CPU: 16 samples with real LLM token lengths, providers side by side.

Providers (same samples, same outputs except the floor):
  omnibal_kernels         pack_batch (numba backend)
  omnibal_kernels[torch]  pack_batch with the vectorized torch backend
  python_per_sample       omnibal_kernels.testing.reference_pack_batch: per-sample Python lists, then tensors
  hf_flattening           transformers' DataCollatorWithFlattening (skipped when transformers is missing)
  torch_cat_floor         torch.cat of the same input_ids and labels: what any collate must at least do

Targets: omnibal_kernels >= 10x faster than python_per_sample and within 2x of torch_cat_floor.

    python -m pytest benchmarks/bench_pack.py --benchmark-only   # pytest-benchmark groups + ratio test
    python benchmarks/bench_pack.py                              # a table and the ratios, one run
"""
from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.data import DEFAULT_LENGTHS_PATH
from omnibal_kernels.packing import PackCollator, pack_batch, warmup
from omnibal_kernels.testing import reference_pack_batch

NUM_SAMPLES = 16
SEED = 0
VOCAB = 151_000
OURS = "omnibal_kernels"
PYTHON = "python_per_sample"
FLOOR = "torch_cat_floor"


def make_samples(num_samples: int = NUM_SAMPLES, seed: int = SEED) -> list[dict[str, torch.Tensor]]:
    """``num_samples`` samples whose lengths are drawn (fixed seed) from the bundled real ``llm`` loads."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.load(DEFAULT_LENGTHS_PATH)["llm"], size=num_samples)
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, VOCAB, (int(n),), generator=gen),
            "labels": torch.randint(0, VOCAB, (int(n),), generator=gen),
        }
        for n in lengths
    ]


def _torch_cat_floor(samples: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([s["input_ids"] for s in samples]), torch.cat([s["labels"] for s in samples])


def providers() -> dict[str, Callable[[list[dict[str, torch.Tensor]]], Any]]:
    """Name -> collate function; hf_flattening only when transformers is importable."""
    warmup()
    out: dict[str, Callable[[list[dict[str, torch.Tensor]]], Any]] = {
        OURS: pack_batch,
        f"{OURS}[torch]": PackCollator(backend="torch"),
        PYTHON: reference_pack_batch,
    }
    try:
        from transformers import DataCollatorWithFlattening
    except ImportError:
        pass
    else:
        out["hf_flattening"] = DataCollatorWithFlattening(
            return_flash_attn_kwargs=True, return_seq_idx=True
        )
    out[FLOOR] = _torch_cat_floor
    return out


def measure(
    funcs: dict[str, Callable[[Any], Any]], samples: Any, rounds: int = 15, budget_s: float = 0.02
) -> dict[str, float]:
    """Best seconds per call of each function, rounds interleaved so that all see the same machine."""
    calls = {}
    for name, fn in funcs.items():
        fn(samples)
        start = time.perf_counter()
        fn(samples)
        calls[name] = max(1, int(budget_s / max(time.perf_counter() - start, 1e-7)))
    best = {name: float("inf") for name in funcs}
    for _ in range(rounds):
        for name, fn in funcs.items():
            n = calls[name]
            start = time.perf_counter()
            for _ in range(n):
                fn(samples)
            best[name] = min(best[name], (time.perf_counter() - start) / n)
    return best


def ratios(times: dict[str, float]) -> dict[str, float]:
    """Speedup of ours over each provider (above 1: ours is faster); the floor's is below 1."""
    return {name: t / times[OURS] for name, t in times.items() if name != OURS}


def _environment() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "num_samples": NUM_SAMPLES,
    }


# ------------------------------------------------------------------------------------ pytest-benchmark

try:
    import pytest
except ImportError:  # the script needs neither pytest nor pytest-benchmark
    pytest = None

if pytest is not None:
    _NAMES = [OURS, f"{OURS}[torch]", PYTHON, "hf_flattening", FLOOR]

    @pytest.fixture(scope="module")
    def samples() -> list[dict[str, torch.Tensor]]:
        return make_samples()

    @pytest.fixture(scope="module")
    def funcs() -> dict[str, Callable[[Any], Any]]:
        return providers()

    @pytest.mark.parametrize("provider", _NAMES)
    def test_pack(
        benchmark: Any,
        samples: list[dict[str, torch.Tensor]],
        funcs: dict[str, Callable[[Any], Any]],
        provider: str,
    ) -> None:
        if provider not in funcs:
            pytest.skip("transformers is not installed")
        benchmark.group = f"pack_batch: {NUM_SAMPLES} samples, real llm lengths"
        total = sum(len(s["input_ids"]) for s in samples)
        benchmark.extra_info.update(_environment(), total_tokens=total)
        benchmark(funcs[provider], samples)

    def test_targets(
        samples: list[dict[str, torch.Tensor]], funcs: dict[str, Callable[[Any], Any]]
    ) -> None:
        """All providers in one interleaved run; the ratios are printed and checked against the targets."""
        times = measure(funcs, samples)
        speedup = ratios(times)
        print()
        _print_table(times, speedup)
        assert speedup[PYTHON] >= 10, f"only {speedup[PYTHON]:.1f}x faster than per-sample Python"
        assert 1 / speedup[FLOOR] <= 2, f"{1 / speedup[FLOOR]:.2f}x the torch.cat floor (target 2x)"


def _print_table(times: dict[str, float], speedup: dict[str, float]) -> None:
    print(f"{'provider':<24}{'us/call':>10}{'ours faster by':>16}")
    for name, t in sorted(times.items(), key=lambda kv: kv[1]):
        ratio = "-" if name == OURS else f"{speedup[name]:.2f}x"
        print(f"{name:<24}{t * 1e6:>10.1f}{ratio:>16}")
    print(
        f"targets: >= 10x vs {PYTHON}: {speedup[PYTHON]:.1f}x; "
        f"<= 2x the floor: {1 / speedup[FLOOR]:.2f}x"
    )


def main() -> None:
    samples = make_samples()
    total = sum(len(s["input_ids"]) for s in samples)
    print(f"{NUM_SAMPLES} samples, {total} tokens; {_environment()}")
    times = measure(providers(), samples)
    _print_table(times, ratios(times))


if __name__ == "__main__":
    main()
