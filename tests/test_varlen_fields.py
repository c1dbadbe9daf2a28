"""The one CPU varlen-metadata path (cpu.varlen_metadata.varlen_fields): its numba and torch fills agree with
a plain loop for any segment lengths, with or without shared-memory outputs; and the shared-memory helper."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels._shared_memory import shared_tensors
from omnibal_kernels.cpu.varlen_metadata import varlen_fields


def _loop_reference(
    seg_lens: list[int], num_samples: int, num_slots: int, labels: list[int], mask: bool, ignore_index: int
) -> tuple[list[int], list[int], list[int], list[int], list[int], int]:
    positions, seq_idx, cu, out_labels = [], [], [0], list(labels)
    for s, n in enumerate(seg_lens):
        if mask and s < num_samples and n > 0:
            out_labels[cu[-1]] = ignore_index
        positions += list(range(n))
        seq_idx += [s] * n
        cu.append(cu[-1] + n)
    lens = seg_lens + [0] * (num_slots - len(seg_lens))
    cu += [cu[-1]] * (num_slots - len(seg_lens))
    return positions, seq_idx, cu, lens, out_labels, max(seg_lens, default=0)


@settings(max_examples=60, deadline=None)
@given(
    seg_lens=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    extra_slots=st.integers(0, 3),
    padding=st.booleans(),
    mask=st.booleans(),
    backend=st.sampled_from(["numba", "torch"]),
    shared=st.booleans(),
)
def test_fills_match_a_plain_loop(
    seg_lens: list[int], extra_slots: int, padding: bool, mask: bool, backend: str, shared: bool
) -> None:
    num_samples = len(seg_lens) - 1 if padding else len(seg_lens)  # a trailing padding segment is no sample
    num_slots = len(seg_lens) + extra_slots
    total = sum(seg_lens)
    labels = torch.arange(total, dtype=torch.int64) + 1000
    out = None
    if shared:
        out = tuple(
            shared_tensors(
                ((1, total), torch.int64),
                ((1, total), torch.int32),
                ((num_slots + 1,), torch.int32),
                ((num_slots,), torch.int32),
            )
        )
    want = _loop_reference(seg_lens, num_samples, num_slots, labels.tolist(), mask, -7)
    got = varlen_fields(
        seg_lens,
        num_samples,
        labels,
        num_slots=num_slots,
        mask_first_label=mask,
        ignore_index=-7,
        backend=backend,
        out=out,
    )
    assert got.position_ids.shape == (1, total) and got.position_ids.dtype == torch.int64
    assert got.seq_idx.shape == (1, total) and got.seq_idx.dtype == torch.int32
    assert got.cu_seqlens.dtype == torch.int32 and got.seq_lens.dtype == torch.int32
    assert got.position_ids[0].tolist() == want[0]
    assert got.seq_idx[0].tolist() == want[1]
    assert got.cu_seqlens.tolist() == want[2]
    assert got.seq_lens.tolist() == want[3]
    assert labels.tolist() == want[4]
    assert got.max_seqlen == want[5]
    if out is not None:
        assert all(a is b for a, b in zip(got[:4], out))


def test_shared_tensors_are_aligned_views_of_one_shared_storage() -> None:
    parts = shared_tensors(((3, 5), torch.int64), ((7,), torch.int32), ((0,), torch.float16), ((2, 3), torch.uint8))
    assert [tuple(p.shape) for p in parts] == [(3, 5), (7,), (0,), (2, 3)]
    assert [p.dtype for p in parts] == [torch.int64, torch.int32, torch.float16, torch.uint8]
    assert len({p.untyped_storage().data_ptr() for p in parts}) == 1
    assert all(p.is_shared() and p.is_contiguous() and p.data_ptr() % 64 == 0 for p in parts if p.numel())
    for i, p in enumerate(parts):
        p.fill_(i + 1)
    assert [int(p.sum()) if p.numel() else 0 for p in parts] == [15, 14, 0, 24]  # no part overlaps another
    (empty,) = shared_tensors(((0, 4), torch.float32))
    assert empty.shape == (0, 4)


def test_the_cpu_twin_of_varlen_metadata_rejects_other_devices() -> None:
    from omnibal_kernels.cpu.varlen_metadata import varlen_metadata

    with pytest.raises(ValueError, match="varlen_metadata: the CPU twin needs CPU tensors, got a tensor on meta"):
        varlen_metadata(torch.tensor([1, 2], device="meta"))
