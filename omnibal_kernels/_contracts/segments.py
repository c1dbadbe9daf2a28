"""Segment boundaries of a varlen batch, checked and moved to the data's device (the ops taking lengths).

A batch of variable-length sequences is described either by ``seq_lens`` (B,) or by ``cu_seqlens`` (B+1,)
int32. Both may live on the host (a list, a numpy array or a CPU tensor: everything is checked, nothing
syncs) or on the device (only shapes and dtypes are checked; values need a host sync, which happens at most
once and only where the caller did not pass the host-side numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Union

import numpy as np
import torch

from .._csr import INT32_MAX, check_int32_total, check_offset_values, offsets_from_counts

__all__ = [
    "INT32_MAX",
    "LengthsLike",
    "Segments",
    "batch_from",
    "check_cu_seqlens_tensor",
    "check_host_lengths",
    "check_total_tokens",
    "is_host",
    "resolve_segments",
]

LengthsLike = Union[Sequence[int], np.ndarray, torch.Tensor]


class Segments(NamedTuple):
    """Segment boundaries ready for a kernel."""

    cu_seqlens: torch.Tensor  # int32 (batch + 1,) on the target device
    total_tokens: int  # cu_seqlens[-1], known on the host
    max_seqlen: int | None  # longest segment when known on the host without a sync, else None
    batch: int


def check_total_tokens(total_tokens: object, fn: str) -> int | None:
    """``total_tokens`` as an int in ``[0, INT32_MAX]``, or None."""
    if total_tokens is None:
        return None
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, (int, np.integer)):
        raise TypeError(f"{fn}: total_tokens must be an int, got {type(total_tokens).__name__}")
    if not 0 <= int(total_tokens) <= INT32_MAX:
        raise ValueError(f"{fn}: total_tokens must be in [0, {INT32_MAX}], got {total_tokens}")
    return int(total_tokens)


def check_cu_seqlens_tensor(
    name: str,
    cu_seqlens: object,
    fn: str = "",
    *,
    entries: int | None = None,
    device: torch.device | None = None,
    data: str = "the data",
) -> torch.Tensor:
    """``cu_seqlens`` is a 1-D int32 tensor (flash-attention's layout) of ``entries`` entries (of at least 2, one
    sequence, when None), on ``device`` (that of ``data``) when given. Only shapes, dtypes and devices are read:
    no value, so no host sync. Messages name ``name``, after ``fn`` when given."""
    prefix = f"{fn}: " if fn else ""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{prefix}{name} must be a torch.Tensor of int32, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{prefix}{name} must have dtype torch.int32 (flash-attention layout), got {cu_seqlens.dtype}")
    wrong_size = cu_seqlens.numel() < 2 if entries is None else cu_seqlens.numel() != entries
    if cu_seqlens.dim() != 1 or wrong_size:
        wanted = "batch + 1 with batch >= 1" if entries is None else f"batch + 1 = {entries}"
        raise ValueError(f"{prefix}{name} must have shape ({wanted},), got {tuple(cu_seqlens.shape)}")
    if device is not None and cu_seqlens.device != device:
        raise ValueError(f"{prefix}{name} is on {cu_seqlens.device} but {data} is on {device}")
    return cu_seqlens


def is_host(x: object) -> bool:
    """True for lists, tuples, numpy arrays and CPU tensors."""
    return not isinstance(x, torch.Tensor) or x.device.type == "cpu"


def _to_device(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """int32 host array -> device tensor without a host sync (pinned staging, non-blocking copy)."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int32))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _host_int_array(x: LengthsLike, name: str, fn: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{fn}: {name} must hold integers, got dtype {x.dtype}")
        arr = x.detach().numpy()
    else:
        arr = np.asarray(x)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{fn}: {name} must hold integers, got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {tuple(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def _check_device_seq_lens(x: torch.Tensor, fn: str, batch: int) -> None:
    if x.dim() != 1:
        raise ValueError(f"{fn}: seq_lens must be 1-D, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: seq_lens must have dtype torch.int32 or torch.int64, got {x.dtype}")
    if x.numel() != batch:
        raise ValueError(f"{fn}: seq_lens must have {batch} entries, got {x.numel()}")


def check_host_lengths(lens: np.ndarray, fn: str, padded_len: int | None) -> None:
    bad = np.flatnonzero(lens < 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{fn}: sequence {i} has negative length {int(lens[i])}")
    if padded_len is not None:
        bad = np.flatnonzero(lens > padded_len)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{fn}: sequence {i} has length {int(lens[i])} > padded length {padded_len}")
    check_int32_total("cu_seqlens", int(lens.sum()), where=fn)


def resolve_segments(
    seq_lens: LengthsLike | None,
    cu_seqlens: LengthsLike | None,
    total_tokens: int | None,
    *,
    batch: int,
    padded_len: int | None,
    device: torch.device,
    fn: str,
) -> Segments:
    """Check ``seq_lens`` / ``cu_seqlens`` against a batch of ``batch`` rows and move them to ``device``.

    Host lengths are checked completely (non-negative, at most ``padded_len``, total fits int32, matches
    ``total_tokens`` when given) and copied without a sync. Device lengths get shape/dtype checks; when
    ``total_tokens`` is None it is read back with one sync, together with the value checks.
    """
    if (seq_lens is None) == (cu_seqlens is None):
        raise TypeError(f"{fn}: pass exactly one of seq_lens or cu_seqlens")
    total_tokens = check_total_tokens(total_tokens, fn)

    if seq_lens is not None:
        if is_host(seq_lens):
            lens = _host_int_array(seq_lens, "seq_lens", fn)
            if lens.size != batch:
                raise ValueError(f"{fn}: seq_lens has {lens.size} entries for a batch of {batch}")
            check_host_lengths(lens, fn, padded_len)
            cu = offsets_from_counts(lens)
            return _host_segments(cu, total_tokens, device, fn, "seq_lens")
        assert isinstance(seq_lens, torch.Tensor)
        _check_device_seq_lens(seq_lens, fn, batch)
        if seq_lens.device != device:
            raise ValueError(f"{fn}: seq_lens is on {seq_lens.device} but the data is on {device}")
        cu_dev = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        torch.cumsum(seq_lens, 0, dtype=torch.int32, out=cu_dev[1:])
        return _device_segments(cu_dev, seq_lens, total_tokens, padded_len, fn, "seq_lens")

    assert cu_seqlens is not None
    if is_host(cu_seqlens):
        if isinstance(cu_seqlens, torch.Tensor):
            check_cu_seqlens_tensor("cu_seqlens", cu_seqlens, fn, entries=batch + 1)
        cu = _host_int_array(cu_seqlens, "cu_seqlens", fn)
        if cu.size != batch + 1:
            raise ValueError(f"{fn}: cu_seqlens must have shape (batch + 1 = {batch + 1},), got ({cu.size},)")
        check_offset_values("cu_seqlens", cu, where=fn, row="sequence")
        check_host_lengths(np.diff(cu), fn, padded_len)
        return _host_segments(cu, total_tokens, device, fn, "cu_seqlens")
    cu_seqlens = check_cu_seqlens_tensor("cu_seqlens", cu_seqlens, fn, entries=batch + 1, device=device)
    return _device_segments(cu_seqlens.contiguous(), None, total_tokens, padded_len, fn, "cu_seqlens")


def _host_segments(cu: np.ndarray, total_tokens: int | None, device: torch.device, fn: str, name: str) -> Segments:
    total = int(cu[-1])
    if total_tokens is not None and total_tokens != total:
        raise ValueError(f"{fn}: total_tokens={total_tokens} but {name} add up to {total}")
    lens = np.diff(cu)
    max_seqlen = int(lens.max()) if lens.size else 0
    return Segments(_to_device(cu, device), total, max_seqlen, cu.size - 1)


def _device_segments(
    cu_dev: torch.Tensor,
    lens_dev: torch.Tensor | None,
    total_tokens: int | None,
    padded_len: int | None,
    fn: str,
    name: str,
) -> Segments:
    batch = cu_dev.numel() - 1
    if total_tokens is not None:
        # Trust the caller: nothing is read back. Kernels mask every store to [0, total_tokens), so a wrong
        # value gives wrong rows but never an out-of-bounds write.
        return Segments(cu_dev, total_tokens, None, batch)
    # The one host sync of this path: total, shortest and longest segment in a single transfer.
    if batch == 0:
        return Segments(cu_dev, 0, 0, 0)
    if lens_dev is None:
        lens_dev = cu_dev[1:] - cu_dev[:-1]
    stats = torch.stack(
        [lens_dev.sum(dtype=torch.int64), cu_dev[0].long(), lens_dev.min().long(), lens_dev.max().long()]
    )
    total, first, shortest, longest = (int(v) for v in stats.cpu())
    check_int32_total("cu_seqlens", total, where=fn)
    if first != 0:
        raise ValueError(f"{fn}: cu_seqlens must start at 0, got {first}")
    if shortest < 0:
        raise ValueError(f"{fn}: {name} holds a negative length ({shortest})")
    if padded_len is not None and longest > padded_len:
        raise ValueError(f"{fn}: a sequence has length {longest} > padded length {padded_len}")
    return Segments(cu_dev, total, longest, batch)


def batch_from(seq_lens: LengthsLike | None, cu_seqlens: LengthsLike | None, fn: str) -> int:
    """Number of sequences described by ``seq_lens`` (B,) or ``cu_seqlens`` (B+1,)."""
    if (seq_lens is None) == (cu_seqlens is None):
        raise TypeError(f"{fn}: pass exactly one of seq_lens or cu_seqlens")
    x = seq_lens if seq_lens is not None else cu_seqlens
    name = "seq_lens" if seq_lens is not None else "cu_seqlens"
    shape = tuple(x.shape) if isinstance(x, (torch.Tensor, np.ndarray)) else (len(x),)  # type: ignore[arg-type]
    if len(shape) != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {shape}")
    if seq_lens is not None:
        return shape[0]
    if shape[0] < 1:
        raise ValueError(f"{fn}: cu_seqlens must have batch + 1 >= 1 entries, got 0")
    return shape[0] - 1
