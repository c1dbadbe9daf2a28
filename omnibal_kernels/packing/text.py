"""The text core of :func:`~omnibal_kernels.packing.pack_batch`: token sequences -> the text fields of one row.

The token copies are ``torch.cat``; the per-token fields come from the CPU varlen-metadata path
(:func:`omnibal_kernels.cpu.varlen_metadata.varlen_fields`). Nothing loops over tokens in Python. Tensors
take a fast path; anything else is converted sample by sample (:mod:`.inputs`), and a batch-wide operation
that fails is retried sample by sample to name the bad sample. Inside a DataLoader worker every output is
written straight into one shared-memory storage, so handing the batch to the main process copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .._csr import INT32_MAX
from .._shared_memory import in_worker, shared_tensors
from ..cpu.varlen_metadata import varlen_fields
from .inputs import INTEGER_DTYPES, as_int64_parts, as_token_tensor, check_each
from .options import DEFAULT_OPTIONS, PackOptions

__all__ = ["pack_sequences"]

_INT64 = torch.int64
_UINT64 = getattr(torch, "uint64", None)
_numel = torch.Tensor.numel


def pack_sequences(
    input_ids: Sequence[Any],
    labels: Sequence[Any] | None = None,
    *,
    options: PackOptions | None = None,
    shared: bool | None = None,
) -> dict[str, Any]:
    """Pack token sequences into the text fields of a :class:`~omnibal_kernels.packing.PackedBatch` (a dict).

    input_ids: B sequences, each a 1-D integer torch tensor, numpy array or list of ints.
    labels: None (labels are copies of ``input_ids``) or B sequences of the same lengths; an entry may be
        None for a copy of that sample's ``input_ids``.
    options: :class:`~omnibal_kernels.packing.PackOptions` (defaults if None).
    shared: allocate the outputs in shared memory; None: only inside a DataLoader worker.

    Returns the text fields of :mod:`omnibal_kernels.packing`: ``input_ids``/``labels``/``position_ids``
    ``(1, T)`` int64, ``seq_idx`` ``(1, T)`` int32, ``cu_seqlens`` ``(S + 1,)`` int32, ``seq_lens`` ``(S,)``
    int32, ``max_seqlen`` int, the Hugging Face aliases, and ``use_cache=False``.
    """
    opts = DEFAULT_OPTIONS if options is None else options
    ids, labs, lens = _as_tensors(input_ids, labels, opts.allow_empty)
    layout = _row_layout(lens, opts, ids, labs)
    ids_in, labs_in = ids, labs
    if layout.pad:
        ids_in = ids + [torch.full((layout.pad,), opts.pad_token_id, dtype=_INT64)]
        labs_in = labs + [torch.full((layout.pad,), opts.ignore_index, dtype=_INT64)]
    if shared is None:
        shared = in_worker()
    if shared:
        # Validate first: cat(out=) would resize the shared buffer on a bad shape instead of failing.
        check_each(ids, labs)
        padded, num_slots = layout.padded, layout.num_slots
        buf64, buf32 = shared_tensors(((3, padded), _INT64), ((padded + 2 * num_slots + 1,), torch.int32))
        flat_ids, flat_labels = _concat_into(ids_in, labs_in, buf64[0], buf64[1])
        seq_idx, cu_seqlens, seq_lens = buf32.split([padded, num_slots + 1, num_slots])
        out = (buf64[2:3], seq_idx.view(1, padded), cu_seqlens, seq_lens)
    else:
        flat_ids, flat_labels = _concat(ids_in, labs_in, ids, labs)
        out = None
    _check_non_negative(flat_ids, lens)
    fields = varlen_fields(
        layout.seg_lens,
        len(lens),
        flat_labels,
        num_slots=layout.num_slots,
        mask_first_label=opts.mask_first_label,
        ignore_index=opts.ignore_index,
        backend=opts.backend,
        out=out,
    )
    max_seqlen = fields.max_seqlen
    if opts.max_seqlen_buckets is not None:
        max_seqlen = opts.round_max_seqlen(max_seqlen)
    cu_seqlens = fields.cu_seqlens
    return {
        "input_ids": flat_ids[None],
        "labels": flat_labels[None],
        "position_ids": fields.position_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "seq_lens": fields.seq_lens,
        "seq_idx": fields.seq_idx,
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        # A transformers model with use_cache on (its config default, in train() mode too) builds a cache, and
        # with a cache its sdpa/eager/flex mask skips the packed-sequence detection from position_ids
        # (masking_utils._preprocess_mask_arguments): the row's samples would attend to each other.
        "use_cache": False,
    }


def _check_non_negative(flat_ids: torch.Tensor, lens: list[int]) -> None:
    """Token ids are indices into an embedding: a negative one (often ``ignore_index`` written into
    ``input_ids``) is a ValueError naming the sample and the position."""
    total = sum(lens)
    if total == 0 or int(flat_ids[:total].min()) >= 0:
        return
    position = int(torch.nonzero(flat_ids[:total] < 0)[0])
    sample, start = 0, 0
    while start + lens[sample] <= position:
        start += lens[sample]
        sample += 1
    raise ValueError(
        f"sample {sample}: input_ids[{position - start}] = {int(flat_ids[position])} is negative; token "
        "ids index the embedding and are never negative (labels take ignore_index, input_ids do not)"
    )


def _as_tensors(
    input_ids: Sequence[Any], labels: Sequence[Any] | None, allow_empty: bool
) -> tuple[list[Any], list[Any], list[int]]:
    """``(ids, labels, lengths)``: the samples' sequences as tensors (tensors pass as they are) of equal lengths."""
    ids = input_ids if type(input_ids) is list else list(input_ids)
    num_samples = len(ids)
    if num_samples == 0:
        raise ValueError("pack_batch got an empty batch: there is nothing to pack")
    try:
        lens = list(map(_numel, ids))
    except TypeError:
        ids = [as_token_tensor(x, i, "input_ids") for i, x in enumerate(ids)]
        lens = list(map(_numel, ids))
    if labels is None:
        labs = ids
    else:
        labs = labels if type(labels) is list else list(labels)
        if len(labs) != num_samples:
            raise ValueError(f"got {len(labs)} labels for {num_samples} input_ids")
        try:
            label_lens = list(map(_numel, labs))
        except TypeError:
            labs = [ids[i] if y is None else as_token_tensor(y, i, "labels") for i, y in enumerate(labs)]
            label_lens = list(map(_numel, labs))
        if label_lens != lens:
            check_each(ids, labs)
            raise ValueError("labels and input_ids have different lengths")
    if not allow_empty and 0 in lens:
        check_each(ids, labs)
        raise ValueError(
            f"sample {lens.index(0)}: input_ids is empty (pass allow_empty=True to keep empty samples "
            "as zero-length segments)"
        )
    return ids, labs, lens


