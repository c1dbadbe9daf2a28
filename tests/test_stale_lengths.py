"""Stale lengths are refused: in the ``sampler.wrap(dataset)`` path each sample's tokens, ViT load (InternVL tiles,
Qwen2-VL patches and video patches) and label tokens are checked against its length entry before the pack is
built, and a difference is a ValueError naming the sample's dataset index and both values."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from omnibal_kernels import BalancedBatchSampler, Lengths, PackCollator, PlanOptions
from omnibal_kernels.testing.hf_models import internvl_sample, lengths_of, qwen_sample, training_samples


def _batches(
    data: list[dict[str, Any]], lengths: Lengths, workers: int = 0, check_loads: bool = True, **collator: Any
) -> list[Any]:
    sampler = BalancedBatchSampler(
        lengths,
        PlanOptions(vit_capacity=int(lengths.vit.max()) * 4, llm_capacity=int(lengths.llm.max()) * 4),
        world_size=1,
        rank=0,
    )
    loader = torch.utils.data.DataLoader(
        sampler.wrap(data, check_loads=check_loads),
        batch_sampler=sampler,
        collate_fn=PackCollator(**collator),
        num_workers=workers,
    )
    return list(loader)


def _vision_data() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    return [internvl_sample(rng, 2), internvl_sample(rng, 0), internvl_sample(rng, 1), internvl_sample(rng, 3)]


def _patch_data() -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    return [qwen_sample(rng, [(1, 4, 4)]), qwen_sample(rng, [(1, 2, 2)], [(2, 2, 2)]), qwen_sample(rng, [])]


def _stale(lengths: Lengths, index: int, field: str, value: int) -> Lengths:
    arrays = {"vit": lengths.vit.copy(), "llm": lengths.llm.copy(), "label": lengths.label.copy()}
    arrays[field][index] = value
    return Lengths(arrays["vit"], arrays["llm"], label=arrays["label"])


@pytest.mark.parametrize("workers", [0, 1])
def test_tokens_that_differ_from_the_entry_name_the_sample(workers):
    data = training_samples("llama", 30, seed=0)
    lengths = lengths_of(data)
    _batches(data, lengths, workers)  # the true lengths pass
    # the dataset changed after its lengths were counted: sample 17 grew by 300 tokens
    entry = int(lengths.llm[17])
    extra = torch.arange(300)
    data[17] = {key: torch.cat([data[17][key], extra]) for key in ("input_ids", "labels")}
    with pytest.raises(
        ValueError,
        match=rf"sample 17: len\(input_ids\) is {entry + 300} but its length entry says "
        rf"llm {entry}; the lengths do not describe this dataset",
    ):
        _batches(data, lengths, workers)


# The patch samples carry grids without mRoPE: the check of their ViT loads is what is tested here.
@pytest.mark.filterwarnings("ignore:samples carry image_grid_thw:omnibal_kernels._warnings.OmnibalWarning")
@pytest.mark.parametrize("make", [_vision_data, _patch_data], ids=["tiles", "patches"])
def test_vit_loads_that_differ_from_the_entry_name_the_sample(make):
    data = make()
    lengths = lengths_of(data)
    _batches(data, lengths)
    for index in range(len(data)):
        actual = int(lengths.vit[index])
        stale = _stale(lengths, index, "vit", actual + 1)
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"sample {index}: the ViT load (first dimension of "
                f"pixel_values and pixel_values_videos) is {actual} but its "
                f"length entry says vit {actual + 1}"
            ),
        ):
            _batches(data, stale)
    if make is _patch_data:
        assert lengths.vit[1] == 4 + 8  # the image's patches and the video's


def test_label_tokens_that_differ_from_the_entry_name_the_sample():
    data = training_samples("llama", 30, seed=0)
    lengths = lengths_of(data)
    actual = int(lengths.label[5])
    stale = _stale(lengths, 5, "label", actual - 1 if actual else 1)
    with pytest.raises(
        ValueError,
        match=rf"sample 5: the number of label tokens .* is {actual} but its length "
        rf"entry says label {int(stale.label[5])}",
    ):
        _batches(data, stale)


def test_the_check_can_be_turned_off_for_estimated_lengths():
    data = training_samples("llama", 30, seed=0)
    lengths = lengths_of(data)
    labelled = int(np.flatnonzero(lengths.label > 0)[0])
    stale = _stale(_stale(lengths, 3, "llm", int(lengths.llm[3]) - 1), labelled, "label", 0)
    assert len(_batches(data, stale, check_loads=False)) > 0
    with pytest.raises(TypeError, match="check_loads must be a bool"):
        BalancedBatchSampler(lengths, world_size=1, rank=0).wrap(data, check_loads="no")
