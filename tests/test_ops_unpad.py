"""pack / unpack / pack_from_mask: Triton kernels (interpreter on CPU, CUDA under -m gpu) and CPU twins
against the plain references in omnibal_kernels.testing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnibal_kernels._contracts import segments as _segments
from omnibal_kernels.cpu import unpad as cpu_pack
from omnibal_kernels.ops import _launch
from omnibal_kernels.ops import unpad as ops_pack
from omnibal_kernels.testing import pad_input_reference, pad_reference, unpad_input_reference, unpad_reference

interpreted = pytest.mark.skipif(
    not _launch.interpreted(), reason="Triton kernels run on CPU tensors only with TRITON_INTERPRET=1"
)

# (device, backend): the Triton kernel on CPU tensors in the interpreter, the CPU twin, the CUDA kernel
TARGETS = [
    pytest.param(("cpu", "triton"), marks=interpreted, id="triton-interpret"),
    pytest.param(("cpu", "cpu"), id="cpu-twin"),
    pytest.param(("cuda", "auto"), marks=pytest.mark.gpu, id="cuda"),
]

# (seq_lens, padded_len, trailing dims): lengths off every block size, empty and single-token rows, a batch
# of one, everything full, nothing at all
EDGE_CASES = [
    ([0, 1, 97], 97, (3,)),
    ([1023, 0, 1025], 1025, (2,)),
    ([1], 1, (5,)),
    ([1025], 1030, ()),
    ([7, 7, 7], 7, (4, 3)),
    ([0, 0], 4, (3,)),
    ([97, 1, 0, 13, 64], 128, (33,)),
]
DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _random_cases(n: int, seed: int) -> list[tuple[list[int], int, tuple[int, ...]]]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(n):
        batch = int(rng.integers(1, 6))
        padded_len = int(rng.integers(1, 300))
        lens = [int(v) for v in rng.integers(0, padded_len + 1, size=batch)]
        rest = [(), (int(rng.integers(1, 40)),), (int(rng.integers(1, 5)), int(rng.integers(1, 9)))][
            int(rng.integers(0, 3))
        ]
        cases.append((lens, padded_len, rest))
    return cases


CASES = EDGE_CASES + _random_cases(4, seed=3)


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-(2**40), 2**40, shape, generator=gen, dtype=torch.int64).to(dtype)


def _poison_value(dtype: torch.dtype) -> float | int:
    return float("nan") if dtype.is_floating_point else 987654321


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel outputs start as NaN / a sentinel, so an element the kernel forgets cannot pass."""

    def alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.full(shape, _poison_value(dtype), dtype=dtype, device=device)

    monkeypatch.setattr(_launch, "alloc", alloc)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-exact equality (pack/unpack only move data)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.equal(actual.cpu(), expected.cpu())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-S{c[1]}-{c[2]}" if isinstance(c, tuple) else None)
def test_pack_and_unpack_match_reference(case, dtype, target, poisoned) -> None:
    lens, padded_len, rest = case
    device, backend = target
    padded = _data((len(lens), padded_len, *rest), dtype, seed=len(lens) + padded_len)
    expected = unpad_reference(padded, lens)

    packed = ops_pack.unpad(padded.to(device), lens, backend=backend)
    _same(packed, expected)

    fill = -3 if dtype == torch.int64 else float("-inf")
    out = ops_pack.pad(packed, lens, padded_len=padded_len, fill_value=fill, backend=backend)
    _same(out, pad_reference(expected, lens, padded_len, fill))
    # the default padded length is the longest row
    out = ops_pack.pad(packed, torch.tensor(lens), backend=backend)
    _same(out, pad_reference(expected, lens, max(lens), 0))


@pytest.mark.parametrize("target", TARGETS)
def test_every_form_of_lengths_gives_the_same_rows(target, poisoned) -> None:
    device, backend = target
    lens = [5, 0, 9, 1]
    padded = _data((4, 11, 6), torch.float32, seed=1).to(device)
    expected = unpad_reference(padded.cpu(), lens)
    cu = [0, 5, 5, 14, 15]
    forms = [
        dict(seq_lens=lens),
        dict(seq_lens=np.array(lens, dtype=np.int32)),
        dict(seq_lens=torch.tensor(lens)),
        dict(seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), total_tokens=15),
        dict(seq_lens=torch.tensor(lens, device=device)),  # device lengths, one sync on CUDA
        dict(cu_seqlens=torch.tensor(cu, dtype=torch.int32)),
        dict(cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device), total_tokens=15),
        dict(cu_seqlens=cu),
    ]
    for form in forms:
        _same(ops_pack.unpad(padded, backend=backend, **form), expected)
        form.pop("total_tokens", None)
        _same(
            ops_pack.pad(expected.to(device), padded_len=11, backend=backend, **form),
            padded.cpu() * (torch.arange(11)[None, :, None] < torch.tensor(lens)[:, None, None]),
        )


