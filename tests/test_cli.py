"""The command line, in process and as ``python -m omnibal_kernels``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from omnibal_kernels.balance import Plan
from omnibal_kernels.cli import main

REPORT_KEYS = {
    "num_samples",
    "num_packs",
    "num_steps",
    "ave_bs",
    "vit_fill",
    "llm_fill",
    "vit_dist",
    "llm_dist",
    "step_efficiency",
    "num_dropped",
    "num_duplicated",
    "seconds",
    "num_oversize",
    "duplicated_fraction",
    "method",
    "vit_capacity",
    "llm_capacity",
    "world_size",
    "epoch_cost",
    "epoch_ideal",
    "epoch_bound",
    "epoch_over_ideal",
    "epoch_over_bound",
    "bound_over_ideal",
    "bound_samples",
    "bound_sample_count",
    "bound_note",
    "cost_model",
}


def test_default_run_prints_three_methods_side_by_side(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    header = [line for line in out.splitlines() if "balanced" in line and "isf" in line and "random" in line]
    assert header, out
    assert "70,706 samples" in out


def test_json_prints_exactly_one_object(capsys):
    assert main(["plan", "--json", "--method", "isf", "--vit-capacity", "18", "--llm-capacity", "6016"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == REPORT_KEYS
    assert report["method"] == "isf" and report["vit_capacity"] == 18 and report["world_size"] == 8


def test_paths_out_and_errors(tmp_path, capsys):
    np.savez(tmp_path / "l.npz", vit=np.full(100, 2), llm=np.arange(100, 200))
    out = tmp_path / "plan.npz"
    assert main(["plan", str(tmp_path / "l.npz"), "--world-size", "4", "--out", str(out)]) == 0
    assert Plan.load(out).world_size == 4
    assert main(["plan", str(tmp_path / "missing.json")]) == 2
    assert main(["plan", str(tmp_path / "l.npz"), "--vit-capacity", "1", "--llm-capacity", "1000"]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "exceed the capacities" in err


def test_choices_follow_the_library():
    from omnibal_kernels.balance import METHODS, OVERSIZE_POLICIES
    from omnibal_kernels.cli import build_parser

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    actions = {a.dest: a for a in plan._actions}
    assert tuple(actions["method"].choices) == METHODS
    assert tuple(actions["oversize"].choices) == OVERSIZE_POLICIES


def test_module_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "omnibal_kernels", "plan", "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout)["method"] == "balanced"
