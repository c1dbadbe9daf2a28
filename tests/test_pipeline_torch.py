"""Measured profiles, apply_recompute, the torch.distributed.pipelining forms, and a real 2-process pipeline."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import pytest
import torch

from omnibal_kernels.pipeline import (
    ModelProfile,
    apply_recompute,
    measure_profile,
    measure_saved_bytes,
    partition,
    pipelining_split_spec,
    stage_modules,
)
from omnibal_kernels.pipeline.recompute import CheckpointWrapper
from omnibal_kernels.testing.tiny_vlm import (
    PATCHES,
    TILE,
    TinyVLM,
    chain_kinds,
    dense_micro_batch,
    make_sample,
    scaled_lengths,
)

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(hidden=48, vit_hidden=32, vit_layers=3, llm_layers=3)


def _chain():
    torch.manual_seed(0)
    return TinyVLM(**SIZES).as_chain()


def _batch():
    lengths = scaled_lengths(3, seed=3)
    pack = dense_micro_batch(
        [make_sample(lengths, i, 3) for i in range(3)],
        tokens=int(lengths.llm.sum()) + 64,
        tiles=int(lengths.vit.sum()) + 4,
    )
    return pack["input_ids"], pack["pixel_values"]


@pytest.fixture(scope="module")
def small_profile():
    chain = _chain()
    return measure_profile(chain, _batch(), kinds=chain_kinds(chain), repeats=1)


def test_chain_is_the_model():
    """The chain computes the model's dense forward with the model's own parameters."""
    torch.manual_seed(0)
    model = TinyVLM(**SIZES)
    chain = model.as_chain()
    ids, pix = _batch()
    torch.testing.assert_close(
        chain(ids, pix), model(ids, torch.arange(ids.shape[1])[None], pixel_values=pix), rtol=0, atol=0
    )
    assert {id(p) for p in chain.parameters()} == {id(p) for p in model.parameters()}


def test_measured_profile_fields(small_profile):
    prof = small_profile
    ids, pix = _batch()
    S, tiles = ids.shape[1], pix.shape[0]
    assert prof.names == ["vit_embed", "vit_0", "vit_1", "vit_2", "projector", "llm_0", "llm_1", "llm_2", "head"]
    assert [layer.kind for layer in prof.layers] == ["vit"] * 4 + ["projector"] + ["llm"] * 3 + ["head"]
    assert all(layer.forward_ms > 0 and layer.backward_ms > 0 for layer in prof.layers)
    # Outputs: the patches (tiles * 16, 32) and the ids as floats through the ViT, (1, S, 48) after the
    # projector, the logits (1, S, 128) at the head; the input is the int64 ids and the float32 pixels.
    assert prof.layers[1].output_bytes == 4 * (tiles * PATCHES * 32 + S)
    assert prof.layers[5].output_bytes == 4 * S * 48
    assert prof.layers[-1].output_bytes == 4 * S * 128
    assert prof.input_bytes == 8 * S + 4 * tiles * 3 * TILE * TILE
    # Adam: weights + gradients (fp32) + two moments = 16 bytes per parameter.
    chain = _chain()
    assert prof.layers[5].static_bytes == 16 * sum(p.numel() for p in chain.llm_0.parameters())
    # Identical blocks save identical bytes.
    assert len({prof.layers[i].activation_bytes for i in (1, 2, 3)}) == 1
    assert len({prof.layers[i].activation_bytes for i in (5, 6, 7)}) == 1


def test_measuring_a_profile_leaves_no_tensor_behind():
    """Every graph the measurement builds is freed: a process that profiles again and again (between rounds
    of training) does not grow."""
    import gc

    chain = _chain()
    batch = _batch()

    def live() -> int:
        gc.collect()
        # type(o), not isinstance: isinstance asks deprecated module proxies (torch.distributed.reduce_op) for
        # their class, which warns
        return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())

    measure_profile(chain, batch, repeats=1)
    before = live()
    for _ in range(2):
        measure_profile(chain, batch, repeats=1)
    assert live() == before


@pytest.mark.alone
def test_measured_recompute_cost():
    """Each layer timed under checkpoint as ``apply_recompute`` wraps it: what that adds to the backward (the
    forward run again) is there and positive, the JSON form keeps it, and ``recompute=False`` leaves it out
    (recomputation then priced as the forward again)."""
    torch.manual_seed(0)
    chain = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(2)])
    x = torch.randn(512, 256)
    # one torch thread timed by its own CPU time: a wall clock would count the time the process waits for a
    # core, and the CPU time of several threads their spinning
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prof = measure_profile(chain, x, repeats=5, timer=time.thread_time)
    finally:
        torch.set_num_threads(threads)
    assert all(layer.recompute_ms > 0 and layer.checkpoint_forward_ms >= 0 for layer in prof.layers)
    again = ModelProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert again == prof and (again.recompute_ms == prof.recompute_ms).all()
    plain = measure_profile(chain, x, repeats=1, recompute=False)
    assert all(layer.recompute_ms is None and layer.checkpoint_forward_ms == 0 for layer in plain.layers)
    assert (plain.recompute_ms == plain.forward_ms).all()
    # the chain itself is unchanged: no layer left wrapped
    assert not any(isinstance(m, CheckpointWrapper) for m in chain.modules())


@pytest.mark.parametrize(
    "recompute",
    [
        [],
        ["vit_1"],
        ["vit_embed", "vit_0", "llm_2"],
        ["projector", "llm_0", "head"],
        ["vit_0", "vit_1", "vit_2", "llm_0", "llm_1", "llm_2"],
    ],
)
def test_saved_bytes_under_apply_recompute_match_the_prediction(small_profile, recompute):
    """Bytes alive after the forward (tracked storage by storage) within 5% of what the profile predicts."""
    prof = small_profile
    chain = apply_recompute(_chain(), recompute)
    inputs = _batch()
    _, measured = measure_saved_bytes(lambda: chain(*(t.clone() for t in inputs)))
    idx = [prof.names.index(name) for name in recompute]
    inp = prof.input_bytes_per_layer
    predicted = prof.activation_bytes.sum() - sum(prof.activation_bytes[j] - inp[j] for j in idx)
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
    if recompute:
        assert measured < prof.activation_bytes.sum()


def test_apply_recompute_keeps_the_gradients_and_rejects_unknown_names():
    inputs = _batch()
    plain = _chain()
    wrapped = apply_recompute(_chain(), ["vit_0", "llm_1", "llm_1"])
    for model in (plain, wrapped):
        model(*inputs).square().mean().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="'vit_9' is not a sub-module"):
        apply_recompute(wrapped, ["vit_9"])


# torch's pipelining tracer warns of its own deprecated LeafSpec use, not of anything here.
@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")
@pytest.mark.slow
def test_split_spec_with_the_pipelining_tracer():
    """The tracer front end takes the split spec (on a chain it can trace: the tiny VLM's ViT runs varlen
    attention, which reads its sequence lengths, so it is split by hand with ``stage_modules``)."""
    from torch.distributed.pipelining import pipeline

    def linear_layers():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])

    x = torch.randn(4, 16)
    prof = measure_profile(linear_layers(), x, repeats=1)
    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        plan = partition(prof, 2, micro_batches=4, schedule=schedule, virtual_stages=v)
        # a fresh module per trace (tracing one module twice fails in torch 2.13)
        pipe = pipeline(linear_layers(), mb_args=(x,), split_spec=pipelining_split_spec(plan))
        assert pipe.num_stages == plan.num_stages
        for s in range(plan.num_stages):
            assert [n for n, _ in pipe.get_stage_module(s).named_children()] == plan.layer_names(s)
    # Manual stages hold the same layers and compute the same output.
    chain = _chain()
    prof = measure_profile(chain, _batch(), kinds=chain_kinds(chain), repeats=1)
    plan = partition(prof, 2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    stages = stage_modules(chain, plan)
    assert [[n for n, _ in st.named_children()] for st in stages] == [plan.layer_names(s) for s in range(4)]
    y = _batch()
    for st in stages:
        y = st(*y) if isinstance(y, tuple) else st(y)
    torch.testing.assert_close(y, chain(*_batch()))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["interleaved", "zbv"])
def test_real_two_process_pipeline_matches_the_unsplit_model(monkeypatch, schedule):
    """The example: the searched and the uniform split (2 ranks x 2 stages) on 2 gloo processes under
    torch.distributed.pipelining's ScheduleInterleaved1F1B and ScheduleZBVZeroBubble."""
    # Spawned workers import the example by name: they get this sys.path.
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = importlib.import_module("pipeline_tiny_vlm")
    report = example.run(steps=2, micro_batches=4, schedule=schedule, repeats=1, sizes=example.SMALL)
    assert report["schedule"] == schedule
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
    assert searched["virtual_stages"] == 2
    assert searched["stage_ranks"] == ([0, 1, 0, 1] if schedule == "interleaved" else [0, 1, 1, 0])
    assert searched["fits"] and any(searched["recompute"])  # the budget makes the plan recompute something
    assert searched["step_ms"] <= report["plans"]["uniform"]["step_ms"]


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
    assert main(["profile", "--model", "tiny-vlm", "--repeats", "1", "--json"]) == 0
    tiny = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in tiny["layers"]][:2] == ["vit_embed", "vit_0"] and tiny["layers"][-1][
        "kind"
    ] == "head"
