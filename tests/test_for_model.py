"""``PackCollator.for_model``: real transformers models train on a packed batch exactly as on its samples.

Each model is a tiny random config of ``omnibal_kernels.testing.hf_models`` (1 layer, hidden 32, float32, CPU).
For every model and both attention implementations that run on the CPU (sdpa, eager), the packed loss and its
gradients equal the per-sample ones, each sample run alone with the model computing its own positions
(``get_rope_index`` for Qwen-VL), within 1e-5 relative. The negative controls break one thing the collator sets
(the text-position row, ``use_cache=False``) and check that the same comparison then fails: the test sees
attention leak across samples.
"""

from __future__ import annotations

import functools
import pickle
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from omnibal_kernels import PackOptions  # noqa: E402
from omnibal_kernels.model_inputs import forward_keys, model_inputs  # noqa: E402
from omnibal_kernels.packing import PackCollator  # noqa: E402
from omnibal_kernels.testing.hf_models import (  # noqa: E402
    CONFIGS,
    IMG,
    IMG_CONTEXT,
    MERGE,
    TEMPORAL,
    TILE_TOKENS,
    VID,
    alone,
    internvl_sample,
    mrope_text_config,
    qwen_sample,
    text_ids,
    tiny_model,
)
from omnibal_kernels.vision.mrope import installed_mrope_convention, video_time_positions  # noqa: E402

RTOL = 1e-5
_llama, _qwen2_vl, _qwen2_5_vl, _internvl = (CONFIGS[name] for name in ("llama", "qwen2_vl", "qwen2_5_vl", "internvl"))
_text, _qwen_sample, _internvl_sample, _alone = text_ids, qwen_sample, internvl_sample, alone
_mrope_text = mrope_text_config


def _model(name: str, attn: str) -> Any:
    return tiny_model(name, attn)


# ------------------------------------------------------------------------------------------------ samples


def _samples(name: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    torch.manual_seed(7)
    if name in ("llama", "qwen2"):
        return [{"input_ids": torch.tensor(_text(rng, n))} for n in (9, 1, 14, 5)]
    if name == "internvl":  # video frames are tiles too, in pixel_values
        return [_internvl_sample(rng, 2), _internvl_sample(rng, 0), _internvl_sample(rng, 1), _internvl_sample(rng, 3)]
    seconds = [0.08] if name == "qwen2_5_vl" else None  # 25 fps
    return [
        _qwen_sample(rng, [(1, 4, 4)]),
        {"input_ids": torch.tensor(_text(rng, 6))},
        _qwen_sample(rng, [(1, 2, 6), (1, 4, 2)], [(3, 2, 4)], seconds),
        _qwen_sample(rng, [], [(6, 2, 2)], [0.5] if seconds else None),  # a long video: 6 steps > max(h, w)/2
    ]


# ------------------------------------------------------------------------------------------------ comparison


def _targets(labels: torch.Tensor) -> int:
    return int((labels.reshape(-1)[1:] != -100).sum())


def _loss_and_grads(model: Any, batches: list[dict[str, Any]]) -> tuple[float, dict[str, torch.Tensor]]:
    """Summed token loss over the batches (HF's mean loss times its target count) and its gradients."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        count = _targets(batch["labels"])
        if count == 0:  # a one-token sample: nothing to predict (its mean loss alone is 0 / 0)
            continue
        loss = model(**batch).loss * count
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


@functools.cache
def _reference(name: str, attn: str) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of ``_samples(name)`` one at a time (the model and samples are seeded: computed once)."""
    return _loss_and_grads(_model(name, attn), [_alone(s) for s in _samples(name)])


def _assert_same_training(model: Any, packed: dict[str, Any], name: str, attn: str) -> None:
    want_loss, want = _reference(name, attn)
    got_loss, got = _loss_and_grads(model, [packed])
    assert abs(got_loss - want_loss) <= RTOL * abs(want_loss), ("loss", got_loss, want_loss)
    assert got.keys() == want.keys()
    for name, g in want.items():
        err = float((got[name] - g).norm() / g.norm().clamp_min(1e-30))
        assert err <= RTOL, (name, err)


MODELS = list(CONFIGS)
# the text models stay in the fast subset (pytest -m "not slow"); the vision-language ones take seconds each
TRAINED = [name if name in ("llama", "qwen2") else pytest.param(name, marks=pytest.mark.slow) for name in MODELS]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", TRAINED)
def test_packed_batch_trains_like_its_samples(name: str, attn: str) -> None:
    model = _model(name, attn)
    samples = _samples(name)
    collator = PackCollator.for_model(model, warmup=False)
    batch = collator(samples)
    assert batch["use_cache"] is False
    assert "cu_seqlens" not in batch and "max_seqlen" not in batch
    _assert_same_training(model, dict(batch), name, attn)


def test_batches_from_dataloader_workers() -> None:
    """Inside a worker the fields are built in shared memory; the model's keys come back the same."""
    import multiprocessing

    model = _model("qwen2_5_vl", "sdpa")
    samples = _samples("qwen2_5_vl")
    collator = PackCollator.for_model(model)
    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    loader = torch.utils.data.DataLoader(
        samples, batch_size=len(samples), collate_fn=collator, num_workers=1, multiprocessing_context=context
    )
    got, want = next(iter(loader)), collator(samples)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value, key


def test_padding_segment_changes_nothing() -> None:
    model = _model("qwen2_vl", "sdpa")
    samples = _samples("qwen2_vl")
    batch = PackCollator.for_model(model, PackOptions(pad_to_multiple_of=64), warmup=False)(samples)
    assert batch["input_ids"].shape[1] % 64 == 0 and batch["position_ids"].shape[0] == 4
    _assert_same_training(model, dict(batch), "qwen2_vl", "sdpa")


# ------------------------------------------------------------------------------------------------ negative controls


@pytest.mark.parametrize("name", ["llama", "internvl"])
def test_leak_with_a_cache_is_detected(name: str) -> None:
    """With use_cache on, transformers skips packed-sequence detection: samples attend to each other."""
    model = _model(name, "sdpa")
    samples = _samples(name)
    batch = dict(PackCollator.for_model(model, warmup=False)(samples))
    batch["use_cache"] = True
    with pytest.raises(AssertionError):
        _assert_same_training(model, batch, name, "sdpa")


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_leak_with_three_mrope_rows_is_detected(name: str) -> None:
    """The 3-row layout (no text-position row) hides the packing from the Qwen-VL text model."""
    model = _model(name, "sdpa")
    samples = _samples(name)
    batch = dict(PackCollator.for_model(model, warmup=False)(samples))
    batch["position_ids"] = batch["position_ids"][1:]
    with pytest.raises(AssertionError):
        _assert_same_training(model, batch, name, "sdpa")


# ------------------------------------------------------------------------------------------------ positions


def _rope_index(model: Any, sample: dict[str, Any]) -> torch.Tensor:
    inputs = _alone(sample)
    kwargs = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in inputs}
    if model.config.model_type == "qwen2_vl":
        kwargs.pop("second_per_grid_ts", None)
    ids = inputs["input_ids"]
    types = inputs.get("mm_token_type_ids", torch.zeros_like(ids, dtype=torch.int32))
    return model.model.get_rope_index(ids, types, **kwargs)[0]