@pytest.mark.parametrize("target", TARGETS)
def test_strided_inputs(target, poisoned) -> None:
    device, backend = target
    lens = [3, 8, 0]
    base = _data((8, 3, 16, 5), torch.bfloat16, seed=2).to(device)
    padded = base.transpose(0, 1)[:, :, ::2]  # (3, 8, 8, 5): batch and sequence strides swapped, hidden gaps
    _same(ops_pack.unpad(padded, lens, backend=backend), unpad_reference(padded.cpu(), lens))
    packed_base = _data((11, 7), torch.float32, seed=3).to(device)
    packed = packed_base.t().contiguous().t()  # (11, 7) with token stride 1, hidden stride 11
    _same(ops_pack.pad(packed, lens, backend=backend), pad_reference(packed.cpu(), lens, 8))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_of_each_is_the_other(target, dtype) -> None:
    device, backend = target
    lens, padded_len = [4, 0, 97, 1], 97
    padded = _data((4, padded_len, 3), dtype, seed=4).to(device).requires_grad_()
    packed = ops_pack.unpad(padded, lens, backend=backend)
    grad_packed = _data(tuple(packed.shape), dtype, seed=5).to(device)
    packed.backward(grad_packed)
    _same(padded.grad, pad_reference(grad_packed.cpu(), lens, padded_len, 0))

    packed_in = _data((102, 3), dtype, seed=6).to(device).requires_grad_()
    out = ops_pack.pad(packed_in, lens, padded_len=100, fill_value=7.0, backend=backend)
    grad_out = _data(tuple(out.shape), dtype, seed=7).to(device)
    out.backward(grad_out)
    _same(packed_in.grad, unpad_reference(grad_out.cpu(), lens))


# gradcheck runs the interpreted Triton kernels many times: seconds
GRADCHECK_TARGETS = [
    pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow], id=p.id) if p.id == "triton-interpret" else p
    for p in TARGETS
]


@pytest.mark.parametrize("target", GRADCHECK_TARGETS)
def test_gradcheck_and_double_backward(target) -> None:
    device, backend = target
    lens = [2, 0, 3]
    padded = torch.randn(3, 4, 2, dtype=torch.float64, device=device, requires_grad=True)
    packed = torch.randn(5, 2, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ops_pack.unpad(x, lens, backend=backend), (padded,))
    assert torch.autograd.gradgradcheck(
        lambda x: ops_pack.pad(x, lens, padded_len=4, fill_value=2.5, backend=backend), (packed,)
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lens", [[0, 1, 97], [1025], [5, 5]], ids=str)
def test_pack_from_mask_matches_unpad_input(target, lens, poisoned) -> None:
    device, backend = target
    padded_len = max(lens)
    hidden = _data((len(lens), padded_len, 8), torch.bfloat16, seed=8)
    mask = torch.arange(padded_len)[None, :] < torch.tensor(lens)[:, None]
    got = ops_pack.unpad_from_mask(hidden.to(device), mask.to(device).int(), backend=backend)
    want, _, cu, max_seqlen = unpad_input_reference(hidden, mask)
    _same(got.packed, want)
    _same(got.cu_seqlens, cu)
    _same(got.seq_lens, torch.tensor(lens, dtype=torch.int32))
    assert got.max_seqlen == max_seqlen == max(lens)


def test_pad_input_reference_is_unpack() -> None:
    lens = [3, 0, 5]
    hidden = _data((3, 6, 2), torch.float32, seed=9)
    mask = torch.arange(6)[None, :] < torch.tensor(lens)[:, None]
    packed, indices, _, _ = unpad_input_reference(hidden, mask)
    _same(pad_input_reference(packed, indices, 3, 6), cpu_pack.pad(packed, lens, padded_len=6))


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=interpreted), "cpu"])
def test_bad_arguments_are_named(backend) -> None:
    x = torch.zeros(2, 5, 3)
    cases = [
        (lambda: ops_pack.unpad(x, [1, 2, 3], backend=backend), ValueError, "seq_lens has 3 entries"),
        (lambda: ops_pack.unpad(x, [1, -1], backend=backend), ValueError, "sequence 1 has negative length"),
        (lambda: ops_pack.unpad(x, [1, 6], backend=backend), ValueError, "sequence 1 has length 6 > padded"),
        (lambda: ops_pack.unpad(x, [1.0, 2.0], backend=backend), TypeError, "seq_lens must hold integers"),
        (lambda: ops_pack.unpad(x, [1, 2], total_tokens=4, backend=backend), ValueError, "total_tokens=4"),
        (lambda: ops_pack.unpad(x, backend=backend), TypeError, "exactly one of seq_lens or cu_seqlens"),
        (lambda: ops_pack.unpad(x, [1, 2], cu_seqlens=[0, 1, 3], backend=backend), TypeError, "exactly one"),
        (lambda: ops_pack.unpad(x, cu_seqlens=[1, 2, 3], backend=backend), ValueError, "must start at 0"),
        (lambda: ops_pack.unpad(x, cu_seqlens=[0, 3, 2], backend=backend), ValueError, "non-decreasing"),
        (
            lambda: ops_pack.unpad(x, cu_seqlens=torch.tensor([0, 1, 2]), backend=backend),
            TypeError,
            "cu_seqlens must have dtype torch.int32",
        ),
        (lambda: ops_pack.unpad(x[0, 0], [1], backend=backend), ValueError, "padded must be (batch"),
        (lambda: ops_pack.unpad(x, [[1, 2]], backend=backend), ValueError, "seq_lens must be 1-D"),
        (lambda: ops_pack.unpad(x, [1, 2], backend="gpu"), ValueError, "backend must be one of"),
        (lambda: ops_pack.pad(x[0], [1, 2], backend=backend), ValueError, "packed has 5 rows"),
        (lambda: ops_pack.pad(x[0], [2, 3], padded_len=2, backend=backend), ValueError, "length 3 > padded"),
        (
            lambda: ops_pack.pad(x[0].long(), [2, 3], fill_value=0.5, backend=backend),
            TypeError,
            "fill_value 0.5",
        ),
        (lambda: ops_pack.pad(x[0], [2, 3], fill_value="0", backend=backend), TypeError, "fill_value must"),
        (
            lambda: ops_pack.unpad_from_mask(x, torch.tensor([[1, 0, 1, 0, 0], [1, 1, 0, 0, 0]]), backend=backend),
            ValueError,
            "attention_mask row 0 is not right-padded",
        ),
        (lambda: ops_pack.unpad_from_mask(x, torch.ones(2, 4), backend=backend), ValueError, "expected (2, 5)"),
    ]
    for call, error, words in cases:
        with pytest.raises(error, match=_escape(words)):
            call()


