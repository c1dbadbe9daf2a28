"""``omnibal-kernels bench --quick`` runs end to end (so the suite cannot rot) and ``plan --plot`` draws."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omnibal_kernels.bench.markdown import to_markdown

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "omnibal_kernels", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_bench_quick_writes_every_part(tmp_path: Path) -> None:
    # The subprocess timeout bounds a hang, not the speed: the quick suite takes a few minutes of CPU, and beside
    # another test worker on two shared cores its wall time more than doubles.
    proc = _cli(
        "bench",
        "--quick",
        "--json",
        str(tmp_path / "r.json"),
        "--markdown",
        str(tmp_path / "r.md"),
        "--plot",
        str(tmp_path / "png"),
        "--paper-page",
        str(tmp_path / "docs" / "reproducing-the-paper.md"),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())

    speedup = report["simulated_speedup"]
    assert "bundled" in speedup
    for values in speedup.values():
        assert values["random_padded"] == 1.0
        assert {"length_grouped", "ffd_tokens", "random", "isf", "balanced", "limit"} <= set(values)
        assert all(values[m] <= values["limit"] * (1 + 1e-9) for m in values)
    ddp = report["measured_ddp"]
    for key in ("random_s", "balanced_s", "speedup", "wait_fraction_random", "wait_fraction_balanced"):
        assert isinstance(ddp[key], float) and ddp[key] >= 0, key
    assert ddp["random_s"] > 0 and ddp["balanced_s"] > 0
    assert ddp["speedup"] == pytest.approx(
        (ddp["balanced_tokens"] / ddp["balanced_s"]) / (ddp["random_tokens"] / ddp["random_s"])
    )
    # the calibrated model's prediction of the same run, rank by rank (how close is the report's, not a test's)
    for mode in ("random", "balanced"):
        assert len(ddp[f"{mode}_busy_s"]) == len(ddp[f"{mode}_busy_predicted_s"]) == ddp["world_size"] == 2
        assert all(p > 0 for p in ddp[f"{mode}_busy_predicted_s"])
    assert ddp["speedup_predicted"] > 0 and ddp["busy_error_max"] >= 0 and isinstance(ddp["misses"], list)
    assert ddp["calibration"]["packs"] > 0 and ddp["calibration"]["heldout_error"]["median"] >= 0
    assert report["planning"] and all({"method", "n", "seconds", "argsort_ratio"} <= set(r) for r in report["planning"])
    sizes = report["planning_pack_sizes"]
    assert [r["per_pack"] for r in sizes] == [4, 1_000]
    assert all(0.9 * r["per_pack"] <= r["samples_per_pack"] <= 1.1 * r["per_pack"] for r in sizes)
    assert all(r["argsort_ratio"] > 0 for r in sizes)
    wait = report["epoch_start_wait"]
    assert (wait["n"], wait["world_size"]) == (100_000, 64) and wait["wait"] > 0 and wait["wait_ahead"] > 0
    assert "with the epoch planned during that pass" in (tmp_path / "r.md").read_text()
    assert report["collate"] and all(
        {"provider", "batch_size", "input", "seconds"} <= set(r) for r in report["collate"]
    )
    assert {r["input"] for r in report["collate"]} == {"text", "tiles", "patches", "lists"}
    assert {r["where"] for r in report["collate"]} == {"process", "worker"}
    rows = [r for r in report["balance"] if r["method"] != "limit"]
    assert all(r["dropped"] == 0 for r in rows)  # every input sample is scheduled by every method
    assert report["gpu"] == {"skipped": "no CUDA device"} or report["gpu"]["rows"]
    assert {r["strategy"] for r in report["cp"]} == {
        "contiguous",
        "zigzag_megatron",
        "zigzag",
        "per_document",
        "hybrid",
        "auto",
        "auto_tokens_1.1",
    }

    # the Markdown file and stdout are the report's rendering
    text = (tmp_path / "r.md").read_text()
    assert text == to_markdown(report) and proc.stdout.strip() == text.strip()
    assert "### Measured DDP training" in text and "predicted by the cost model calibrated" in text
    assert "| bundled |" in text and "### Context parallelism" in text
    assert {r["mix"] for r in report["cp_vision"]} == {"long_video_128k", "video_mix_64k", "image_docs_64k"}
    assert "#### Vision-language packs under context parallelism" in text
    for name in ("rank_loads", "pack_loads", "planning_time", "step_time", "omniverse_steps"):
        png = tmp_path / "png" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name

    # the whole-run comparison: every configuration of every row, all never slower than a part that fits
    part = report["omniverse"]
    assert {r["baseline_split"] for r in part["table"]} == {"uniform", "vit-first"}
    for row in part["table"]:
        runs = {c["name"]: c for c in row["configurations"]}
        assert list(runs) == ["baseline", "data", "model", "memory", "data+model", "all"]
        assert all(runs["all"]["epoch_seconds"] <= c["epoch_seconds"] * (1 + 1e-12) for c in runs.values() if c["fits"])
    assert [r["layout"]["pp"] for r in part["sweep"]] == [4]
    page = (tmp_path / "docs" / "reproducing-the-paper.md").read_text()
    assert page.startswith("# Reproducing the paper") and "| 6+20B | paper, Megatron-DeepSpeed |" in page
    assert (tmp_path / "docs" / "img" / "omniverse_steps.png").read_bytes()[:8] == PNG_MAGIC


def test_plan_plot_draws_the_users_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "lengths.npz"
    vit = rng.integers(0, 6, 3000)
    np.savez(path, vit=vit, llm=vit * 256 + rng.integers(20, 2000, 3000))
    proc = _cli("plan", str(path), "--world-size", "4", "--plot", str(tmp_path / "png"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "png" / "rank_loads.png").read_bytes()[:8] == PNG_MAGIC
    assert "rank_loads.png" in proc.stderr


def test_bench_rejects_an_unknown_part() -> None:
    proc = _cli("bench", "--only", "nothing", timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_docs_page_from_a_run_and_from_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omnibal_kernels.cli import main

    page = tmp_path / "docs" / "benchmarks.md"
    saved = tmp_path / "r.json"
    assert main(["bench", "--only", "cp", "--quick", "--json", str(saved), "--docs-page", str(page)]) == 0
    text = page.read_text()
    report = json.loads(saved.read_text())
    env = report["environment"]
    header = text.split("\n## ", 1)[0]
    assert (
        text.startswith("# Benchmark results\n")
        and f"Generated: `omnibal-kernels bench --quick`, {env['date']}" in header
    )
    assert env["machine"] in header and (env.get("commit") is None or f"commit {env['commit']}" in header)
    assert "\n## Context parallelism" in text and "\n### " not in text.split("\n## ", 1)[0]
    assert (page.parent / "img" / "benchmarks" / "step_time.png").exists() is ("simulated_speedup" in report)
    again = tmp_path / "again.md"
    assert main(["bench", "--from-json", str(saved), "--docs-page", str(again)]) == 0
    assert again.read_text() == text
    assert main(["bench", "--from-json", str(saved), "--quick"]) == 2
    assert main(["bench", "--from-json", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "--quick cannot apply" in err and "none.json: not a report" in err


def test_the_committed_docs_page_is_the_suites() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert text.startswith("# Benchmark results\n\n<!-- generated by `omnibal-kernels bench --docs-page PATH`")
    assert "Generated: `omnibal-kernels bench" in text and ", commit " in text
    for image in re.findall(r"\]\((img/[^)]+)\)", text):
        assert (ROOT / "docs" / image).read_bytes()[:8] == PNG_MAGIC, image
