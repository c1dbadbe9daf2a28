"""pack_batch on samples given as Python lists (what a ``datasets.Dataset`` yields without a torch format).

Lists take their own conversion path; the batch must be exactly the one the same samples give as tensors,
and every bad list must raise the error it raised before, naming the sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from omnibal_kernels import pack_batch
from omnibal_kernels.packing import PackOptions, pack_sequences

LENS = [1, 97, 5, 1025, 2, 113]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _tensor_samples(lens: list[int], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, 151_000, (n,), generator=gen),
            "labels": torch.randint(-100, 151_000, (n,), generator=gen),
        }
        for n in lens
    ]


def _as_lists(samples: list[dict[str, torch.Tensor]]) -> list[dict[str, list[int]]]:
    return [{key: value.tolist() for key, value in sample.items()} for sample in samples]


def _assert_identical(got: Any, want: Any) -> None:
    assert list(got) == list(want)
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
        else:
            assert type(got[key]) is type(want[key]) and got[key] == want[key], key


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("labels", ["given", "absent", "mixed"])
@pytest.mark.parametrize("padding", [{}, {"pad_to_multiple_of": 64, "max_num_seqs": 8}])
def test_lists_give_the_tensor_batch(backend: str, labels: str, padding: dict[str, int]) -> None:
    tensors = _tensor_samples(LENS)
    if labels == "absent":
        tensors = [{"input_ids": s["input_ids"]} for s in tensors]
    elif labels == "mixed":
        del tensors[2]["labels"]
    lists = _as_lists(tensors)
    assert all(type(v) is list for s in lists for v in s.values())
    options = PackOptions(backend=backend, **padding)
    _assert_identical(pack_batch(lists, options), pack_batch(tensors, options))


@pytest.mark.parametrize("shared", [False, True])
def test_lists_in_a_worker_give_the_tensor_batch(shared: bool) -> None:
    tensors = _tensor_samples(LENS, seed=1)
    ids = [s["input_ids"] for s in tensors]
    labels = [s["labels"] for s in tensors]
    want = pack_sequences(ids, labels, shared=shared)
    got = pack_sequences([x.tolist() for x in ids], [y.tolist() for y in labels], shared=shared)
    _assert_identical(got, want)
    assert got["input_ids"].is_shared() == shared


def test_other_integer_sequences() -> None:
    # tuples, ranges, numpy and 0-d tensor integers, the int64 extremes, and a bool among ints (torch
    # makes int64 of a mixed list): all as the same values in an int64 tensor. Token ids are never negative
    # (pack_batch refuses them), so the negative extremes go into the labels.
    values = [INT64_MIN, -1, 0, 7, INT64_MAX]
    cases = [
        tuple(values),
        range(-3, 40),
        [np.int64(v) for v in values],
        [np.int32(5), np.uint8(200), 3],
        [torch.tensor(v) for v in values],
        [4, True, False, 9],
    ]
    ids = [tuple(abs(int(v)) % INT64_MAX for v in case) for case in cases]
    samples = [{"input_ids": i, "labels": case} for i, case in zip(ids, cases)]
    samples.append({"input_ids": [np.int64(INT64_MAX), torch.tensor(0), True]})
    batch = pack_batch(samples, PackOptions(mask_first_label=False))
    flat = [int(v) for case in cases for v in case]
    assert batch["input_ids"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
    assert batch["input_ids"][0].tolist() == [v for i in ids for v in i] + [INT64_MAX, 0, 1]
    assert batch["labels"][0].tolist() == flat + [INT64_MAX, 0, 1]
    cases.append([0, 0, 0])
    assert batch["cu_seqlens"].tolist() == np.cumsum([0] + [len(c) for c in cases]).tolist()


def test_lists_are_copied() -> None:
    ids = list(range(10, 20))
    batch = pack_batch([{"input_ids": ids}])
    ids[0] = 99
    assert batch["input_ids"][0, 0] == 10


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ([1, 2.5, 3], TypeError, " must hold integers, got torch.float32"),
        ([1.0, 2.0, 3.0], TypeError, " must hold integers"),
        ([1, np.float64(2.0), 3], TypeError, " must hold integers"),
        ([True, False, True], TypeError, " must hold integers, got torch.bool"),
        ([1, "a", 3], TypeError, " must be a list of ints"),
        ([1, None, 3], TypeError, " must be a list of ints"),
        ([1, INT64_MAX + 1, 3], ValueError, r"\[1\] = -?\d+ does not fit in int64"),
        ([1, INT64_MIN - 1, 3], ValueError, r"\[1\] = -?\d+ does not fit in int64"),
        ([1, 2**70, 3], ValueError, r"\[1\] = -?\d+ does not fit in int64"),
        ([[1, 2], [3, 4], [5, 6]], ValueError, r" must be 1-D, got shape \(3, 2\)"),
    ],
)
@pytest.mark.parametrize("field", ["input_ids", "labels"])
@pytest.mark.parametrize("shared", [False, True])
def test_bad_lists_name_the_sample(bad: list[Any], error: type, message: str, field: str, shared: bool) -> None:
    samples = _as_lists(_tensor_samples([4, 3, 5], seed=2))
    samples[1][field] = bad
    ids = [s["input_ids"] for s in samples]
    labels = [s["labels"] for s in samples]
    pattern = f"sample 1: {field}{message}"
    with pytest.raises(error, match=pattern):
        pack_sequences(ids, labels, options=PackOptions(), shared=shared)
    if not shared:
        with pytest.raises(error, match=pattern):
            pack_batch(samples)