def _position_samples(rng: np.random.Generator, name: str, long: bool) -> list[dict[str, Any]]:
    out = []
    for fps in (25.0, 50.0, 12.5, 2.0, 1.0):
        # 26+ grid steps: past step 25, where float32 and float64 times part at 25 fps; long at every rate
        steps = int(rng.integers(26, 40)) if long else int(rng.integers(1, 4))
        h, w = (int(x) * 2 for x in rng.integers(1, 4, 2))
        images = [(1, int(rng.integers(1, 4)) * 2, int(rng.integers(1, 4)) * 2) for _ in range(rng.integers(0, 3))]
        seconds = [TEMPORAL / fps] if name == "qwen2_5_vl" else None
        out.append(_qwen_sample(rng, images, [(steps, h, w)], seconds))
    out.append({"input_ids": torch.tensor(_text(rng, 5))})
    return out


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_positions_equal_get_rope_index(name: str) -> None:
    model = _model(name, "sdpa")
    rng = np.random.default_rng(3)
    samples = _position_samples(rng, name, long=True) + _position_samples(rng, name, long=False)
    batch = PackCollator.for_model(model, warmup=False)(samples)
    positions = batch["position_ids"]
    assert positions.shape == (4, 1, sum(s["input_ids"].numel() for s in samples))
    start = 0
    for i, sample in enumerate(samples):
        end = start + sample["input_ids"].numel()
        assert torch.equal(positions[1:, :, start:end], _rope_index(model, sample)), f"sample {i}"
        assert torch.equal(positions[0, 0, start:end], torch.arange(end - start)), f"sample {i} text row"
        start = end


def test_mrope_convention_numberings() -> None:
    """After a long video: ``max_hw`` goes on at start + max(h, w) / 2, ``max_position`` at the largest position + 1;
    the default is what the installed transformers computes (its own get_rope_index)."""
    model = _model("qwen2_vl", "sdpa")
    sample = _qwen_sample(np.random.default_rng(0), [], [(7, 2, 4)])  # 7 time steps, max(h, w) / 2 = 2
    ids = sample["input_ids"]
    first, last = int(torch.nonzero(ids == VID).min()), int(torch.nonzero(ids == VID).max())
    positions = {}
    for convention in (None, "max_hw", "max_position"):
        collator = PackCollator.for_model(model, PackOptions(mrope_convention=convention), warmup=False)
        assert collator.options.mrope_convention == (convention or installed_mrope_convention())
        positions[convention] = collator([sample])["position_ids"][1:]
    assert torch.equal(positions[None], _rope_index(model, sample))
    assert torch.equal(positions[None], positions[installed_mrope_convention()])
    after_hw, after_max = int(positions["max_hw"][0, 0, last + 1]), int(positions["max_position"][0, 0, last + 1])
    assert after_hw == first + 2
    assert after_max == int(positions["max_position"][:, 0, : last + 1].max()) + 1 == first + 7
    with pytest.raises(ValueError, match="mrope_convention"):
        PackCollator.for_model(model, PackOptions(mrope_convention="qwen"), warmup=False)


