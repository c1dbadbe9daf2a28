"""The simulator past the steady state: a step of constant per-stage times is measured on bounded counts and
extrapolated, exactly the full run's; the count of micro-batches is bounded where it is read; long runs stop on
Ctrl-C between chunks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.cli import main
from omnibal_kernels.pipeline import (
    MAX_MICRO_BATCHES,
    LayerProfile,
    ModelProfile,
    evaluate_partition,
    held_micro_batches,
    partition,
    schedule_order,
    simulate,
)
from omnibal_kernels.pipeline import schedule as schedule_module
from omnibal_kernels.pipeline.schedule import steady_threshold

ROOT = Path(__file__).resolve().parents[1]


@st.composite
def _steps(draw: st.DrawFn) -> dict:
    name = draw(st.sampled_from(["1f1b", "gpipe", "interleaved", "interleaved-zb", "zbv"]))
    ranks = draw(st.integers(1, 4))
    chunks = {"1f1b": 1, "gpipe": 1, "zbv": 2}.get(name) or draw(st.integers(1, 3))
    S = ranks * chunks
    # quarters: every sum is exact in float64, so the extrapolated step must equal the full run's bit for bit
    quarters = st.integers(0, 40).map(lambda q: q / 4)
    unit = ranks if name.startswith("interleaved") else 1
    return {
        "name": name,
        "chunks": chunks,
        "forward": np.array(draw(st.lists(quarters, min_size=S, max_size=S))),
        "backward": np.array(draw(st.lists(quarters, min_size=S, max_size=S))) + 0.25,
        "comm": np.array(draw(st.lists(quarters, min_size=S - 1, max_size=S - 1))),
        "act": np.array(draw(st.lists(st.integers(0, 10**9), min_size=S, max_size=S)), dtype=float),
        "m": steady_threshold(name, ranks, chunks) + unit * draw(st.integers(0, 60)),
    }


@pytest.mark.property
@settings(max_examples=60, deadline=None)
@given(_steps())
def test_the_extrapolated_step_is_the_full_runs(case):
    m, S = case["m"], case["forward"].size
    kw = dict(
        schedule=case["name"],
        virtual_stages=case["chunks"],
        comm_ms=case["comm"] if S > 1 else None,
        activation_bytes=case["act"],
    )
    fast = simulate(case["forward"], case["backward"], m, **kw)
    # one row per micro-batch: the same times, simulated operation by operation
    full = simulate(np.broadcast_to(case["forward"], (m, S)), case["backward"], m, **kw)
    assert fast.step_ms == full.step_ms
    assert fast.held == full.held and fast.peak_bytes == full.peak_bytes
    assert fast.busy_ms == full.busy_ms and fast.bubble == pytest.approx(full.bubble, abs=1e-12)


def test_arbitrary_times_extrapolate_within_rounding():
    rng = np.random.default_rng(5)
    for name, chunks in (("1f1b", 1), ("interleaved", 2), ("zbv", 2), ("gpipe", 1), ("interleaved-zb", 3)):
        S = 4 * chunks
        f, b = rng.uniform(0.1, 2, S), rng.uniform(0.1, 3, S)
        m = 4 * steady_threshold(name, 4, chunks)
        fast = simulate(f, b, m, schedule=name, virtual_stages=chunks)
        full = simulate(np.broadcast_to(f, (m, S)), b, m, schedule=name, virtual_stages=chunks)
        assert fast.step_ms == pytest.approx(full.step_ms, rel=1e-11) and fast.held == full.held


def test_a_huge_count_is_answered_at_once():
    start = time.process_time()
    r = simulate(np.ones(16), 2 * np.ones(16), MAX_MICRO_BATCHES)
    assert held_micro_batches("1f1b", 16, MAX_MICRO_BATCHES, 0) == 16 and r.held[0] == 16
    assert r.step_ms == pytest.approx(3 * MAX_MICRO_BATCHES, rel=1e-6)
    assert time.process_time() - start < 5


def test_the_chunks_of_a_run_add_up_to_the_whole_run(monkeypatch):
    rng = np.random.default_rng(1)
    f, b = rng.uniform(0.1, 2, (48, 6)), rng.uniform(0.1, 2, (48, 6))
    whole = simulate(f, b, 48, schedule="interleaved", virtual_stages=2, timeline=True)
    monkeypatch.setattr(schedule_module, "_CHUNK_OPS", 7)
    assert simulate(f, b, 48, schedule="interleaved", virtual_stages=2, timeline=True) == whole


def _profile(layers: int = 24) -> ModelProfile:
    rng = np.random.default_rng(0)
    f = rng.uniform(0.5, 1.5, layers)
    return ModelProfile(
        tuple(LayerProfile(f"l{i}", float(f[i]), float(2 * f[i]), 10**7, 10**8, 10**6) for i in range(layers)),
        input_bytes=10**6,
    )


def test_counts_over_the_maximum_are_refused_where_read():
    over = MAX_MICRO_BATCHES + 1
    calls = [
        lambda: simulate(np.ones(2), np.ones(2), over),
        lambda: held_micro_batches("1f1b", 2, over, 0),
        lambda: schedule_order("1f1b", 2, over),
        lambda: partition(_profile(), 2, micro_batches=over),
        lambda: evaluate_partition(_profile(), [(0, 11), (12, 23)], micro_batches=over),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=rf"micro_batches must be <= {MAX_MICRO_BATCHES}"):
            call()


def test_cli_partition_refuses_a_count_over_the_maximum_in_one_line(capsys):
    start = time.monotonic()
    assert main(["partition", "--config", "internvl-300m-7b", "--micro-batches", "1000000000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--micro-batches" in err[0] and str(MAX_MICRO_BATCHES) in err[0]
    assert time.monotonic() - start < 30


def test_partition_at_the_maximum_count_returns():
    plan = partition(_profile(), 16, micro_batches=MAX_MICRO_BATCHES)
    assert plan.micro_batches == MAX_MICRO_BATCHES and plan.fits and np.isfinite(plan.step_ms)


LONG_RUN = """
import numpy as np
from omnibal_kernels.pipeline import simulate
simulate(np.ones(1), np.ones(1), 1)  # compiled before the signal can come
print("ready", flush=True)
m = 10**7  # bytes per micro-batch: the full run, operation by operation (several seconds in one piece)
# runs over and over, so that the signal meets a run however slowly the test that sends it is scheduled
for _ in range(30):
    simulate(np.ones(2), np.ones(2), m, activation_bytes=np.ones((m, 2)))
print("finished", flush=True)
"""


@pytest.mark.slow
def test_a_long_run_stops_on_ctrl_c():
    proc = subprocess.Popen(
        [sys.executable, "-c", LONG_RUN], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 5, "the run did not stop at the next chunk"
    assert "KeyboardInterrupt" in err and "finished" not in out