class _RowLayout(NamedTuple):
    padded: int  # tokens in the row, padding included
    pad: int  # tokens of the padding segment (0: none)
    seg_lens: list[int]  # the samples' lengths, then the padding segment's
    num_slots: int  # entries of seq_lens (cu_seqlens has one more)


def _row_layout(lens: list[int], static: PackOptions, ids: list[Any], labs: list[Any]) -> _RowLayout:
    """Where the padding goes and how many segment slots the row has, or the error of a batch that cannot fit."""
    total = sum(lens)
    if static.pad_to_length is not None:
        if total > static.pad_to_length:
            raise ValueError(f"the batch has {total} tokens, more than pad_to_length={static.pad_to_length}")
        padded = static.pad_to_length
    elif static.pad_to_multiple_of is not None:
        padded = -(-total // static.pad_to_multiple_of) * static.pad_to_multiple_of
    else:
        padded = total
    if padded > INT32_MAX:
        check_each(ids, labs)
        raise ValueError(
            f"the batch has {padded} tokens (after padding), more than int32 cu_seqlens can hold "
            f"({INT32_MAX}); pack fewer samples"
        )
    pad = padded - total
    seg_lens = lens + [pad] if pad else lens
    num_slots = len(seg_lens)
    if static.max_num_seqs is not None:
        if num_slots > static.max_num_seqs:
            raise ValueError(
                f"the batch has {num_slots} segments ({len(lens)} samples"
                f"{' + padding' if pad else ''}), more than max_num_seqs={static.max_num_seqs}"
            )
        num_slots = static.max_num_seqs
    return _RowLayout(padded, pad, seg_lens, num_slots)


def _concat_into(
    ids_in: list[Any], labs_in: list[Any], flat_ids: torch.Tensor, flat_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the (checked) sequences into the given int64 rows."""
    try:
        torch.cat(ids_in, out=flat_ids)
        torch.cat(labs_in, out=flat_labels)
    except RuntimeError:  # unsigned tensors beside int64 ones: torch does not promote them
        torch.cat(as_int64_parts(ids_in, "input_ids"), out=flat_ids)
        torch.cat(as_int64_parts(labs_in, "labels"), out=flat_labels)
    return flat_ids, flat_labels


def _concat(
    ids_in: list[Any], labs_in: list[Any], ids: list[Any], labs: list[Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences concatenated into int64 rows; a failure is traced to the first bad sample."""
    try:
        flat_ids = torch.cat(ids_in)
        flat_labels = torch.cat(labs_in)
    except (RuntimeError, TypeError):
        check_each(ids, labs)
        # every sample is fine alone: unsigned tensors beside int64 ones, which torch does not promote
        flat_ids = torch.cat(as_int64_parts(ids_in, "input_ids"))
        flat_labels = torch.cat(as_int64_parts(labs_in, "labels"))
    if (
        flat_ids.dtype is _INT64
        and flat_labels.dtype is _INT64
        and flat_ids.dim() == 1
        and flat_labels.dim() == 1
        and flat_ids.is_cpu
        and flat_labels.is_cpu
    ):
        return flat_ids, flat_labels
    if flat_ids.dim() != 1 or flat_ids.dtype not in INTEGER_DTYPES or not flat_ids.is_cpu:
        check_each(ids, None)
    if flat_labels.dim() != 1 or flat_labels.dtype not in INTEGER_DTYPES or not flat_labels.is_cpu:
        check_each(ids, labs)
    if flat_ids.dtype is _UINT64 or flat_labels.dtype is _UINT64:
        check_each(ids, labs)  # values >= 2**63 would wrap around in the int64 batch
    if flat_ids.dim() != 1 or flat_labels.dim() != 1:
        raise ValueError("input_ids and labels must be 1-D per sample")
    return flat_ids.to(_INT64), flat_labels.to(_INT64)