def test_an_mrope_config_without_vision_config_is_refused() -> None:
    config = SimpleNamespace(model_type="qwen2_vl", to_dict=dict, image_token_id=1, video_token_id=2)
    with pytest.raises(ValueError, match="qwen2_vl: the config has no vision_config"):
        model_inputs(config)


def test_video_time_positions_in_float32() -> None:
    """At 25 fps (0.08 s per grid step, 2 tokens per second) step 25 sits at float32(25 * 0.16) = 4.0."""
    steps = video_time_positions(26, 0.08, 2)
    assert int(steps[25]) == 4
    assert int(np.floor(25 * float(np.float32(0.08)) * 2)) == 3  # float64 arithmetic would give 3


# ------------------------------------------------------------------------------------------------ what is read


def test_reads_ids_layout_and_keys() -> None:
    spec = model_inputs(_qwen2_5_vl())
    assert spec.options == {
        "image_token_id": IMG,
        "video_token_id": VID,
        "spatial_merge_size": MERGE,
        "mrope_text_row": True,
        "tokens_per_second": 2,
    }
    assert {"pixel_values", "image_grid_thw", "pixel_values_videos", "second_per_grid_ts", "position_ids"} <= spec.keys
    # the vision tower would take these as its own boundaries or pass them next to its own
    assert not {"cu_seqlens", "max_seqlen", "cu_seq_lens_q", "max_length_q", "seq_idx"} & spec.keys
    assert "second_per_grid_ts" not in model_inputs(_qwen2_vl()).keys
    text = model_inputs(_llama())
    assert text.options == {} and {"cu_seq_lens_q", "max_length_k", "position_ids"} <= text.keys
    assert text.constants == {"use_cache": False}
    assert model_inputs(_internvl()).constants == {"use_cache": False}
    model = _model("qwen2_vl", "eager")
    assert model_inputs(model) == model_inputs(model.config)
    collator = PackCollator.for_model(model, warmup=False)
    copy = pickle.loads(pickle.dumps(collator))  # DataLoader workers started by spawn get a copy
    assert copy.model_inputs == collator.model_inputs and copy.options == collator.options
    assert forward_keys(type(model).forward) >= {"input_ids", "labels", "cu_seq_lens_q"}


def _forward_with_string_annotations(input_ids, labels=None, *, use_cache=None, **kwargs: Unpack[TransformersKwargs]):  # noqa: F821 (never evaluated)
    """A forward whose annotations are strings, as in modules with ``from __future__ import annotations``."""


TransformersKwargs = transformers.utils.generic.TransformersKwargs


def test_forward_keys_reads_unpacked_kwargs() -> None:
    keys = forward_keys(_forward_with_string_annotations)
    assert {"input_ids", "labels", "use_cache", "cu_seq_lens_q", "max_length_k", "seq_idx"} <= keys
    assert "kwargs" not in keys and "cu_seqlens" not in keys
    assert forward_keys(lambda input_ids, **kwargs: None) == {"input_ids"}


def test_internvl_placeholders_checked_per_sample() -> None:
    spec = model_inputs(_internvl())
    assert (spec.tile_token_id, spec.tokens_per_tile) == (IMG_CONTEXT, TILE_TOKENS)
    collator = PackCollator.for_model(_internvl(), PackOptions(pad_to_multiple_of=32), warmup=False)
    samples = _samples("internvl")
    assert collator(samples)["pixel_values"].shape[0] == 6
    samples[2] = {**samples[2], "pixel_values": samples[0]["pixel_values"]}  # 2 tiles, placeholders for 1
    with pytest.raises(ValueError, match="sample 2: 4 image placeholder tokens .* 2 tiles"):
        collator(samples)
    text_only = {"input_ids": torch.tensor([5, IMG_CONTEXT, 6])}
    with pytest.raises(ValueError, match="sample 1: 1 image placeholder tokens .* 0 tiles"):
        collator([samples[0], text_only])


class _Wrapper(torch.nn.Module):
    """A wrapper whose forward hides position_ids in untyped keyword arguments."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, labels=None, **kwargs):
        return self.model(input_ids=input_ids, labels=labels, **kwargs)


def test_for_model_unwraps_or_refuses_wrappers() -> None:
    model = _model("llama", "sdpa")
    assert model_inputs(torch.nn.DataParallel(model)) == model_inputs(model)
    with pytest.raises(ValueError, match="position_ids"):
        PackCollator.for_model(_Wrapper(model), warmup=False)


def test_for_model_errors() -> None:
    with pytest.raises(TypeError, match="model_or_config"):
        PackCollator.for_model(object())
    with pytest.raises(ValueError, match="not supported"):
        PackCollator.for_model(transformers.LlavaConfig())
    with pytest.raises(ValueError, match="mRoPE"):
        PackCollator.for_model(transformers.Qwen2VLConfig(text_config=_mrope_text()).text_config)
