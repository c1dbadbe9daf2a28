"""Padded rows to a varlen token stream and back: ``unpad``, ``pad``, ``unpad_from_mask`` (flash-attention's names).

``unpad`` turns right-padded ``padded: (B, S, *rest)`` plus per-row lengths into ``packed: (T, *rest)`` with
``T = sum(seq_lens)``; row ``b`` occupies ``packed[cu_seqlens[b]:cu_seqlens[b + 1]]`` (flash-attention's
varlen layout). ``pad`` is the inverse and writes ``fill_value`` into the padding. Each is the other's
backward, so gradients flow through both.

Any dtype works: the kernels move raw bits (the tensor is viewed as an integer type of the same width), so
bf16, fp32, int64 and bool values come through bit-exact. The trailing dims are flattened to one ``hidden``
axis that must be contiguous (a copy is made where it is not); the batch, sequence and token axes may have
any strides.

Host syncs: none when the lengths come from the host (a list, numpy array or CPU tensor: they are checked
there and copied with a non-blocking transfer) or when device lengths come with ``total_tokens``.
``unpad_from_mask`` reads its lengths from an on-device ``attention_mask`` and syncs exactly once.

References: ``omnibal_kernels.testing.references.unpad_reference`` / ``pad_reference``; CPU twin:
``omnibal_kernels.cpu.unpad``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import use_cpu_twin
from .._contracts.segments import LengthsLike
from .._contracts.unpad import (
    PackedTokens,
    check_attention_mask,
    check_packed,
    check_padded,
    mask_segments,
    pad_segments,
    unpad_segments,
)
from .._csr import INT32_MAX
from . import _launch

# A tile of ~16 KiB per program keeps enough loads in flight per SM for a bandwidth-bound copy while
# leaving registers for 4 warps (16 B per thread per access -> 8 accesses in flight per thread). One row
# chunk is at most 4 KiB so a bf16 hidden size of 4096 is split in two column blocks and the grid has
# twice as many programs for small token counts. Starting values, to be tuned on the H200 with
# benchmarks/bench_ops_gpu.py (it reports the alternatives next to these).
TILE_BYTES = 16384
ROW_BYTES = 4096
NUM_WARPS = 4
# Upper bound on rows per tile: with tiny hidden sizes (token ids, hidden == 1) more rows per program add
# nothing but masked lanes.
MAX_TILE_ROWS = 1024

# raw-bits view of each element width
_BITS_DTYPE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _unpad_kernel(
    # pointers: source (batch, padded_len, hidden), destination (total_tokens, hidden), int32 (batch + 1,)
    padded_ptr,
    packed_ptr,
    cu_seqlens_ptr,
    # sizes
    batch,
    padded_len,
    hidden,
    total_tokens,
    search_steps,
    # strides in elements; the hidden axis has stride 1
    stride_pad_b,
    stride_pad_s,
    stride_packed_t,
    # tile: BLOCK_T packed tokens x BLOCK_H hidden elements per program
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # one program per (token block, hidden block); hidden blocks of the same tokens are neighbours
    pid = tl.program_id(0)
    n_hblocks = tl.cdiv(hidden, BLOCK_H)
    tblock = pid // n_hblocks
    hblock = pid % n_hblocks
    tok = tblock * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = tok < total_tokens

    # row of each token: the last b with cu_seqlens[b] <= tok (skips empty rows); search_steps =
    # ceil(log2(batch)) halvings of [lo, hi]; reads hit L1/L2, cu_seqlens is tiny
    lo = tl.zeros([BLOCK_T], dtype=tl.int32)
    hi = tl.zeros([BLOCK_T], dtype=tl.int32) + (batch - 1)
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        right = tl.load(cu_seqlens_ptr + mid, mask=tok_ok, other=0) <= tok
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid - 1)
    pos = tok - tl.load(cu_seqlens_ptr + lo, mask=tok_ok, other=0)
    row_ok = tok_ok & (pos < padded_len)

    # int64 element offsets: tokens * hidden can pass 2**31
    h = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (h < hidden)[None, :]
    src = lo.to(tl.int64) * stride_pad_b + pos.to(tl.int64) * stride_pad_s
    dst = tok.to(tl.int64) * stride_packed_t
    x = tl.load(padded_ptr + src[:, None] + h[None, :], mask=mask)
    tl.store(packed_ptr + dst[:, None] + h[None, :], x, mask=mask)


@triton.jit
def _pad_kernel(
    # pointers: source (total_tokens, hidden), destination (batch, padded_len, hidden), int32 (batch + 1,)
    packed_ptr,
    padded_ptr,
    cu_seqlens_ptr,
    # sizes
    padded_len,
    hidden,
    total_tokens,
    n_seq_blocks,
    # raw bits written into the padding
    fill_bits,
    # strides in elements; the hidden axis has stride 1
    stride_packed_t,
    stride_pad_b,
    stride_pad_s,
    # tile: BLOCK_S padded positions x BLOCK_H hidden elements per program
    BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # one program per (row, position block, hidden block) of the padded output: every program writes
    pid = tl.program_id(0)
    n_hblocks = tl.cdiv(hidden, BLOCK_H)
    row_block = pid // n_hblocks
    hblock = pid % n_hblocks
    b = row_block // n_seq_blocks
    sblock = row_block % n_seq_blocks
    start = tl.load(cu_seqlens_ptr + b)
    length = tl.load(cu_seqlens_ptr + b + 1) - start

    pos = sblock * BLOCK_S + tl.arange(0, BLOCK_S)
    tok = start + pos
    valid = (pos < length) & (tok < total_tokens)
    h = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = (h < hidden)[None, :]
    # int64 element offsets: tokens * hidden can pass 2**31
    src = tok.to(tl.int64) * stride_packed_t
    dst = b.to(tl.int64) * stride_pad_b + pos.to(tl.int64) * stride_pad_s
    # masked-off lanes (padding) issue no reads and take the fill bits
    x = tl.load(packed_ptr + src[:, None] + h[None, :], mask=valid[:, None] & h_ok, other=fill_bits)
    tl.store(padded_ptr + dst[:, None] + h[None, :], x, mask=(pos < padded_len)[:, None] & h_ok)


# ----------------------------------------------------------------------------------------------- launchers


def _bits(x: torch.Tensor) -> torch.Tensor:
    """Same memory viewed as integers of the element's width (wider elements as several int64)."""
    width = x.element_size()
    if width in _BITS_DTYPE:
        return x.view(_BITS_DTYPE[width])
    return x.view(torch.int64)


