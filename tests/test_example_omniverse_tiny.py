"""examples/omniverse_tiny.py: every configuration of the entry point trained on 4 gloo processes (2 pipeline
stages x 2 data-parallel pipelines), its measured step beside the entry point's prediction."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["baseline", "data", "model", "memory", "data+model", "all"]
# how far a configuration's measured step (mean) and epoch may be from the entry point's prediction
TOLERANCE = 0.10


@pytest.mark.slow
@pytest.mark.alone
def test_every_configuration_is_trained_and_measured_beside_its_prediction(monkeypatch) -> None:
    # Spawned workers import the example by name: they get this sys.path.
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = importlib.import_module("omniverse_tiny")
    start = time.monotonic()
    report = example.run()
    assert time.monotonic() - start < 300
    rows = {r["name"]: r for r in report["configurations"]}
    assert list(rows) == NAMES
    # the configurations that share their data train the same model on the same micro-batches: the split and
    # the recomputation change the schedule, not the numbers
    for name, row in rows.items():
        same = [other for other in rows.values() if other["data"] == row["data"]]
        assert all(other["loss"] == row["loss"] for other in same), name
        assert len(row["loss"]) == len(row["measured_steps_ms"]) == len(row["predicted_steps_ms"])
    assert rows["baseline"]["data"] == "padded" and rows["data"]["data"] == "balanced"
    # each configuration's measured step and epoch (CPU time per operation, in the schedule's order) within
    # TOLERANCE of the entry point's prediction from the profile measured alongside, with exactly the layers
    # the configuration trained recomputed
    ratios = {
        (name, what): row[f"measured_{what}_seconds"] / row[f"predicted_{what}_seconds"]
        for name, row in rows.items()
        for what in ("step", "epoch")
    }
    # on a miss, every configuration's ratios, split, recomputed layers and per-stage times, to tell a slow
    # stage from a slow machine
    stages = {
        name: (row["stages"], row["recomputed"], {k: [round(x, 2) for x in v] for k, v in row["stage_ms"].items()})
        for name, row in rows.items()
    }
    assert all(abs(r - 1) <= TOLERANCE for r in ratios.values()), (ratios, stages)
    for name, row in rows.items():
        assert row["measured_epoch_seconds"] == pytest.approx(sum(row["measured_steps_ms"]) / 1e3), name
        assert row["predicted_epoch_seconds"] == pytest.approx(sum(row["predicted_steps_ms"]) / 1e3), name
        assert all(t > 0 for t in row["measured_steps_ms"] + row["predicted_steps_ms"]), name
        stage = row["stage_ms"]
        assert len(stage["measured_forward_ms"]) == len(stage["predicted_backward_ms"]) == 2
    # the budget makes memory balance recompute less than every layer, and it fits
    assert rows["memory"]["recomputed"] != rows["baseline"]["recomputed"]
