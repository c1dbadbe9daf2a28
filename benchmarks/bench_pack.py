"""pack_batch on the CPU: 16 samples with real LLM token lengths, providers side by side.

Group "in process" (same samples, same outputs except the floor):
  omnibal_kernels         pack_batch (numba backend)
  omnibal_kernels[torch]  pack_batch with the vectorized torch backend
  python_per_sample       omnibal_kernels.testing.pack_batch_reference: per-sample Python lists, then tensors
  hf_flattening           transformers' DataCollatorWithFlattening (skipped when transformers is missing)
  torch_cat_floor         torch.cat of the same input_ids and labels: what any collate must at least do

Group "worker" (what a DataLoader worker does: outputs written into shared memory, as default_collate does):
  omnibal_kernels         pack_batch's worker path
  torch_cat_floor         torch.cat of input_ids and labels into one shared-memory buffer

Group "lists" (the same samples as Python lists, what a ``datasets.Dataset`` yields without a torch format):
  omnibal_kernels         pack_batch
  hf_flattening           transformers' DataCollatorWithFlattening (skipped when transformers is missing)
  numpy_convert           np.array(list, dtype=np.int64) of every input_ids and labels list, nothing else

Targets: omnibal_kernels >= 10x faster than python_per_sample and within 2x of torch_cat_floor; on lists
>= 5x faster than hf_flattening.

    python -m pytest benchmarks/bench_pack.py --benchmark-only   # pytest-benchmark groups
    python -m pytest benchmarks/bench_pack.py -k target -s       # the ratios of one run, checked
    python benchmarks/bench_pack.py                              # tables and ratios, one run
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
from omnibal_kernels.packing import PackCollator, PackedBatch, pack_batch, pack_sequences, warmup
from omnibal_kernels.testing import pack_batch_reference

NUM_SAMPLES = 16
SEED = 0
VOCAB = 151_000
OURS = "omnibal_kernels"
PYTHON = "python_per_sample"
FLOOR = "torch_cat_floor"
HF = "hf_flattening"
NUMPY_CONVERT = "numpy_convert"
Samples = list[dict[str, torch.Tensor]]


def make_samples(num_samples: int = NUM_SAMPLES, seed: int = SEED) -> Samples:
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


def as_lists(samples: Samples) -> list[dict[str, list[int]]]:
    """The same samples with every field as a Python list of ints."""
    return [{key: value.tolist() for key, value in sample.items()} for sample in samples]


def _numpy_convert(samples: list[dict[str, list[int]]]) -> list[np.ndarray]:
    return [np.array(value, dtype=np.int64) for sample in samples for value in sample.values()]


def _hf_flattening() -> Callable[[Samples], Any] | None:
    """transformers' DataCollatorWithFlattening with the same fields as ours, or None without transformers."""
    try:
        from transformers import DataCollatorWithFlattening
    except ImportError:
        return None
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)


def _torch_cat_floor(samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([s["input_ids"] for s in samples]), torch.cat([s["labels"] for s in samples])


def _torch_cat_floor_shared(samples: Samples) -> torch.Tensor:
    ids = [s["input_ids"] for s in samples]
    labels = [s["labels"] for s in samples]
    total = sum(map(torch.Tensor.numel, ids))
    storage = torch.UntypedStorage._new_shared(2 * 8 * total)
    out = torch.empty(0, dtype=torch.int64).set_(storage, 0, (2, total), (total, 1))
    torch.cat(ids, out=out[0])
    torch.cat(labels, out=out[1])
    return out


def _pack_in_worker(samples: Samples) -> PackedBatch:
    ids = [s["input_ids"] for s in samples]
    labels = [s["labels"] for s in samples]
    return PackedBatch(pack_sequences(ids, labels, shared=True))


def providers() -> dict[str, Callable[[Samples], Any]]:
    """Group "in process": name -> collate function; hf_flattening only when transformers is importable."""
    warmup()
    out: dict[str, Callable[[Samples], Any]] = {
        OURS: pack_batch,
        f"{OURS}[torch]": PackCollator(backend="torch"),
        PYTHON: pack_batch_reference,
    }
    hf = _hf_flattening()
    if hf is not None:
        out[HF] = hf
    out[FLOOR] = _torch_cat_floor
    return out


def list_providers() -> dict[str, Callable[[Any], Any]]:
    """Group "lists": name -> collate function of samples given as lists; hf_flattening only with transformers."""
    warmup()
    out: dict[str, Callable[[Any], Any]] = {OURS: pack_batch}
    hf = _hf_flattening()
    if hf is not None:
        out[HF] = hf
    out[NUMPY_CONVERT] = _numpy_convert
    return out


def worker_providers() -> dict[str, Callable[[Samples], Any]]:
    """Group "worker": outputs allocated in shared memory, as inside a DataLoader worker."""
    warmup()
    return {OURS: _pack_in_worker, FLOOR: _torch_cat_floor_shared}


def measure(
    funcs: dict[str, Callable[[Samples], Any]],
    samples: Samples,
    rounds: int = 15,
    budget_s: float = 0.02,
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


def _environment() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "num_samples": NUM_SAMPLES,
    }


def _print_table(title: str, times: dict[str, float]) -> None:
    print(f"[{title}]")
    print(f"{'provider':<24}{'us/call':>10}{'time / ours':>14}")
    for name, t in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"{name:<24}{t * 1e6:>10.1f}{t / times[OURS]:>13.2f}x")


