"""Collate speed: the ``collate`` provider of ``omnibal_kernels.bench`` as pytest-benchmark groups.

    python -m pytest benchmarks/bench_pack.py --benchmark-only   # one group per input and batch size
    python -m pytest benchmarks/bench_pack.py -k target -s       # the targets, checked on one measurement
    python benchmarks/bench_pack.py [--quick]                    # the suite's collate table

Providers side by side (``omnibal_kernels.bench.collate``): ``pack_batch``, ``pack_batch`` on a sampler's planned
samples (loads checked against the lengths, the step's loss counts set), a per-sample Python collator,
transformers' ``DataCollatorWithFlattening`` (text) and the ``torch.cat`` floor, on text, InternVL tiles and
Qwen2-VL patches, and the text samples as Python lists. Targets on 16 text samples of real lengths:
``pack_batch`` at least 10x faster than the per-sample Python collator, and within 2x of the floor; on the same
samples as Python lists, at least 5x faster than ``DataCollatorWithFlattening``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.bench import environment, run_suite
from omnibal_kernels.bench.collate import (
    CHECKED,
    FLOOR,
    HF,
    INPUTS,
    OURS,
    PYTHON,
    make_samples,
    measure,
    planned_samples,
    providers,
)
from omnibal_kernels.bench.markdown import to_markdown
from omnibal_kernels.packing import pack_batch

BATCH_SIZES = (4, 16, 64)


@pytest.mark.parametrize("provider", [OURS, CHECKED, PYTHON, HF, FLOOR])
@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("kind", INPUTS)
def test_collate(benchmark: Any, kind: str, batch_size: int, provider: str) -> None:
    funcs = providers(kind)
    samples = make_samples(kind, batch_size)
    if provider == CHECKED:  # the planned samples are made once, outside the timed call
        planned = planned_samples(samples)
        funcs[CHECKED] = lambda _samples: pack_batch(planned)
    if provider not in funcs:
        pytest.skip("hf_flattening: text only, and only with transformers installed")
    benchmark.group = f"collate {kind}, batch {batch_size}"
    benchmark.extra_info.update(environment()["versions"], tokens=sum(len(s["input_ids"]) for s in samples))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*image_token_id is not set")
        benchmark(funcs[provider], samples)


@pytest.fixture(scope="module")
def text16() -> dict[str, float]:
    return measure(providers("text"), make_samples("text", 16))


def test_target_vs_python(text16: dict[str, float]) -> None:
    assert text16[PYTHON] / text16[OURS] >= 10


def test_target_vs_floor(text16: dict[str, float]) -> None:
    assert text16[OURS] / text16[FLOOR] <= 2


def test_target_lists_vs_hf_flattening() -> None:
    funcs = providers("lists")
    if HF not in funcs:
        pytest.skip("needs transformers")
    times = measure(funcs, make_samples("lists", 16))
    assert times[HF] / times[OURS] >= 5


def main(argv: list[str]) -> int:
    report = run_suite(["collate"], quick="--quick" in argv, log=lambda s: print(s, file=sys.stderr))
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