def _escape(words: str) -> str:
    import re

    return re.escape(words)


def test_int32_overflow_of_cu_seqlens_is_rejected() -> None:
    big = 2**31 - 1
    with pytest.raises(ValueError, match="overflow int32 cu_seqlens"):
        _segments.resolve_segments(
            [big, 1], None, None, batch=2, padded_len=None, device=torch.device("cpu"), fn="pack"
        )


def test_device_lengths_are_checked_when_read_back() -> None:
    """The single-sync path for lengths on the device, driven with CPU tensors."""
    lens = torch.tensor([2, -1, 4])
    cu = torch.tensor([0, 2, 1, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens holds a negative length"):
        _segments._device_segments(cu, lens, None, 8, "pack", "seq_lens")
    with pytest.raises(ValueError, match="length 4 > padded length 3"):
        _segments._device_segments(cu, torch.tensor([2, 0, 4]), None, 3, "pack", "seq_lens")
    seg = _segments._device_segments(cu, torch.tensor([2, 0, 4]), None, 8, "pack", "seq_lens")
    assert (seg.total_tokens, seg.max_seqlen, seg.batch) == (6, 4, 3)
    # with a host total nothing is read back or checked
    assert _segments._device_segments(cu, lens, 5, 8, "pack", "seq_lens").max_seqlen is None


def test_cuda_kernel_refuses_cpu_tensors_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_launch, "interpreted", lambda: False)
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        ops_pack.unpad(torch.zeros(1, 2), [1], backend="triton")


# ------------------------------------------------------------------------------------------ CUDA only


@pytest.mark.gpu
def test_host_lengths_never_sync() -> None:
    padded = torch.randn(3, 64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lens = [64, 1, 30]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        packed = ops_pack.unpad(padded, lens)
        out = ops_pack.pad(packed, lens, padded_len=64)
        out.float().sum().backward()
        packed_dev = ops_pack.unpad(
            padded.detach(),
            cu_seqlens=torch.tensor([0, 64, 65, 95], dtype=torch.int32).cuda(non_blocking=True),
            total_tokens=95,
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _same(packed, unpad_reference(padded.detach().cpu(), lens))
    _same(packed_dev, packed.detach())


@pytest.mark.gpu
def test_offsets_past_int32_elements() -> None:
    """T * hidden > 2**31 elements: element offsets must be computed in int64."""
    hidden = 4096 + 64
    lens = [2**19 + 3, 2**19 + 1]  # ~2.2e9 elements in the packed output
    padded = torch.empty((2, lens[0], hidden), dtype=torch.int8, device="cuda")
    padded.random_(-128, 127)
    packed = ops_pack.unpad(padded, lens)
    assert packed.numel() > 2**31
    tail0 = padded[0, -1]
    tail1 = padded[1, lens[1] - 1]
    assert torch.equal(packed[lens[0] - 1], tail0) and torch.equal(packed[-1], tail1)
    assert torch.equal(packed[lens[0] : lens[0] + 5], padded[1, :5])
    del packed
    back = ops_pack.pad(padded[1, : lens[1]].contiguous(), [lens[1]], padded_len=lens[1] + 2)
    assert torch.equal(back[0, : lens[1]], padded[1, : lens[1]])
    assert bool((back[0, lens[1] :] == 0).all())


@pytest.mark.slow
def test_cpu_twins_do_not_import_triton() -> None:
    import subprocess
    import sys

    code = (
        "import sys, torch, omnibal_kernels\n"
        "from omnibal_kernels.cpu.unpad import unpad\n"
        "from omnibal_kernels.cpu.varlen_metadata import varlen_metadata\n"
        "assert unpad(torch.ones(1, 2), [1]).shape == (1,)\n"
        "assert 'triton' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
