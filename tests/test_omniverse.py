"""The whole-run comparison (omnibal_kernels.omniverse): its invariants as properties, its command line on bad
input, and the model shapes it runs against the published parameter counts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnibal_kernels.balance.cost import CostModel
from omnibal_kernels.cli import main
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.omniverse import (
    CONFIGURATIONS,
    Layout,
    MicroBatches,
    affine_profile,
    epoch_times,
    micro_batch_scales,
    omniverse,
    scaled_profile,
)
from omnibal_kernels.omniverse.data import padded_micro_batches
from omnibal_kernels.pipeline import CONFIGS, PUBLISHED_PARAMETERS, LayerProfile, ModelProfile, kind_costs, partition

# The bundled and synthetic data sets raise the capacities of target_batch_size for their longest samples.
pytestmark = pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")

NAMES = (*CONFIGURATIONS, "all")
COST = CostModel(vit_linear=2.0, vit_quadratic=0.05, llm_linear=0.01, llm_quadratic=1e-5)


def _profile(rng: np.random.Generator, vit_layers: int, llm_layers: int) -> ModelProfile:
    """A VLM-like chain with random per-layer times and bytes (one micro-batch of the reference loads)."""
    kinds = ["vit"] * vit_layers + ["projector"] + ["llm"] * llm_layers + ["head"]
    layers = []
    for i, kind in enumerate(kinds):
        fwd = float(rng.uniform(0.5, 3.0))
        layers.append(
            LayerProfile(
                name=f"{kind}.{i}",
                kind=kind,
                forward_ms=fwd,
                backward_ms=2 * fwd,
                activation_bytes=int(rng.integers(50, 400)) * 2**20,
                static_bytes=int(rng.integers(10, 1500)) * 2**20,
                output_bytes=int(rng.integers(1, 8)) * 2**20,
            )
        )
    return ModelProfile(tuple(layers))


def _lengths(rng: np.random.Generator, n: int) -> Lengths:
    tiles = rng.integers(0, 6, n)
    return Lengths(tiles, tiles * 16 + rng.integers(5, 300, n))


def _check(result, budget_gib: float) -> None:
    names = [c.name for c in result.configurations]
    assert names == list(NAMES)
    base = result["baseline"]
    for c in result.configurations:
        # speed-ups and times are one set of numbers
        assert c.epoch_seconds == pytest.approx(c.step_seconds * c.steps, rel=1e-12)
        assert c.speedup == pytest.approx(base.epoch_seconds / c.epoch_seconds, rel=1e-12)
        # every configuration is within the budget or says it is not
        assert c.fits == (max(c.peak_bytes) <= budget_gib * 2**30 * (1 + 1e-9)), (c.name, c.peak_bytes)
        assert 0.0 <= c.bubble_fraction < 1.0 and 0.0 <= c.recompute_fraction < 1.0
    every = result["all"]
    assert every.fits
    for name in ("data", "model", "memory", "data+model", "baseline"):
        if result[name].fits:  # with all three freedoms the search can choose what a single part chose
            assert every.epoch_seconds <= result[name].epoch_seconds * (1 + 1e-12), name
    f = result.factors
    assert f["product"] == pytest.approx(f["data"] * f["model"] * f["memory"], rel=1e-12)
    assert f["joint"] == every.speedup


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    pp=st.integers(2, 3),
    dp=st.integers(1, 3),
    micro_batches=st.integers(2, 6),
    budget=st.floats(0.5, 8.0),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
)
def test_all_is_never_slower_and_every_peak_is_reported(seed, pp, dp, micro_batches, budget, schedule):
    rng = np.random.default_rng(seed)
    profile = _profile(rng, int(rng.integers(2, 5)), int(rng.integers(2, 6)))
    lengths = _lengths(rng, int(rng.integers(40, 160)))
    layout = Layout(gpus=dp * pp, pp=pp, tp=1, micro_batches=micro_batches, memory_gb=budget, schedule=schedule)
    reference = (np.array([2.0, 3.0]), np.array([200.0, 260.0]))
    try:
        result = omniverse(profile, layout, lengths, cost_model=COST, reference=reference, batch_size=3, seed=seed)
    except ValueError as exc:
        assert "memory_gb" in str(exc) and "fits" in str(exc)
        return
    _check(result, budget)


def test_the_default_run_of_the_paper_model():
    """InternVL-Chat-1.5 6+20B on 256 GPUs (PP 8, TP 4): each part speeds up the bundled epoch, memory balance
    stops recomputing where 80 GiB allows it, and balanced packs leave less of the bubble to the data."""
    result = omniverse("internvl-6b-20b", Layout(gpus=256, pp=8, tp=4, micro_batches=32, memory_gb=80))
    _check(result, 80)
    f = result.factors
    assert f["data"] > 1.05 and f["model"] >= 1.0 and f["memory"] > 1.05
    assert result["memory"].recompute_fraction < result["baseline"].recompute_fraction
    assert result["data"].bubble_from_data < result["baseline"].bubble_from_data
    assert result["baseline"].steps == pytest.approx(result["data"].steps, abs=2)  # as many samples per step


def test_equal_micro_batches_leave_no_bubble_to_the_data():
    """Micro-batches that all cost the same: the epoch's idle time is the schedule's own."""
    lengths = Lengths(np.full(96, 2), np.full(96, 100))
    data = padded_micro_batches(lengths, dp=2, micro_batches=4, batch_size=3)
    profile = _profile(np.random.default_rng(0), 2, 3)
    plan = partition(profile, 2, micro_batches=4, method="uniform", recompute="none")
    epoch = epoch_times(plan, profile, data, micro_batch_scales(data, COST))
    assert isinstance(data, MicroBatches) and data.padding_fraction == 0.0
    assert epoch.bubble_from_data == pytest.approx(0.0, abs=1e-12)
    assert epoch.step_ms == pytest.approx(np.full(epoch.step_ms.size, plan.step_ms))


def test_cli_json_lists_every_configuration(capsys):
    argv = ["omniverse", "--model", "internvl-300m-7b", "--gpus", "32", "--pp", "4", "--tp", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {c["name"]: c for c in out["configurations"]}
    assert list(rows) == list(NAMES)
    for c in rows.values():
        assert {"step_seconds", "epoch_seconds", "speedup", "peak_bytes", "bubble_fraction"} <= set(c)
        assert len(c["peak_bytes"]) == 4
    assert rows["baseline"]["speedup"] == 1.0


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (["--gpus", "250"], "gpus"),
        (["--model", "internvl-9b"], "model"),
        (["--memory-gb", "2"], "memory_gb"),
        (["--pp", "200", "--gpus", "800"], "pp"),
        (["--tp", "0"], "tp"),
        (["--micro-batches", "0"], "--micro-batches"),
        (["--micro-batches", "1000000000000"], "--micro-batches"),
        (["--memory-gb", "-1"], "--memory-gb"),
        (["--batch-size", "0"], "batch_size"),
        (["no-such-file.json"], "no-such-file.json"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(capsys, argv, setting):
    assert main(["omniverse", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and setting in lines[0] and "Traceback" not in captured.err, captured.err
    assert captured.out == ""


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_shapes_match_the_published_parameter_counts(name):
    assert CONFIGS[name].parameters()["total"] == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.01)


def test_internvl_chat_1_5_parts_match_its_model_card():
    """The InternVL 1.5 model card gives each part: ViT 5.54B, MLP 116.43M / 143.17M, LLM 19.86B / 34.39B."""
    small, large = CONFIGS["internvl-6b-20b"].parameters(), CONFIGS["internvl-6b-34b"].parameters()
    assert small["vit"] == pytest.approx(5.54e9, rel=2e-3) and large["vit"] == small["vit"]
    assert small["projector"] == pytest.approx(116.43e6, rel=1e-3)
    assert large["projector"] == pytest.approx(143.17e6, rel=1e-3)
    assert small["llm"] == pytest.approx(19.86e9, rel=1e-3) and large["llm"] == pytest.approx(34.39e9, rel=1e-3)


def test_qwen_runs_on_patches():
    """A patch-based ViT takes the bundled tiles as 1,024 patches each and runs every configuration."""
    result = omniverse(
        "qwen2.5-vl-7b", Layout(gpus=16, pp=2, tp=2, micro_batches=8, memory_gb=80), samples=4000, batch_size=4
    )
    _check(result, 80)
    assert result.data["balanced"]["capacities"][0] >= 1024


def _affine_truth(rng: np.random.Generator, reference: tuple) -> tuple[np.ndarray, np.ndarray, list, Callable]:
    """Per layer of ``_profile``'s chain a fixed time and a time per unit of its kind's cost; and the profile of
    any micro-batch ``(vit, llm)`` they give."""
    base = _profile(rng, 2, 3)
    fixed = rng.uniform(0.0, 1.0, (len(base), 2))
    slope = rng.uniform(0.1, 2.0, (len(base), 2))
    models = kind_costs(COST)

    def measured(loads: tuple) -> ModelProfile:
        vit, llm = (np.asarray(x, np.float64) for x in loads)
        layers = []
        for j, layer in enumerate(base.layers):
            cost = float(models[layer.kind].sample_costs(vit, llm).sum())
            t = fixed[j] + slope[j] * cost
            layers.append(replace(layer, forward_ms=float(t[0]), backward_ms=float(t[1])))
        return ModelProfile(tuple(layers), input_bytes=base.input_bytes)

    return fixed, slope, [layer.kind for layer in base.layers], measured


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_an_affine_profile_predicts_every_micro_batch_of_an_affine_machine(seed):
    """Layer times that are a fixed part plus a part proportional to their kind's cost: fitted from two
    reference micro-batches, the profile scaled to a data choice gives the times of its mean micro-batch."""
    rng = np.random.default_rng(seed)
    ref = (np.array([2.0, 1.0, 3.0]), np.array([300.0, 120.0, 500.0]))
    big = (np.concatenate([ref[0], [4.0, 1.0]]), np.concatenate([ref[1], [700.0, 90.0]]))
    fixed, _, _, measured = _affine_truth(rng, ref)
    fitted = affine_profile([measured(ref), measured(big)], [ref, big], COST)
    np.testing.assert_allclose(fitted.forward_ms, measured(ref).forward_ms, rtol=1e-12)
    np.testing.assert_allclose(fitted.fixed_forward_ms, np.minimum(fixed[:, 0], fitted.forward_ms), rtol=1e-6)
    np.testing.assert_allclose(fitted.fixed_backward_ms, np.minimum(fixed[:, 1], fitted.backward_ms), rtol=1e-6)
    # one micro-batch of other loads as the whole data: the scaled profile is what the machine measures
    other = (np.array([1.0, 5.0]), np.array([200.0, 640.0]))
    data = MicroBatches("balanced", other[0], other[1], np.array([0, 2]), np.zeros((1, 1, 1), np.int64), 2, 0.0)
    scaled = scaled_profile(fitted, ref, data, COST)
    np.testing.assert_allclose(scaled.forward_ms, measured(other).forward_ms, rtol=1e-6)
    np.testing.assert_allclose(scaled.backward_ms, measured(other).backward_ms, rtol=1e-6)


def test_affine_profile_bad_input():
    rng = np.random.default_rng(0)
    ref = (np.array([2.0]), np.array([300.0]))
    _, _, _, measured = _affine_truth(rng, ref)
    one = measured(ref)
    with pytest.raises(TypeError, match="profiles must be a sequence of ModelProfile"):
        affine_profile(one, [ref], COST)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="profiles: need two or more"):
        affine_profile([one], [ref], COST)
    with pytest.raises(ValueError, match="profiles: need two or more"):
        affine_profile([one, one], [ref], COST)
    with pytest.raises(TypeError, match=r"profiles\[1\] must be a ModelProfile"):
        affine_profile([one, "p"], [ref, ref], COST)  # type: ignore[list-item]
    other = ModelProfile(tuple(replace(x, name=x.name + "!") for x in one.layers))
    with pytest.raises(ValueError, match=r"profiles\[1\] is of another chain"):
        affine_profile([one, other], [ref, ref], COST)
    # references of one cost say nothing of a fixed part
    assert not affine_profile([one, one], [ref, ref], COST).fixed_forward_ms.any()
