"""varlen_metadata: the Triton kernel (interpreter on CPU, CUDA under -m gpu) and the CPU twin against
the loop reference in omnibal_kernels.testing; integer outputs must match exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnibal_kernels.ops import _launch
from omnibal_kernels.ops import varlen_metadata as ops_meta
from omnibal_kernels.testing import varlen_metadata_reference

interpreted = pytest.mark.skipif(
    not _launch.interpreted(), reason="Triton kernels run on CPU tensors only with TRITON_INTERPRET=1"
)
TARGETS = [
    pytest.param(("cpu", "triton"), marks=interpreted, id="triton-interpret"),
    pytest.param(("cpu", "cpu"), id="cpu-twin"),
    pytest.param(("cuda", "auto"), marks=pytest.mark.gpu, id="cuda"),
]

_rng = np.random.default_rng(11)
LENGTHS = [
    [0, 1, 97],
    [1023, 0, 1025],
    [1],
    [1025],  # one sequence spread over two programs
    [3000, 1],  # long sequence, several steps per program
    [0],
    [0, 0, 5, 0],
    [int(v) for v in _rng.integers(0, 200, size=7)],
    [int(v) for v in _rng.integers(0, 3, size=40)],
]


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    def alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.full(shape, -777, dtype=dtype, device=device)

    monkeypatch.setattr(_launch, "alloc", alloc)


def _check(got: ops_meta.VarlenMetadata, lens: list[int], labels: torch.Tensor | None, ignore_index: int) -> None:
    cu, pos, idx, lab = varlen_metadata_reference(lens, labels, ignore_index)
    for name, actual, expected in [
        ("cu_seqlens", got.cu_seqlens, cu),
        ("position_ids", got.position_ids, pos),
        ("seq_idx", got.seq_idx, idx),
    ]:
        assert actual.dtype == expected.dtype, name
        assert torch.equal(actual.cpu(), expected), name
    if labels is None:
        assert got.labels is None
    else:
        assert got.labels.shape == labels.shape and got.labels.dtype == labels.dtype
        assert torch.equal(got.labels.cpu(), lab)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lens", LENGTHS, ids=lambda v: str(v) if len(v) < 8 else f"B{len(v)}")
def test_metadata_matches_reference(lens, target, poisoned) -> None:
    device, backend = target
    total = sum(lens)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    _check(ops_meta.varlen_metadata(seq_lens, total_tokens=total, backend=backend), lens, None, -100)

    labels = torch.randint(0, 50000, (1, total), generator=torch.Generator().manual_seed(total))
    got = ops_meta.varlen_metadata(seq_lens.long(), labels=labels.to(device), backend=backend)
    _check(got, lens, labels, -100)

    labels32 = labels.view(-1).int()
    got = ops_meta.varlen_metadata(seq_lens, labels=labels32.to(device), ignore_index=-1, backend=backend)
    _check(got, lens, labels32, -1)
    assert int(got.cu_seqlens[-1]) == total  # (B + 1,) starting at 0 checked above; the last is T


@pytest.mark.parametrize("target", TARGETS)
def test_prefix_sum_over_several_chunks(target, poisoned, monkeypatch: pytest.MonkeyPatch) -> None:
    """More sequences than one BLOCK_B step of the in-kernel prefix sum (a small block keeps it fast)."""
    device, backend = target
    monkeypatch.setattr(ops_meta, "BLOCK_B", 16)
    lens = [int(v) for v in np.random.default_rng(5).integers(0, 4, size=70)]
    labels = torch.arange(sum(lens))
    got = ops_meta.varlen_metadata(torch.tensor(lens, device=device), labels=labels.to(device), backend=backend)
    _check(got, lens, labels, -100)


@pytest.mark.parametrize("target", TARGETS)
def test_total_read_back_once_without_host_numbers(target, poisoned) -> None:
    device, backend = target
    lens = [5, 0, 3]
    got = ops_meta.varlen_metadata(torch.tensor(lens, device=device), backend=backend)
    _check(got, lens, None, -100)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=interpreted), "cpu"])
def test_bad_arguments_are_named(backend) -> None:
    lens = torch.tensor([2, 3])
    cases = [
        (lambda: ops_meta.varlen_metadata([2, 3], backend=backend), TypeError, "seq_lens must be a torch.Tensor"),
        (lambda: ops_meta.varlen_metadata(lens.float(), backend=backend), TypeError, "seq_lens must have dtype"),
        (lambda: ops_meta.varlen_metadata(lens[None], backend=backend), ValueError, "seq_lens must be 1-D"),
        (lambda: ops_meta.varlen_metadata(torch.tensor([2, -1]), backend=backend), ValueError, "negative length"),
        (lambda: ops_meta.varlen_metadata(lens, total_tokens=4, backend=backend), ValueError, "add up to 5"),
        (
            lambda: ops_meta.varlen_metadata(lens, labels=torch.zeros(4, dtype=torch.long), backend=backend),
            ValueError,
            "labels hold 4 tokens",
        ),
        (
            lambda: ops_meta.varlen_metadata(lens, labels=torch.zeros(5), backend=backend),
            TypeError,
            "labels must hold integers",
        ),
        (
            lambda: ops_meta.varlen_metadata(lens, labels=torch.zeros(1, 1, 5, dtype=torch.long), backend=backend),
            ValueError,
            "labels must be (T,) or (1, T)",
        ),
        (
            lambda: ops_meta.varlen_metadata(
                lens, total_tokens=5, labels=torch.zeros(6, dtype=torch.long), backend=backend
            ),
            ValueError,
            "labels hold 6 tokens but total_tokens=5",
        ),
        (lambda: ops_meta.varlen_metadata(lens, ignore_index=-1.0, backend=backend), TypeError, "ignore_index"),
        (lambda: ops_meta.varlen_metadata(lens, backend="numba"), ValueError, "backend must be one of"),
    ]
    for call, error, words in cases:
        with pytest.raises(error) as info:
            call()
        assert words in str(info.value)


def test_empty_batch() -> None:
    got = ops_meta.varlen_metadata(torch.zeros(0, dtype=torch.int32))
    _check(got, [], None, -100)


@pytest.mark.gpu
def test_no_host_sync_with_host_total() -> None:
    lens = torch.tensor([7, 0, 300, 1], device="cuda")
    labels = torch.arange(308, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = ops_meta.varlen_metadata(lens, labels=labels)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _check(got, [7, 0, 300, 1], labels.cpu(), -100)
