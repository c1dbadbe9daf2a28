"""benchmarks/gpu_check.sh runs without CUDA (skipping the GPU parts and saying so), and its report step
turns benchmark rows and failed steps into gpu_report.json and a table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    assert steps == {"build": "skipped", "gpu_tests": "skipped", "bench_ops_gpu": "skipped"}
    assert report["benchmarks"]["bench_ops_gpu"]["skipped"] == "no CUDA device"
    # the table is the last thing printed
    assert proc.stdout.rstrip().splitlines()[-1].strip() == "overall: ok"


def test_report_lists_rows_and_fails_on_a_failed_step(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text("build\tfailed\t3\tsee build.log\nbench_x\tok\t9\tbench_x.json\n")
    row = dict(op="pack", case="c1", provider="omnibal", ms=0.5, bytes=10**9, gbps=2000.0, copy_ms=0.45,
               vs_copy=0.9, baseline="unpad_input", vs_baseline=2.5)
    bench = dict(skipped=None, rows=[row], errors=[], environment=dict(device="H200"))
    (tmp_path / "bench_x.json").write_text(json.dumps(bench))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_report.py"), str(tmp_path), "benchmarks/bench_x.py",
         "benchmarks/bench_missing.py"],
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
