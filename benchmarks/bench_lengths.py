"""Reading length files: ``load_lengths`` (the strict C++ scanner) side by side with the baseline, Python's
``json.load`` plus numpy arrays of the two fields, in one process.

The file is the OmniBal JSON list format (``{"vit_num", "token_num", "image_flags"}`` per sample, one per line
like the published files) of the bundled real loads resampled to 1M samples, written once to a temporary folder.

    python benchmarks/bench_lengths.py             # prints the table
    python -m pytest benchmarks/bench_lengths.py   # pytest-benchmark group
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from omnibal_kernels import load_lengths
from omnibal_kernels.lengths import default_lengths

NUM_SAMPLES = 1_000_000


def write_length_file(folder: Path, n: int = NUM_SAMPLES, seed: int = 0) -> Path:
    """The real loads resampled to ``n`` samples, as an OmniBal JSON list."""
    real = default_lengths()
    idx = np.random.default_rng(seed).integers(0, len(real), n)
    path = folder / "lengths.json"
    rows = (
        f'    {{"vit_num": {v}, "token_num": {t}, "image_flags": {v}}}'
        for v, t in zip(real.vit[idx].tolist(), real.llm[idx].tolist())
    )
    path.write_text("[\n" + ",\n".join(rows) + "\n]\n")
    return path


def json_baseline(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        records = json.load(f)
    return (
        np.array([r.get("vit_num", 0) for r in records], np.int64),
        np.array([r["token_num"] for r in records], np.int64),
    )


def _providers(path: Path) -> dict[str, Callable[[], object]]:
    return {
        "json.load + numpy (baseline)": lambda: json_baseline(path),
        "load_lengths (ours)": lambda: load_lengths(path),
    }


def speed_table(path: Path, repeats: int = 3, rounds: int = 2) -> list[tuple[str, float, float]]:
    """(provider, best seconds, ratio to the baseline); providers take turns ``rounds`` times."""
    providers = _providers(path)
    vit, llm = json_baseline(path)
    ours = load_lengths(path)
    assert np.array_equal(ours.vit, vit) and np.array_equal(ours.llm, llm)
    best = {name: float("inf") for name in providers}
    for _ in range(rounds):
        for name, fn in providers.items():
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    base = best["json.load + numpy (baseline)"]
    return [(name, t, t / base) for name, t in best.items()]


@pytest.fixture(scope="module")
def length_file(tmp_path_factory):
    return write_length_file(tmp_path_factory.mktemp("bench"))


@pytest.mark.parametrize("provider", ["json.load + numpy (baseline)", "load_lengths (ours)"])
def test_read_1m(benchmark, length_file, provider):
    benchmark.group = "read a 1M-sample OmniBal JSON length file"
    benchmark.extra_info.update(samples=NUM_SAMPLES, megabytes=length_file.stat().st_size / 1e6)
    benchmark(_providers(length_file)[provider])


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = write_length_file(Path(folder))
        megabytes = path.stat().st_size / 1e6
        print(f"reading {NUM_SAMPLES:,} samples ({megabytes:.0f} MB of OmniBal JSON); best of 2 x 3 runs, one process")
        for name, seconds, ratio in speed_table(path):
            print(f"  {name:<30} {seconds * 1e3:8.1f} ms  {megabytes / seconds:7.0f} MB/s  {ratio:5.3f}x baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
