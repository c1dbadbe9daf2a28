"""The measured-training report (bench/training.py): its fields and arithmetic on records made from a known cost,
the turns of the schedule, and the one-device path that the GPU check runs, end to end on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnibal_kernels.balance import CostModel
from omnibal_kernels.bench.training import (
    AGREEMENT_TARGET,
    FIELDS,
    MODES,
    SPEEDUP_TARGET,
    Sizes,
    Workload,
    measure_on_device,
    run_schedule,
    summarize,
)
from omnibal_kernels.testing.tiny_vlm import TinyVLM

SIZES = Sizes(samples=96, batch=6, hidden=32, layers=1, rounds=2, calibration_packs=24, warmup=1)
# the "true" seconds of the synthetic records: per tile, per token, per token squared, per sample, per pack
TRUTH = dict(vit=2e-3, llm=1e-4, llm2=3e-7, sample=5e-4, pack=2e-2)


def _workload() -> Workload:
    return Workload.build(SIZES, seed=3, cost_model=TinyVLM(hidden=32, vit_hidden=16, layers=1).cost_model())


def _seconds(vit: np.ndarray, llm: np.ndarray) -> float:
    """One pack's time under TRUTH, written out here rather than through CostModel."""
    return float(
        TRUTH["pack"] + np.sum(TRUTH["vit"] * vit + TRUTH["llm"] * llm + TRUTH["llm2"] * llm**2 + TRUTH["sample"])
    )


def _packs(work: Workload, mode: str) -> list[np.ndarray]:
    plan = work.plans[mode]
    return [plan.pack_samples[a:b] for a, b in zip(plan.pack_offsets[:-1], plan.pack_offsets[1:])]


def _records(work: Workload, scale_balanced: float = 1.0, noise: float = 0.0) -> dict[str, np.ndarray]:
    """What run_schedule would record if every step took TRUTH's time: a padded batch computes every sample at
    its longest sample's tokens; ``noise`` puts +-noise on alternate rounds (their mean is the truth)."""
    lengths, ranks = work.lengths, SIZES.world_size
    out: dict[str, np.ndarray] = {}
    for mode in ("random", "balanced"):
        packs = _packs(work, mode)
        step_packs = work.plans[mode].step_packs
        times = np.empty(step_packs.shape)
        for (j, r), p in np.ndenumerate(step_packs):
            ids = packs[int(p)]
            llm = np.full(ids.shape[0], lengths.llm[ids].max()) if mode == "random" else lengths.llm[ids]
            times[j, r] = _seconds(lengths.vit[ids], llm) * (scale_balanced if mode == "balanced" else 1.0)
        out[mode] = np.zeros((SIZES.rounds, *times.shape, len(FIELDS)))
        for rnd in range(SIZES.rounds):
            out[mode][rnd, ..., 0] = times * (1 + noise * (-1) ** rnd)
            out[mode][rnd, ..., 3] = times.max(axis=1, keepdims=True) * 1.5  # the step waits for the slower rank
    steps = work.steps("calibration")
    which = np.array(
        [
            [[work.calibration_pack(rnd, c, r) for r in range(ranks)] for c in range(steps)]
            for rnd in range(SIZES.rounds)
        ]
    )
    cal = work.calibration_lengths
    out["calibration"] = np.zeros((SIZES.rounds, steps, ranks, len(FIELDS)))
    out["calibration"][..., 0] = np.vectorize(
        lambda p: _seconds(cal.vit[work.calibration[p]], cal.llm[work.calibration[p]])
    )(which)
    out["calibration_pack"] = which
    return out


def test_summary_of_a_known_cost_predicts_it_and_reports_every_field() -> None:
    work = _workload()
    records = _records(work, noise=0.05)
    out = summarize(work, records, seed=0, flops=TinyVLM(hidden=32, vit_hidden=16, layers=1).cost_model())
    for mode in ("random", "balanced"):
        busy = records[mode][..., 0].mean(axis=0)  # (steps, ranks): each step's mean over the rounds
        assert out[f"{mode}_s"] == pytest.approx(busy.max(axis=1).sum())
        assert out[f"{mode}_busy_s"] == pytest.approx(busy.sum(axis=0).tolist())
        assert len(out[f"{mode}_busy_predicted_s"]) == SIZES.world_size
        assert out[f"{mode}_wall_s"] == pytest.approx(1.5 * busy.max(axis=1).sum())
        assert out[f"{mode}_steps"] == work.plans[mode].num_steps
    assert out["speedup"] == pytest.approx(
        (out["balanced_tokens"] / out["balanced_s"]) / (out["random_tokens"] / out["random_s"])
    )
    # the calibration packs are other samples than the run's: the fit recovers the truth and predicts the run
    assert out["busy_error_max"] < 1e-3 and abs(out["speedup_error"]) < 1e-3
    assert out["calibration"]["heldout_error"]["median"] < 1e-3
    assert out["speedup"] > 1.0 and 0 < out["padding_random"] < 1
    assert out["targets"] == {"speedup": SPEEDUP_TARGET, "agreement": AGREEMENT_TARGET}
    assert out["misses"] == (
        [] if out["speedup"] >= SPEEDUP_TARGET else [f"measured speed-up {out['speedup']:.3f}x < {SPEEDUP_TARGET}x"]
    )


