"""bucket_by_patches: numba twin and Triton op (TRITON_INTERPRET on CPU) against the numpy reference."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.testing import bucket_sort_reference
from omnibal_kernels.vision import bucket_by_patches

SIZES = [0, 1, 2, 97, 113, 128, 129, 1023, 1025]


def _check(out, counts: np.ndarray, boundaries: np.ndarray) -> None:
    perm, offsets, ids = bucket_sort_reference(counts, boundaries)
    np.testing.assert_array_equal(np.asarray(out.perm), perm)
    np.testing.assert_array_equal(np.asarray(out.offsets), offsets)
    np.testing.assert_array_equal(np.asarray(out.bucket_ids), ids)
    np.testing.assert_array_equal(np.asarray(out.boundaries), boundaries)
    assert np.asarray(out.perm).dtype == np.int64 and np.asarray(out.bucket_ids).dtype == np.int32


@pytest.mark.parametrize("n", SIZES)
def test_numba_matches_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    counts = rng.integers(0, 50, n) * 4
    for boundaries in (np.array([], np.int64), np.array([40, 80, 80, 150]), np.array([0]), np.array([1000])):
        _check(bucket_by_patches(counts, boundaries), counts, boundaries)
    out = bucket_by_patches(counts)
    _check(out, counts, np.unique(counts)[1:])
    # distinct mode: every bucket holds one count value, so a dense batch needs no padding
    for b in range(len(out.offsets) - 1):
        members = counts[out.perm[out.offsets[b] : out.offsets[b + 1]]]
        assert len(set(members.tolist())) == (1 if n else 0)
    q = bucket_by_patches(counts, num_buckets=4)
    assert len(q.offsets) == 5
    _check(q, counts, np.sort(counts)[np.arange(1, 4) * n // 4] if n else np.zeros(3, np.int64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=300), st.lists(st.integers(0, 3000), max_size=8))
def test_properties(counts: list[int], edges: list[int]) -> None:
    counts_a = np.array(counts, dtype=np.int64)
    bnd = np.sort(np.array(edges, dtype=np.int64))
    out = bucket_by_patches(counts_a, bnd)
    assert sorted(out.perm.tolist()) == list(range(len(counts)))  # every image exactly once
    for b in range(len(bnd) + 1):
        idx = out.perm[out.offsets[b] : out.offsets[b + 1]]
        assert (np.diff(idx) > 0).all()  # stable
        lo = bnd[b - 1] if b else -1
        hi = bnd[b] if b < len(bnd) else np.iinfo(np.int64).max
        assert ((counts_a[idx] >= lo) & (counts_a[idx] < hi)).all()


def test_torch_cpu_input_and_errors() -> None:
    out = bucket_by_patches(torch.tensor([4, 1, 4, 2]))
    assert isinstance(out.perm, torch.Tensor)
    assert out.perm.tolist() == [1, 3, 0, 2] and out.offsets.tolist() == [0, 1, 2, 4]
    with pytest.raises(ValueError, match="not both"):
        bucket_by_patches([1, 2], [1], num_buckets=2)
    with pytest.raises(ValueError, match=r"counts\[1\]"):
        bucket_by_patches([1, -2])
    with pytest.raises(ValueError, match="non-decreasing"):
        bucket_by_patches([1, 2], [5, 3])
    with pytest.raises(TypeError, match="counts"):
        bucket_by_patches([1.5, 2])
    with pytest.raises(ValueError, match="num_buckets"):
        bucket_by_patches([1, 2], num_buckets=0)


@pytest.mark.parametrize("n", [0, 1, 97, 129, 300])
def test_triton_matches_reference(n: int) -> None:
    from omnibal_kernels.ops.bucket import bucket_sort

    rng = np.random.default_rng(1000 + n)
    counts = rng.integers(0, 40, n)
    for boundaries in (np.array([], np.int64), np.array([5, 10, 10, 20, 30, 35, 39]), np.unique(counts)[1:]):
        out = bucket_sort(torch.from_numpy(counts), torch.from_numpy(boundaries))
        _check(type(out)(*(t.numpy() for t in out)), counts, boundaries)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 1025, 100_000])
def test_cuda_matches_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    counts = rng.integers(0, 5000, n)
    for kwargs in ({}, {"num_buckets": 16}, {"boundaries": [100, 1000, 1000, 4000]}):
        gpu = bucket_by_patches(torch.from_numpy(counts).cuda(), **kwargs)
        cpu = bucket_by_patches(counts, **kwargs)
        for a, b in zip(gpu, cpu):
            np.testing.assert_array_equal(a.cpu().numpy(), np.asarray(b))
