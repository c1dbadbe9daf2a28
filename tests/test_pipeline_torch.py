"""Measured profiles, apply_recompute, the torch.distributed.pipelining forms, and a real 2-process pipeline."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from omnibal_kernels.pipeline import (
    apply_recompute,
    measure_profile,
    measure_saved_bytes,
    partition,
    pipelining_split_spec,
    stage_modules,
)
from omnibal_kernels.pipeline.tiny_vlm import TinyVLMConfig, build_tiny_vlm, tiny_vlm_kinds

ROOT = Path(__file__).resolve().parents[1]
SMALL = TinyVLMConfig(vit_layers=3, vit_width=32, patch_dim=12, vision_tokens=64, llm_layers=3, llm_width=48,
                      text_tokens=32, vocab=64)


def _batch(c: TinyVLMConfig, batch: int = 2):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(batch, c.vision_tokens, c.patch_dim, generator=g),
            torch.randint(0, c.vocab, (batch, c.text_tokens), generator=g))


@pytest.fixture(scope="module")
def small_profile():
    model = build_tiny_vlm(SMALL)
    return measure_profile(model, _batch(SMALL), kinds=tiny_vlm_kinds(model), repeats=1)


def test_measured_profile_fields(small_profile):
    prof = small_profile
    assert prof.names == ["embed", "vit_0", "vit_1", "vit_2", "projector", "llm_0", "llm_1", "llm_2", "head"]
    assert [layer.kind for layer in prof.layers][:2] == ["vit", "vit"] and prof.layers[-1].kind == "head"
    assert all(layer.forward_ms > 0 and layer.backward_ms > 0 for layer in prof.layers)
    # Outputs: (2, 64 + 32, width) float32 before the projector, LLM width after, logits at the head.
    assert prof.layers[1].output_bytes == 2 * 96 * 32 * 4
    assert prof.layers[5].output_bytes == 2 * 96 * 48 * 4
    assert prof.layers[-1].output_bytes == 2 * 32 * 64 * 4
    assert prof.input_bytes == 2 * 64 * 12 * 4 + 2 * 32 * 8
    # Adam: weights + gradients (fp32) + two moments = 16 bytes per parameter.
    model = build_tiny_vlm(SMALL)
    assert prof.layers[5].static_bytes == 16 * sum(p.numel() for p in model.llm_0.parameters())
    # Identical blocks save identical bytes.
    assert len({prof.layers[i].activation_bytes for i in (1, 2, 3)}) == 1


@pytest.mark.parametrize("recompute", [[], ["vit_1"], ["embed", "vit_0", "llm_2"], ["projector", "llm_0", "head"],
                                       ["vit_0", "vit_1", "vit_2", "llm_0", "llm_1", "llm_2"]])
def test_saved_bytes_under_apply_recompute_match_the_prediction(small_profile, recompute):
    """Bytes alive after the forward (tracked storage by storage) within 5% of what the profile predicts."""
    prof = small_profile
    model = apply_recompute(build_tiny_vlm(SMALL), recompute)
    inputs = _batch(SMALL)
    _, measured = measure_saved_bytes(lambda: model(*(t.clone() for t in inputs)))
    idx = [prof.names.index(name) for name in recompute]
    inp = prof.input_bytes_per_layer
    predicted = prof.activation_bytes.sum() - sum(prof.activation_bytes[j] - inp[j] for j in idx)
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
    if recompute:
        assert measured < prof.activation_bytes.sum()


def test_apply_recompute_keeps_the_gradients_and_rejects_unknown_names():
    inputs = _batch(SMALL)
    plain = build_tiny_vlm(SMALL)
    wrapped = apply_recompute(build_tiny_vlm(SMALL), ["vit_0", "llm_1", "llm_1"])
    for model in (plain, wrapped):
        model(*inputs).square().mean().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="'vit_9' is not a sub-module"):
        apply_recompute(wrapped, ["vit_9"])


def test_split_spec_with_the_pipelining_tracer(small_profile):
    from torch.distributed.pipelining import pipeline

    plan = partition(small_profile, 2, micro_batches=2)
    model = build_tiny_vlm(SMALL)
    pipe = pipeline(model, mb_args=_batch(SMALL, 1), split_spec=pipelining_split_spec(plan))
    assert pipe.num_stages == 2
    for s in range(2):
        assert [n for n, _ in pipe.get_stage_module(s).named_children()] == plan.layer_names(s)
    # Manual stages hold the same layers and compute the same output.
    stages = stage_modules(model, plan)
    assert [[n for n, _ in st.named_children()] for st in stages] == [plan.layer_names(s) for s in range(2)]
    x = _batch(SMALL, 1)
    torch.testing.assert_close(stages[1](stages[0](*x)), model(*x))


@pytest.mark.slow
def test_real_two_process_pipeline_matches_the_unsplit_model(monkeypatch):
    """The example: the searched and the uniform split on 2 gloo processes under torch.distributed.pipelining."""
    # Spawned workers import the example by name: they get this sys.path.
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = importlib.import_module("pipeline_tiny_vlm")
    report = example.run(steps=2, micro_batches=3, repeats=1, c=example.SMALL)
    ref = report["reference_losses"]
    assert len(ref) == 2
    for label in ("searched", "uniform"):
        p = report["plans"][label]
        assert p["losses"] == pytest.approx(ref, rel=1e-5), label
        for pred, meas in zip(p["activation_bytes"], p["measured_saved_bytes"]):
            assert abs(meas - pred) <= 0.05 * pred, (label, pred, meas)
        assert all(t > 0 for t in p["measured_compute_ms"] + p["measured_step_ms"])
        assert max(p["peak_bytes"]) <= report["budget_bytes"] * (1 + 1e-9) or not p["fits"]
    searched = report["plans"]["searched"]
    assert searched["fits"] and any(searched["recompute"])  # the budget makes the plan recompute something
    assert searched["bottleneck_ms"] <= report["plans"]["uniform"]["bottleneck_ms"]


def linear_chain():
    """A factory for ``omnibal-kernels profile --model``: three layers and a batch."""
    layers = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    return layers, torch.randn(16, 8), ["llm", "llm", "head"]


def test_cli_profile_measures_a_model_factory(tmp_path, capsys, monkeypatch):
    from omnibal_kernels.cli import main
    from omnibal_kernels.pipeline import load_profile

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    out = tmp_path / "measured.json"
    assert main(["profile", "--model", "test_pipeline_torch:linear_chain", "--repeats", "1", "--out", str(out)]) == 0
    prof = load_profile(out)
    assert prof.names == ["0", "1", "2"] and prof.layers[2].kind == "head"
    assert prof.layers[0].output_bytes == 16 * 32 * 4 and prof.input_bytes == 16 * 8 * 4
    # GELU keeps its input (16 x 32 floats); the first Linear keeps its input (16 x 8 floats).
    assert prof.layers[1].activation_bytes == 16 * 32 * 4 and prof.layers[0].activation_bytes == 16 * 8 * 4
    assert "0" in capsys.readouterr().out
    assert main(["profile", "--model", "test_pipeline_torch:missing"]) == 2