def test_summary_reports_a_prediction_that_misses() -> None:
    """Balanced steps 25% slower than any cost of their loads: the report says the prediction is off by that."""
    work = _workload()
    flops = TinyVLM(hidden=32, vit_hidden=16, layers=1).cost_model()
    exact = summarize(work, _records(work), seed=0, flops=flops)
    out = summarize(work, _records(work, scale_balanced=1.25), seed=0, flops=flops)
    assert out["busy_error_max"] == pytest.approx(0.2, abs=1e-3)  # predicted / measured - 1 = 1 / 1.25 - 1
    assert out["speedup"] == pytest.approx(exact["speedup"] / 1.25)
    assert out["speedup_error"] == pytest.approx(0.25, abs=2e-3)
    assert any("predicted speed-up" in m for m in out["misses"])
    assert any("busy time" in m for m in out["misses"])


def test_schedule_takes_turns_and_runs_every_calibration_pack_on_every_rank() -> None:
    work = _workload()
    calls: list[tuple[str, int, int]] = []

    def step(mode: str, rank: int, pack: int) -> np.ndarray:
        calls.append((mode, rank, pack))
        return np.full(len(FIELDS), 1.0)

    records = run_schedule(work, SIZES, [0, 1], step, progress=False)
    timed = [c for c in calls if c[2] >= 0]
    assert len(calls) - len(timed) == len(MODES) * SIZES.warmup * 2
    for mode in ("random", "balanced"):
        assert records[mode].shape == (SIZES.rounds, work.plans[mode].num_steps, 2, len(FIELDS))
        assert not np.isnan(records[mode]).any()
        assert sorted(p for m, r, p in timed if m == mode and r == 0) == sorted(
            list(range(work.plans[mode].num_steps)) * SIZES.rounds
        )
    # the modes alternate step by step: no two steps of one measured mode run back to back
    modes = [m for m, r, _ in timed if r == 0]
    assert all(a != b for a, b in zip(modes, modes[1:]))
    ran = {(r, p) for m, r, p in timed if m == "calibration"}
    assert {p for _, p in ran} == set(range(len(work.calibration)))
    assert records["calibration_pack"].shape == records["calibration"].shape[:3]


def test_too_few_calibration_runs_is_refused_before_any_training() -> None:
    sizes = Sizes(samples=48, batch=6, hidden=32, layers=1, rounds=1, calibration_packs=12)
    with pytest.raises(ValueError, match="12 calibration packs but only 8 calibration runs"):
        Workload.build(sizes, seed=0, cost_model=TinyVLM(hidden=32, vit_hidden=16, layers=1).cost_model())


@pytest.mark.slow
def test_one_device_path_trains_every_mode_on_the_cpu() -> None:
    """The code the GPU check runs (every rank in turn on one device), on the CPU with tiny sizes: real training
    steps of every mode, a fit, a report. The CUDA clock and autocast are not exercised here."""
    sizes = Sizes(samples=48, batch=6, hidden=32, layers=1, rounds=1, calibration_packs=8, warmup=1)
    torch.set_num_threads(1)
    out = measure_on_device(sizes, seed=0, device=torch.device("cpu"), progress=False)
    assert out["device"] == "cpu" and out["samples"] == 48
    for mode in ("random", "balanced"):
        assert out[f"{mode}_s"] > 0 and len(out[f"{mode}_busy_s"]) == 2
        assert all(p > 0 for p in out[f"{mode}_busy_predicted_s"])
        assert out[f"wait_fraction_{mode}"] == 0.0  # one device: nothing to wait for
    assert out["calibration"]["packs"] == 8 and np.isfinite(out["busy_error_max"])
    assert set(CostModel.from_dict(out["calibration"]["model"]).to_dict()) == set(out["flops_model"])


def test_calibration_packs_hold_distinct_lengths_within_their_ranges() -> None:
    from omnibal_kernels.bench import training

    lengths, packs = training.calibration_workload(200, seed=5)
    assert sorted(np.concatenate(packs).tolist()) == list(range(len(lengths)))
    text = lengths.llm - lengths.vit * training.PATCHES
    for p in packs:
        assert training.CALIBRATION_SAMPLES[0] <= p.shape[0] <= training.CALIBRATION_SAMPLES[1]
        assert np.unique(lengths.llm[p]).shape[0] == p.shape[0]  # one sdpa call per sample, as in the run's packs
        assert np.unique(lengths.vit[p]).shape[0] == 1
        assert lengths.llm[p].sum() <= training.CALIBRATION_MAX_TOKENS
        assert text[p].min() >= training.CALIBRATION_TEXT[0] and text[p].max() <= training.CALIBRATION_TEXT[1]
        assert np.ptp(text[p]) <= 2 * training.CALIBRATION_JITTER
