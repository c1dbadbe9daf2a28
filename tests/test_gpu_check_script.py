"""benchmarks/gpu_check.sh runs without CUDA (skipping the GPU parts and saying so), and its report step
turns benchmark rows and failed steps into gpu_report.json and a table."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_without_cuda(tmp_path: Path) -> None:
    env = dict(os.environ, GPU_CHECK_SKIP_BUILD="1", CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    report = json.loads((tmp_path / "out" / "gpu_report.json").read_text())
    assert report["status"] == "ok"
    steps = {s["name"]: s["status"] for s in report["steps"]}
    assert steps == {
        "build": "skipped",
        "gpu_tests": "skipped",
        "bench_ops_gpu": "skipped",
        "bench_vision_gpu": "skipped",
        "bench_train_gpu": "skipped",
    }
    for name in ("bench_ops_gpu", "bench_vision_gpu", "bench_train_gpu"):
        assert report["benchmarks"][name]["skipped"] == "no CUDA device", name
    # the table is the last thing printed
    assert proc.stdout.rstrip().splitlines()[-1].strip() == "overall: ok"


def test_report_lists_rows_and_fails_on_a_failed_step(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text("build\tfailed\t3\tsee build.log\nbench_x\tok\t9\tbench_x.json\n")
    row = dict(
        op="pack",
        case="c1",
        provider="omnibal",
        ms=0.5,
        bytes=10**9,
        gbps=2000.0,
        copy_ms=0.45,
        vs_copy=0.9,
        baseline="unpad_input",
        vs_baseline=2.5,
    )
    bench = dict(skipped=None, rows=[row], errors=[], environment=dict(device="H200"))
    (tmp_path / "bench_x.json").write_text(json.dumps(bench))
    training = dict(speedup=1.31, speedup_predicted=1.38, busy_error_max=0.042)
    (tmp_path / "bench_t.json").write_text(json.dumps(dict(skipped=None, rows=[], errors=[], training=training)))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_report.py"),
            str(tmp_path),
            "benchmarks/bench_x.py",
            "benchmarks/bench_t.py",
            "benchmarks/bench_missing.py",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["status"] == "failed: bench_missing, build"
    assert report["environment"]["device"] == "H200"
    row_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("pack"))
    assert "omnibal" in row_line and "0.900" in row_line and "2.50x" in row_line
    assert "bench_missing: ERROR no readable bench_missing.json" in proc.stdout
    assert "bench_t: balanced over random padded 1.31x measured, 1.38x predicted" in proc.stdout
    assert "predicted within 4.2%" in proc.stdout


def _load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_vision_benchmarks_run_on_cpu() -> None:
    """The vision GPU benchmark code (reference checks, byte counts, rows) on tiny shapes, in the Triton
    interpreter, timed by a plain clock; the real run differs only in the shapes and the timer."""
    if torch.cuda.is_available():
        pytest.skip("the GPU run covers this")
    bench_vision = _load_benchmark("bench_vision_gpu")

    def one_call_ms(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    bench = bench_vision.Bench(device="cpu", time_fn=one_call_ms)
    for fn in bench_vision.BENCHMARKS:
        fn(bench)
    ops = {(row["op"], row["provider"]) for row in bench.rows}
    assert ("pack_patches", "omnibal (Triton)") in ops and ("bucket_sort", "torch stable sort") in ops
    assert {op for op, _ in ops} == {"pack_patches", "bucket_sort", "internvl_tiles", "smart_resize"}
    cases = {row["case"] for row in bench.rows if row["op"] == "pack_patches"}
    assert len(cases) == 3
    for row in bench.rows:
        assert row["ms"] > 0 and row["bytes"] > 0 and row["copy_ms"] > 0 and row["vs_copy"] >= 0, row
        assert (row["vs_baseline"] is None) == (row["baseline"] is None), row
        assert len(row["case"]) <= 12 and len(row["op"]) <= 16, row  # the report table's columns
    still = next(r for r in bench.rows if r["op"] == "pack_patches" and r["case"].startswith("img"))
    # a still image is read once and written twice (both temporal frames)
    assert still["bytes"] == 3 * still["patches"] * 3 * 14 * 14 * 2


@pytest.mark.slow
def test_gpu_tests_cover_every_kernel_module() -> None:
    """``pytest -m gpu`` (what gpu_check.sh runs) collects CUDA tests of every Triton op and the attention
    adapters."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    expected = {
        "tests/test_ops_unpad.py",  # ops/unpad.py
        "tests/test_ops_varlen_metadata.py",  # ops/varlen_metadata.py
        "tests/test_patchify.py",  # ops/patchify.py
        "tests/test_bucket.py",  # ops/bucket.py
        "tests/test_vision_counts.py",  # ops/vision_counts.py
        "tests/test_attention.py",  # attention.py
    }
    assert expected <= files, sorted(files)
    kernel_modules = {p.stem for p in (ROOT / "omnibal_kernels" / "ops").glob("*.py") if not p.stem.startswith("_")}
    assert kernel_modules == {"unpad", "varlen_metadata", "patchify", "bucket", "vision_counts"}, (
        "a new Triton op needs a gpu-marked test listed here"
    )
