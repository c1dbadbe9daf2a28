"""Varlen metadata on the CPU: the one CPU path from segment lengths to the per-token fields of a packed row.

From the lengths of the segments of a packed sequence, :func:`varlen_fields` builds ``position_ids``
(restarting at 0 per segment), ``seq_idx`` (segment index per token), ``cu_seqlens`` and ``seq_lens``
(padded with zero-length segments up to a fixed number of slots), the longest segment, and writes
``ignore_index`` over the first label of every sample segment. Two fills compute the same values: the fused
numba pass of :mod:`omnibal_kernels.cpu.varlen_metadata_numba` and the vectorized torch ops of
:func:`fill_varlen_fields`; ``backend`` picks one (``"auto"``: numba when it imports). ``pack_batch`` builds
its text fields with it, and :func:`varlen_metadata`, the CPU twin of
:func:`omnibal_kernels.ops.varlen_metadata.varlen_metadata`, is built on it. numba is imported only when the
numba fill is asked for.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from .._checks import check_cpu_tensor
from .._contracts.varlen_metadata import VarlenMetadata, check_varlen_args

__all__ = ["VarlenFields", "fill_backend", "fill_varlen_fields", "varlen_fields", "varlen_metadata", "warmup"]

_INT64 = torch.int64
_INT32 = torch.int32
_np_empty = np.empty
_from_numpy = torch.from_numpy
# the numba fill once imported (None until then)
_numba_fill: Callable[..., int] | None = None


class VarlenFields(NamedTuple):
    """The per-token and per-segment fields of one packed row of ``T`` tokens and ``S`` segment slots."""

    position_ids: torch.Tensor  # (1, T) int64
    seq_idx: torch.Tensor  # (1, T) int32
    cu_seqlens: torch.Tensor  # (S + 1,) int32
    seq_lens: torch.Tensor  # (S,) int32
    max_seqlen: int  # longest segment


def fill_backend(backend: str) -> str:
    """The fill that runs for a ``packing`` backend: ``"numba"`` when asked for (ImportError without numba) or
    ``"auto"`` and numba imports, else ``"torch"``."""
    global _numba_fill
    if backend == "torch":
        return "torch"
    if _numba_fill is None:
        try:
            from .varlen_metadata_numba import varlen_fields_into
        except ImportError:
            if backend == "numba":
                raise
            return "torch"
        _numba_fill = varlen_fields_into
    return "numba"


def warmup(backend: str = "auto") -> None:
    """Import and compile (or load from numba's cache) the numba fill in this process, when it is the one used.

    The first ``pack_batch`` of a process pays this otherwise. Called in the main process before DataLoader
    workers fork, it is done once for all of them.
    """
    if fill_backend(backend) == "numba":
        from .varlen_metadata_numba import warmup as compile_fill

        compile_fill()


def fill_varlen_fields(
    seg_lens: list[int],
    num_samples: int,
    mask_first_label: bool,
    ignore_index: int,
    labels: torch.Tensor | None,
    position_ids: torch.Tensor,
    seq_idx: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
) -> int:
    """Fill the fields in place with vectorized torch ops; return the longest segment length.

    seg_lens: the segment lengths (the samples', then any padding segment).
    num_samples: segments ``[0, num_samples)`` are samples whose first label is masked.
    labels: ``(T,)`` integer tensor (or None), written only at the first token of each sample segment.
    position_ids: ``(T,)`` int64; seq_idx: ``(T,)`` int32.
    cu_seqlens: ``(S + 1,)`` int32 and seq_lens: ``(S,)`` int32 with ``S >= len(seg_lens)``; entries past
    the real segments describe zero-length segments at the end.
    """
    num_segments = len(seg_lens)
    total = position_ids.shape[0]
    lens = torch.tensor(seg_lens, dtype=_INT64)
    seq_lens.zero_()
    seq_lens[:num_segments] = lens
    cu_seqlens[0] = 0
    cu_seqlens[1:] = torch.cumsum(seq_lens, 0)
    starts = cu_seqlens[:num_segments].to(_INT64)
    position_ids.copy_(torch.arange(total) - starts.repeat_interleave(lens, output_size=total))
    seq_idx.copy_(torch.arange(num_segments, dtype=_INT32).repeat_interleave(lens, output_size=total))
    if mask_first_label and labels is not None:
        first = starts[:num_samples][lens[:num_samples] > 0]
        labels[first] = ignore_index
    return max(seg_lens, default=0)


def varlen_fields(
    seg_lens: list[int],
    num_samples: int,
    labels: torch.Tensor | None,
    *,
    num_slots: int,
    mask_first_label: bool,
    ignore_index: int,
    backend: str = "auto",
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> VarlenFields:
    """The :class:`VarlenFields` of a packed row of ``T = sum(seg_lens)`` tokens, in ``num_slots`` segment slots.

    labels: ``(T,)`` int64 CPU tensor; with ``mask_first_label`` the first label of each of the first
        ``num_samples`` segments becomes ``ignore_index``, in place. None: no labels (``mask_first_label``
        must be False).
    backend: ``"auto"``, ``"numba"`` or ``"torch"`` (see :func:`fill_backend`).
    out: ``(position_ids (1, T) int64, seq_idx (1, T) int32, cu_seqlens (S + 1,) int32, seq_lens (S,) int32)``
        to write into (shared-memory views); None: new tensors.
    """
    total = labels.shape[0] if labels is not None else sum(seg_lens)
    if fill_backend(backend) == "numba":
        if out is None:
            # numpy allocates and torch wraps: cheaper than tensors viewed as arrays, or arrays the kernel
            # returns (numba boxes every array it returns)
            pos_np = _np_empty((1, total), np.int64)
            seq_idx_np = _np_empty((1, total), np.int32)
            cu_np = _np_empty(num_slots + 1, np.int32)
            seq_lens_np = _np_empty(num_slots, np.int32)
        else:
            pos_np, seq_idx_np, cu_np, seq_lens_np = out[0].numpy(), out[1].numpy(), out[2].numpy(), out[3].numpy()
        longest = _numba_fill(  # type: ignore[misc]
            np.array(seg_lens, dtype=np.int64),
            num_samples,
            mask_first_label,
            ignore_index,
            labels.numpy() if labels is not None else _np_empty(0, np.int64),
            pos_np.reshape(-1),
            seq_idx_np.reshape(-1),
            cu_np,
            seq_lens_np,
        )
        if out is not None:
            return VarlenFields(*out, longest)
        return VarlenFields(
            _from_numpy(pos_np), _from_numpy(seq_idx_np), _from_numpy(cu_np), _from_numpy(seq_lens_np), longest
        )
    if out is None:
        out = (
            torch.empty((1, total), dtype=_INT64),
            torch.empty((1, total), dtype=_INT32),
            torch.empty(num_slots + 1, dtype=_INT32),
            torch.empty(num_slots, dtype=_INT32),
        )
    position_ids, seq_idx, cu_seqlens, seq_lens = out
    longest = fill_varlen_fields(
        seg_lens, num_samples, mask_first_label, ignore_index, labels, position_ids[0], seq_idx[0], cu_seqlens, seq_lens
    )
    return VarlenFields(position_ids, seq_idx, cu_seqlens, seq_lens, longest)


def varlen_metadata(
    seq_lens: torch.Tensor,
    *,
    total_tokens: int | None = None,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> VarlenMetadata:
    """``cu_seqlens``, ``position_ids``, ``seq_idx`` and boundary labels of CPU ``seq_lens``.

    See :func:`omnibal_kernels.ops.varlen_metadata.varlen_metadata` for shapes and dtypes. Computed by the torch
    fill, which takes labels of every integer dtype.
    """
    fn = "varlen_metadata"
    check_cpu_tensor(fn, seq_lens)
    check_varlen_args(seq_lens, total_tokens, labels, ignore_index, fn)
    labels_out = None if labels is None else labels.clone(memory_format=torch.contiguous_format)
    lens = seq_lens.tolist()
    fields = varlen_fields(
        lens,
        len(lens),
        None if labels_out is None else labels_out.view(-1),
        num_slots=len(lens),
        mask_first_label=labels is not None,
        ignore_index=ignore_index,
        backend="torch",
    )
    return VarlenMetadata(fields.cu_seqlens, fields.position_ids[0], fields.seq_idx[0], labels_out)