def _rows(x: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """``x`` as ``(*lead, hidden)`` with a unit-stride hidden axis; a view whenever the layout allows."""
    hidden = 1
    for size in x.shape[len(lead) :]:
        hidden *= size
    rows = x.reshape(*lead, hidden)
    if rows.shape[-1] > 1 and rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _tile(hidden: int, itemsize: int, tile_bytes: int, row_bytes: int) -> tuple[int, int]:
    """(BLOCK_H, rows per tile): powers of two, a row chunk of at most ``row_bytes``, ~``tile_bytes`` a tile."""
    block_h = min(triton.next_power_of_2(max(hidden, 1)), _floor_pow2(row_bytes // itemsize))
    block_rows = _floor_pow2(min(MAX_TILE_ROWS, tile_bytes // (block_h * itemsize)))
    return block_h, block_rows


def _fill_bits(fill_value: float | int | bool, dtype: torch.dtype) -> int:
    """The raw bits of ``fill_value`` in ``dtype``, as the signed integer the kernel stores."""
    width = torch.empty((), dtype=dtype).element_size()
    if width not in _BITS_DTYPE:
        # wider than 8 bytes (complex128): only zero is one repeated int64 word
        if fill_value != 0:
            raise ValueError(f"pad: fill_value must be 0 for dtype {dtype}")
        return 0
    return int(torch.tensor([fill_value], dtype=dtype).view(_BITS_DTYPE[width])[0])


def launch_unpad(
    padded: torch.Tensor,
    cu_seqlens: torch.Tensor,
    total_tokens: int,
    *,
    tile_bytes: int = TILE_BYTES,
    row_bytes: int = ROW_BYTES,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Kernel call without checks of the lengths: ``padded (B, S, *rest)`` -> ``(total_tokens, *rest)``.

    ``cu_seqlens`` is int32 ``(B + 1,)`` on the device of ``padded``.
    """
    _launch.check_launchable(padded, "unpad")
    batch, padded_len = padded.shape[0], padded.shape[1]
    out = _launch.alloc((total_tokens, *padded.shape[2:]), padded.dtype, padded.device)
    if out.numel() == 0:
        return out
    src = _bits(_rows(padded, (batch, padded_len)))
    dst = _bits(out.view(total_tokens, -1))
    hidden = src.shape[-1]
    block_h, block_t = _tile(hidden, src.element_size(), tile_bytes, row_bytes)
    n_programs = triton.cdiv(total_tokens, block_t) * triton.cdiv(hidden, block_h)
    if n_programs > INT32_MAX:
        raise ValueError(f"unpad: {n_programs} programs exceed the launch grid; the input is too large")
    _unpad_kernel[(n_programs,)](
        padded_ptr=src,
        packed_ptr=dst,
        cu_seqlens_ptr=cu_seqlens,
        batch=batch,
        padded_len=padded_len,
        hidden=hidden,
        total_tokens=total_tokens,
        search_steps=max(batch - 1, 0).bit_length(),
        stride_pad_b=src.stride(0),
        stride_pad_s=src.stride(1),
        stride_packed_t=dst.stride(0),
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
    return out


def launch_pad(
    packed: torch.Tensor,
    cu_seqlens: torch.Tensor,
    padded_len: int,
    fill_value: float | int | bool = 0,
    *,
    tile_bytes: int = TILE_BYTES,
    row_bytes: int = ROW_BYTES,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Kernel call without checks of the lengths: ``packed (T, *rest)`` -> ``(B, padded_len, *rest)``."""
    _launch.check_launchable(packed, "pad")
    batch = cu_seqlens.numel() - 1
    total_tokens = packed.shape[0]
    out = _launch.alloc((batch, padded_len, *packed.shape[1:]), packed.dtype, packed.device)
    if out.numel() == 0:
        return out
    src = _bits(_rows(packed, (total_tokens,)))
    dst = _bits(out.view(batch, padded_len, -1))
    fill_bits = _fill_bits(fill_value, packed.dtype)
    hidden = src.shape[-1]
    block_h, block_s = _tile(hidden, src.element_size(), tile_bytes, row_bytes)
    n_seq_blocks = triton.cdiv(padded_len, block_s)
    n_programs = batch * n_seq_blocks * triton.cdiv(hidden, block_h)
    if n_programs > INT32_MAX:
        raise ValueError(f"pad: {n_programs} programs exceed the launch grid; the input is too large")
    _pad_kernel[(n_programs,)](
        packed_ptr=src,
        padded_ptr=dst,
        cu_seqlens_ptr=cu_seqlens,
        padded_len=padded_len,
        hidden=hidden,
        total_tokens=total_tokens,
        n_seq_blocks=n_seq_blocks,
        fill_bits=fill_bits,
        stride_packed_t=src.stride(0),
        stride_pad_b=dst.stride(0),
        stride_pad_s=dst.stride(1),
        BLOCK_S=block_s,
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
    return out


# ------------------------------------------------------------------------------------------------ autograd


class _Unpad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded: torch.Tensor, cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
        ctx.save_for_backward(cu_seqlens)
        ctx.padded_len = padded.shape[1]
        return launch_unpad(padded, cu_seqlens, total_tokens)

    @staticmethod
    def backward(ctx, grad_packed: torch.Tensor):
        (cu_seqlens,) = ctx.saved_tensors
        return _Pad.apply(grad_packed, cu_seqlens, ctx.padded_len, 0), None, None


class _Pad(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, packed: torch.Tensor, cu_seqlens: torch.Tensor, padded_len: int, fill_value: float | int | bool
    ) -> torch.Tensor:
        ctx.save_for_backward(cu_seqlens)
        ctx.total_tokens = packed.shape[0]
        return launch_pad(packed, cu_seqlens, padded_len, fill_value)

    @staticmethod
    def backward(ctx, grad_padded: torch.Tensor):
        (cu_seqlens,) = ctx.saved_tensors
        # the fill value is a constant: padding positions send no gradient back
        return _Unpad.apply(grad_padded, cu_seqlens, ctx.total_tokens), None, None, None


# ---------------------------------------------------------------------------------------------- public API


def unpad(
    padded: torch.Tensor,
    seq_lens: LengthsLike | None = None,
    *,
    cu_seqlens: LengthsLike | None = None,
    total_tokens: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Gather the valid prefix of every row of a right-padded batch into one token stream.

    Args:
        padded: ``(B, S, *rest)``, any dtype; row ``b`` holds ``seq_lens[b] <= S`` tokens, then padding.
        seq_lens: ``(B,)`` lengths: a list, numpy array or CPU tensor (checked, copied without a sync) or
            an int32/int64 tensor on the device of ``padded``.
        cu_seqlens: instead of ``seq_lens``: int32 ``(B + 1,)``, starting at 0, non-decreasing.
        total_tokens: ``T = sum(seq_lens)``. Needed only for device lengths; without it one host sync reads
            it back (and checks the lengths). With it nothing is checked on the device, but a wrong value
            can only give wrong rows, never an out-of-bounds write.
        backend: ``"auto"`` (CUDA -> Triton kernel, CPU -> ``omnibal_kernels.cpu.unpad``), ``"triton"`` or
            ``"cpu"``.

    Returns:
        ``packed: (T, *rest)`` with ``packed[cu_seqlens[b] + s] == padded[b, s]`` for ``s < seq_lens[b]``.
        Differentiable; the backward is ``pad`` with zeros in the padding.
    """
    fn = "unpad"
    padded = check_padded(padded, fn)
    if use_cpu_twin(fn, backend, padded):
        from ..cpu.unpad import unpad as unpad_cpu

        return unpad_cpu(padded, seq_lens, cu_seqlens=cu_seqlens, total_tokens=total_tokens)
    seg = unpad_segments(padded, seq_lens, cu_seqlens, total_tokens, fn)
    _launch.check_launchable(padded, fn)
    return _Unpad.apply(padded, seg.cu_seqlens, seg.total_tokens)


def pad(
    packed: torch.Tensor,
    seq_lens: LengthsLike | None = None,
    *,
    cu_seqlens: LengthsLike | None = None,
    padded_len: int | None = None,
    fill_value: float | int | bool = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """Scatter a token stream back into right-padded rows; the inverse of ``unpad``.

    Args:
        packed: ``(T, *rest)``, any dtype, ``T = sum(seq_lens)``.
        seq_lens: ``(B,)`` lengths (host or device, as in ``unpad``).
        cu_seqlens: instead of ``seq_lens``: int32 ``(B + 1,)``.
        padded_len: ``S`` of the output; defaults to the longest row (one host sync for device lengths).
        fill_value: written into every padding position (a number the dtype holds exactly).
        backend: ``"auto"``, ``"triton"`` or ``"cpu"`` (see ``unpad``).

    Returns:
        ``padded: (B, S, *rest)``. Differentiable in ``packed``; the backward is ``unpad``.
    """
    fn = "pad"
    packed = check_packed(packed, fn)
    if use_cpu_twin(fn, backend, packed):
        from ..cpu.unpad import pad as pad_cpu

        return pad_cpu(packed, seq_lens, cu_seqlens=cu_seqlens, padded_len=padded_len, fill_value=fill_value)
    seg = pad_segments(packed, seq_lens, cu_seqlens, padded_len, fill_value, fn)
    _launch.check_launchable(packed, fn)
    if padded_len is None:
        padded_len = seg.max_seqlen if seg.max_seqlen is not None else _longest_on_device(seg.cu_seqlens)
    return _Pad.apply(packed, seg.cu_seqlens, padded_len, fill_value)


def _longest_on_device(cu_seqlens: torch.Tensor) -> int:
    if cu_seqlens.numel() < 2:
        return 0
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())  # the documented host sync


def unpad_from_mask(padded: torch.Tensor, attention_mask: torch.Tensor, *, backend: str = "auto") -> PackedTokens:
    """``unpad`` with the lengths read from a right-padded ``attention_mask``; syncs with the host once.

    Args:
        padded: ``(B, S, *rest)``, any dtype.
        attention_mask: ``(B, S)`` bool or integer 0/1, on the device of ``padded``; every row must be a run
            of ones followed by zeros (right padding), otherwise a ValueError names the first bad row.
        backend: ``"auto"``, ``"triton"`` or ``"cpu"`` (see ``unpad``).

    Returns:
        ``PackedTokens(packed (T, *rest), cu_seqlens int32 (B + 1,), max_seqlen int, seq_lens int32 (B,))``.
        The single sync reads the total, the longest row and the right-padding check in one transfer;
        flash-attention's ``unpad_input`` syncs too (``nonzero`` and ``max().item()``).
    """
    fn = "unpad_from_mask"
    padded = check_padded(padded, fn)
    mask = check_attention_mask(padded, attention_mask, fn)
    if use_cpu_twin(fn, backend, padded):
        from ..cpu.unpad import unpad_from_mask as unpad_from_mask_cpu

        return unpad_from_mask_cpu(padded, attention_mask)
    _launch.check_launchable(padded, fn)
    seq_lens, cu_seqlens, total, longest = mask_segments(mask, fn)
    packed = _Unpad.apply(padded, cu_seqlens, total)
    return PackedTokens(packed, cu_seqlens, longest, seq_lens)