def _print_targets(
    times: dict[str, float], worker_times: dict[str, float], list_times: dict[str, float]
) -> None:
    print(
        f"targets: ours faster than {PYTHON} by {times[PYTHON] / times[OURS]:.1f}x (>= 10x); "
        f"ours / {FLOOR}: in process {times[OURS] / times[FLOOR]:.2f}x, "
        f"in a worker {worker_times[OURS] / worker_times[FLOOR]:.2f}x (<= 2x)"
    )
    if HF in list_times:
        print(f"targets: on lists ours faster than {HF} by {list_times[HF] / list_times[OURS]:.1f}x (>= 5x)")


# ------------------------------------------------------------------------------------ pytest-benchmark

try:
    import pytest
except ImportError:  # the script needs neither pytest nor pytest-benchmark
    pytest = None

if pytest is not None:
    _NAMES = [OURS, f"{OURS}[torch]", PYTHON, HF, FLOOR]

    @pytest.fixture(scope="module")
    def samples() -> Samples:
        return make_samples()

    @pytest.fixture(scope="module")
    def funcs() -> dict[str, Callable[[Samples], Any]]:
        return providers()

    @pytest.fixture(scope="module")
    def run(samples: Samples, funcs: dict[str, Callable[[Samples], Any]]) -> dict[str, dict[str, float]]:
        """Both groups measured once, interleaved; shared by the target checks."""
        times = {
            "process": measure(funcs, samples),
            "worker": measure(worker_providers(), samples),
            "lists": measure(list_providers(), as_lists(samples)),
        }
        print()
        _print_table("in process", times["process"])
        _print_table("worker", times["worker"])
        _print_table("lists", times["lists"])
        _print_targets(times["process"], times["worker"], times["lists"])
        return times

    @pytest.mark.parametrize("provider", _NAMES)
    def test_pack(
        benchmark: Any, samples: Samples, funcs: dict[str, Callable[[Samples], Any]], provider: str
    ) -> None:
        if provider not in funcs:
            pytest.skip("transformers is not installed")
        benchmark.group = f"pack_batch in process: {NUM_SAMPLES} samples, real llm lengths"
        benchmark.extra_info.update(_environment(), total_tokens=sum(len(s["input_ids"]) for s in samples))
        benchmark(funcs[provider], samples)

    @pytest.mark.parametrize("provider", [OURS, HF, NUMPY_CONVERT])
    def test_pack_lists(benchmark: Any, samples: Samples, provider: str) -> None:
        funcs = list_providers()
        if provider not in funcs:
            pytest.skip("transformers is not installed")
        benchmark.group = f"pack_batch on Python lists: {NUM_SAMPLES} samples, real llm lengths"
        benchmark.extra_info.update(_environment(), total_tokens=sum(len(s["input_ids"]) for s in samples))
        benchmark(funcs[provider], as_lists(samples))

    @pytest.mark.parametrize("provider", [OURS, FLOOR])
    def test_pack_worker(benchmark: Any, samples: Samples, provider: str) -> None:
        benchmark.group = f"pack_batch in a worker (shared memory): {NUM_SAMPLES} samples"
        benchmark.extra_info.update(_environment(), total_tokens=sum(len(s["input_ids"]) for s in samples))
        benchmark(worker_providers()[provider], samples)

    def test_target_vs_python(run: dict[str, dict[str, float]]) -> None:
        times = run["process"]
        assert times[PYTHON] / times[OURS] >= 10

    def test_target_vs_floor_in_process(run: dict[str, dict[str, float]]) -> None:
        times = run["process"]
        assert times[OURS] / times[FLOOR] <= 2

    def test_target_vs_floor_in_worker(run: dict[str, dict[str, float]]) -> None:
        times = run["worker"]
        assert times[OURS] / times[FLOOR] <= 2

    def test_target_lists_vs_hf(run: dict[str, dict[str, float]]) -> None:
        times = run["lists"]
        if HF not in times:
            pytest.skip("transformers is not installed")
        assert times[HF] / times[OURS] >= 5


def main() -> None:
    samples = make_samples()
    total = sum(len(s["input_ids"]) for s in samples)
    print(f"{NUM_SAMPLES} samples, {total} tokens; {_environment()}")
    times = measure(providers(), samples)
    worker_times = measure(worker_providers(), samples)
    list_times = measure(list_providers(), as_lists(samples))
    _print_table("in process", times)
    _print_table("worker", worker_times)
    _print_table("lists", list_times)
    _print_targets(times, worker_times, list_times)


if __name__ == "__main__":
    main()
