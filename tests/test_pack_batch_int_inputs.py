"""pack_batch on integer inputs that could wrap or fail without naming the sample: uint64 values >= 2**63,
reversed (negative-stride) numpy arrays, unsigned torch tensors beside int64 ones, negative token ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import PackOptions
from omnibal_kernels.packing import PackCollator, pack_batch, pack_sequences

BIG = 2**63 + 5


def _both_paths(ids, labels=None):
    """The text fields from the main-process path and from the shared-memory (DataLoader worker) path."""
    return [pack_sequences(ids, labels, shared=shared) for shared in (False, True)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.array([1, BIG], np.uint64),
        lambda: torch.tensor([1, BIG], dtype=torch.uint64),
        lambda: [1, BIG],
    ],
    ids=["numpy_uint64", "torch_uint64", "list"],
)
@pytest.mark.parametrize("others", ["int64", "same"])
def test_ids_above_int64_name_the_sample(make, others):
    first = torch.tensor([3, 4]) if others == "int64" else make()[:1]  # [:1] holds only the value 1
    for shared in (False, True):
        with pytest.raises(ValueError, match=f"sample 1: input_ids\\[1\\] = {BIG} does not fit in int64"):
            pack_sequences([first, make()], shared=shared)


def test_labels_above_int64_name_the_sample():
    labels = np.array([2**64 - 1, 7], np.uint64)
    with pytest.raises(ValueError, match=f"sample 1: labels\\[0\\] = {2**64 - 1} does not fit in int64"):
        pack_batch([{"input_ids": [1, 2]}, {"input_ids": [5, 6], "labels": labels}])


def test_uint64_at_the_int64_limit_is_kept():
    top = np.array([0, 2**63 - 1], np.uint64)
    for fields in _both_paths([np.arange(2), top]):
        assert fields["input_ids"][0].tolist() == [0, 1, 0, 2**63 - 1]


def test_reversed_numpy_arrays_are_copied():
    ids = np.arange(10, 15)[::-1]
    labels = np.arange(20, 25)[::2][::-1]  # stride -2 elements
    assert ids.strides[0] < 0 and labels.strides[0] < 0
    batch = pack_batch(
        [{"input_ids": [1, 2, 3]}, {"input_ids": ids[:3], "labels": labels}], PackOptions(mask_first_label=False)
    )
    assert batch["input_ids"][0].tolist() == [1, 2, 3, 14, 13, 12]
    assert batch["labels"][0].tolist() == [1, 2, 3, 24, 22, 20]
    for fields in _both_paths([ids, np.arange(3)]):
        assert fields["input_ids"][0].tolist() == [14, 13, 12, 11, 10, 0, 1, 2]
    weights = np.arange(3)[::-1]
    out = pack_batch([{"input_ids": [1, 2, 3], "w": weights}], PackOptions(token_fields=("w",)))
    assert out["w"][0].tolist() == [2, 1, 0]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_tensors_pack_beside_int64(dtype):
    small = torch.tensor([7, 8], dtype=dtype)
    for fields in _both_paths([torch.tensor([1, 2, 3]), small], [torch.tensor([1, 2, 3]), small]):
        assert fields["input_ids"].dtype == torch.int64
        assert fields["input_ids"][0].tolist() == [1, 2, 3, 7, 8]
        assert fields["labels"][0].tolist() == [-100, 2, 3, -100, 8]


_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@st.composite
def _sample_ids(draw):
    """One sample's input_ids in any integer dtype, container and layout, and the int64 values it stands for."""
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    info = np.iinfo(dtype)
    values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=1, max_size=6))
    container = draw(st.sampled_from(["numpy", "torch", "list"]))
    layout = draw(st.sampled_from(["contiguous", "reversed", "strided"]))
    arr = np.array(values, dtype=dtype)
    if layout == "strided":  # every other element of a twice as long array
        arr = np.repeat(arr, 2)[::2]
    elif layout == "reversed":
        arr = arr[::-1].copy()[::-1]  # the same values through a negative-stride view
    if container == "torch":
        base = torch.from_numpy(np.repeat(arr, 2))
        ids = base[::2] if layout != "contiguous" else torch.from_numpy(arr.copy())
    elif container == "list":
        ids = [int(v) for v in arr]
    else:
        ids = arr
    return ids, values


@settings(max_examples=80, deadline=None)
@given(samples=st.lists(_sample_ids(), min_size=1, max_size=4), shared=st.booleans())
def test_any_integer_input_packs_exactly_or_names_the_sample(samples, shared):
    ids = [s[0] for s in samples]
    too_big = [i for i, (_, values) in enumerate(samples) if max(values) > 2**63 - 1]
    if too_big:
        with pytest.raises(ValueError, match=f"sample {too_big[0]}: input_ids\\[\\d+\\] = \\d+ does not fit in int64"):
            pack_sequences(ids, shared=shared)
        return
    negative = [(i, j, v) for i, (_, values) in enumerate(samples) for j, v in enumerate(values) if v < 0]
    if negative:
        i, j, v = negative[0]
        with pytest.raises(ValueError, match=f"sample {i}: input_ids\\[{j}\\] = {v} is negative"):
            pack_sequences(ids, shared=shared)
        return
    fields = pack_sequences(ids, shared=shared)
    assert fields["input_ids"].dtype == torch.int64
    assert fields["input_ids"][0].tolist() == [v for _, values in samples for v in values]
    assert fields["cu_seqlens"].tolist() == np.cumsum([0] + [len(v) for _, v in samples]).tolist()


def test_one_element_reversed_views_pack():
    """numpy calls a one-element view contiguous whatever its (negative) stride; torch refuses such strides."""
    for dtype in (np.int64, np.int8):
        view = np.array([7], dtype)[::-1]
        for fields in _both_paths([np.array([1, 2], np.int8), view]):
            assert fields["input_ids"][0].tolist() == [1, 2, 7]


@pytest.mark.parametrize("make", [torch.tensor, np.array, list], ids=["torch", "numpy", "list"])
def test_negative_token_ids_name_the_sample_and_position(make):
    samples = [{"input_ids": make([3, 4, 5])}, {"input_ids": make([6, 7, -100, 8])}]
    for collate in (pack_batch, PackCollator(warmup=False)):
        with pytest.raises(ValueError, match=r"sample 1: input_ids\[2\] = -100 is negative"):
            collate(samples)
    # labels take ignore_index: a negative label is no error
    assert pack_batch([{"input_ids": [3, 4], "labels": [-100, 4]}])["labels"][0].tolist() == [-100, 4]
