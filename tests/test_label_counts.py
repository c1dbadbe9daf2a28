"""The collator's label-count check on planned samples: every sample's label tokens are counted within its own
tokens, whatever the pack's shape (empty samples first, between or last, padding after the last)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from omnibal_kernels import PackCollator, PackOptions
from omnibal_kernels.sampler.steps import PlannedSamples, PlannedStep


def _planned(lengths: list[int], masks: list[list[bool]]) -> PlannedSamples:
    """Text samples of ``lengths`` tokens, label ``j`` of sample ``i`` trained where ``masks[i][j]``, with the
    label counts the lengths would carry (trained labels after each sample's first)."""
    samples, labels = [], []
    for n, mask in zip(lengths, masks):
        ids = torch.arange(1, n + 1, dtype=torch.long)
        lab = torch.where(torch.tensor(mask, dtype=torch.bool), ids, torch.full_like(ids, -100))
        samples.append({"input_ids": ids, "labels": lab})
        labels.append(int(sum(mask[1:])))
    step = PlannedStep(
        epoch=0,
        step=0,
        micro_step=0,
        micro_steps_per_step=1,
        world_size=1,
        rank=0,
        vit=(0,) * len(lengths),
        llm=tuple(lengths),
        label=tuple(labels),
        num_items_in_batch=sum(labels),
        num_samples_in_batch=sum(1 for c in labels if c),
    )
    return PlannedSamples(samples, step, list(range(len(lengths))), check_loads=True)


@pytest.mark.parametrize("pad", [None, 16])
def test_a_pack_ending_in_an_empty_sample_keeps_the_last_label(pad):
    # sample 0's last token is trained; the empty sample after it must not take it away
    batch = PackCollator(PackOptions(allow_empty=True, pad_to_length=pad))(_planned([3, 0], [[True] * 3, []]))
    assert batch["num_items_in_batch"] == 2


def test_a_wrong_count_still_names_its_sample():
    samples = _planned([3, 2, 0], [[True] * 3, [True, True], []])
    samples.step = PlannedStep(**{**samples.step.__dict__, "label": (2, 0, 0)})
    with pytest.raises(ValueError, match=r"sample 1: the number of label tokens .* is 1 but .* says label 0"):
        PackCollator(PackOptions(allow_empty=True))(samples)


@st.composite
def _packs(draw: st.DrawFn) -> tuple[list[int], list[list[bool]], int]:
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    lengths += [0] * draw(st.integers(0, 3))  # any pack ending in empty samples
    masks = [draw(st.lists(st.booleans(), min_size=n, max_size=n)) for n in lengths]
    pad = draw(st.integers(0, 4))
    return lengths, masks, pad


@pytest.mark.property
@given(_packs())
def test_label_counts_of_any_pack_are_accepted(pack):
    lengths, masks, pad = pack
    total = sum(lengths)
    batch = PackCollator(PackOptions(allow_empty=True, pad_to_length=max(total + pad, 1)))(_planned(lengths, masks))
    assert batch["num_items_in_batch"] == sum(int(np.sum(m[1:])) for m in masks)
