"""PackOptions: one flat frozen object checked where it is built, the one way options reach pack_batch and the
collator, and the one ``backend`` vocabulary of the package."""

from __future__ import annotations

import dataclasses
import pickle
import typing

import pytest
import torch

from omnibal_kernels import PackCollator, PackOptions, pack_batch
from omnibal_kernels._checks import BACKENDS, backends, check_backend
from omnibal_kernels.vision.mrope import installed_mrope_convention


def _samples() -> list[dict]:
    return [{"input_ids": torch.arange(5)}, {"input_ids": torch.arange(3), "labels": torch.arange(3) + 7}]


def _same_batch(a, b) -> None:
    assert list(a) == list(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_options_are_one_frozen_checked_object() -> None:
    opts = PackOptions(pad_to_length=16, max_num_seqs=4, ignore_index=-1, image_token_id=9, backend="torch")
    assert opts == PackOptions(pad_to_length=16, max_num_seqs=4, ignore_index=-1, image_token_id=9, backend="torch")
    assert hash(opts) == hash(PackOptions(**{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}))
    assert opts.mrope_enabled and opts.mrope_convention == installed_mrope_convention()
    assert not PackOptions().mrope_enabled
    assert pickle.loads(pickle.dumps(opts)) == opts
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.backend = "numba"  # type: ignore[misc]
    # every field is a real dataclass field with a type a checker sees (no attribute made at import time)
    hints = typing.get_type_hints(PackOptions)
    assert {f.name for f in dataclasses.fields(PackOptions)} == set(hints)
    assert opts.replace(pad_to_length=32, allow_empty=True) == dataclasses.replace(
        opts, pad_to_length=32, allow_empty=True
    )


def test_fields_are_checked_where_they_are_built() -> None:
    with pytest.raises(ValueError, match="pad_to_length=10 is not a multiple of pad_to_multiple_of=4"):
        PackOptions(pad_to_length=10, pad_to_multiple_of=4)
    with pytest.raises(ValueError, match="is not a multiple"):
        PackOptions(pad_to_length=16).replace(pad_to_multiple_of=5)
    with pytest.raises(TypeError, match="mask_first_label must be a bool"):
        PackOptions(mask_first_label=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="video_token_id needs image_token_id"):
        PackOptions(video_token_id=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'pad_to'"):
        PackOptions(pad_to=8)  # type: ignore[call-arg]


def test_options_reach_pack_batch_and_the_collator_one_way() -> None:
    samples = _samples()
    opts = PackOptions(pad_to_multiple_of=8, ignore_index=-1)
    _same_batch(
        pack_batch(samples, options=opts), pack_batch(samples, PackOptions(pad_to_multiple_of=8, ignore_index=-1))
    )
    merged = pack_batch(samples, opts.replace(pad_to_multiple_of=16))
    _same_batch(merged, pack_batch(samples, PackOptions(pad_to_multiple_of=16, ignore_index=-1)))
    assert merged["input_ids"].shape == (1, 16) and merged["labels"][0, 0] == -1
    collator = PackCollator(opts.replace(max_num_seqs=4), warmup=False)
    assert collator.options == PackOptions(pad_to_multiple_of=8, ignore_index=-1, max_num_seqs=4)
    assert opts == PackOptions(pad_to_multiple_of=8, ignore_index=-1)  # options are never changed in place
    with pytest.raises(TypeError, match="pack_batch: options must be a PackOptions or None, got dict"):
        pack_batch(samples, options={"pad_to_multiple_of": 8})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="PackCollator: options must be a PackOptions"):
        PackCollator({"pad_to_length": 8}, warmup=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'pad_to_multiple_of'"):
        PackCollator(pad_to_multiple_of=8)  # type: ignore[call-arg]


def test_one_backend_vocabulary() -> None:
    assert set(BACKENDS) == {"ops", "packing", "attention"}
    for stage, values in BACKENDS.items():
        assert backends(stage)[0] == "auto" and all(values.values()), stage  # every value has a meaning
        for value in values:
            assert check_backend("f", value, stage) == value
    other = {"ops": "numba", "packing": "triton", "attention": "cpu"}
    for stage, value in other.items():
        with pytest.raises(
            ValueError,
            match=rf"^f: backend must be one of {backends(stage)!r}, got '{value}'$".replace("(", r"\(").replace(
                ")", r"\)"
            ),
        ):
            check_backend("f", value, stage)
    with pytest.raises(ValueError, match="backend must be one of"):
        check_backend("f", ["auto"], "ops")  # unhashable values get the same error


def test_every_stage_checks_its_backend_with_the_one_message() -> None:
    from omnibal_kernels import unpad, varlen_attention
    from omnibal_kernels.vision import bucket_by_patches

    calls = {
        "packing": lambda: pack_batch(_samples(), PackOptions(backend="cpu")),
        "ops": lambda: unpad(torch.zeros(1, 2), [1], backend="numba"),
        "attention": lambda: varlen_attention(
            torch.zeros(2, 1, 4),
            torch.zeros(2, 1, 4),
            torch.zeros(2, 1, 4),
            torch.tensor([0, 2], dtype=torch.int32),
            2,
            backend="triton",
        ),
    }
    for stage, call in calls.items():
        with pytest.raises(ValueError, match=rf": backend must be one of \('auto', '{backends(stage)[1]}'"):
            call()
    with pytest.raises(ValueError, match=r"bucket_by_patches: backend must be one of \('auto', 'triton', 'cpu'\)"):
        bucket_by_patches([1, 2], backend="torch")
