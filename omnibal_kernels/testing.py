"""Plain torch/numpy references shared by tests/ and benchmarks/: simple, slow and obviously correct."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def _as_list(value: Any) -> list[int]:
    return [int(v) for v in value.tolist()] if hasattr(value, "tolist") else [int(v) for v in value]


def reference_pack_batch(
    samples: Sequence[Mapping[str, Any]],
    *,
    mask_first_label: bool = True,
    ignore_index: int = -100,
    pad_to_multiple_of: int | None = None,
    pad_to_length: int | None = None,
    pad_token_id: int = 0,
    max_num_seqs: int | None = None,
    max_seqlen_buckets: int | Sequence[int] | None = None,
) -> dict[str, Any]:
    """Reference of ``omnibal_kernels.pack_batch``'s text fields, built sample by sample in Python lists
    (the way Hugging Face's ``DataCollatorWithFlattening`` does it), then turned into tensors."""
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    seq_idx: list[int] = []
    seq_lens: list[int] = []
    for index, sample in enumerate(samples):
        ids = _as_list(sample["input_ids"])
        labs = _as_list(sample["labels"]) if sample.get("labels") is not None else list(ids)
        if mask_first_label and ids:
            labs[0] = ignore_index
        input_ids += ids
        labels += labs
        position_ids += list(range(len(ids)))
        seq_idx += [index] * len(ids)
        seq_lens.append(len(ids))
    total = len(input_ids)
    padded = total
    if pad_to_multiple_of is not None:
        padded = -(-total // pad_to_multiple_of) * pad_to_multiple_of
    if pad_to_length is not None:
        padded = pad_to_length
    pad = padded - total
    if pad:
        input_ids += [pad_token_id] * pad
        labels += [ignore_index] * pad
        position_ids += list(range(pad))
        seq_idx += [len(samples)] * pad
        seq_lens.append(pad)
    if max_num_seqs is not None:
        seq_lens += [0] * (max_num_seqs - len(seq_lens))
    cu_seqlens = [0]
    for n in seq_lens:
        cu_seqlens.append(cu_seqlens[-1] + n)
    max_seqlen = max(seq_lens)
    if isinstance(max_seqlen_buckets, int):
        max_seqlen = -(-max_seqlen // max_seqlen_buckets) * max_seqlen_buckets
    elif max_seqlen_buckets is not None:
        max_seqlen = min(b for b in max_seqlen_buckets if b >= max_seqlen)
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    return {
        "input_ids": torch.tensor([input_ids], dtype=torch.int64),
        "labels": torch.tensor([labels], dtype=torch.int64),
        "position_ids": torch.tensor([position_ids], dtype=torch.int64),
        "cu_seqlens": cu,
        "max_seqlen": max_seqlen,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "seq_idx": torch.tensor([seq_idx], dtype=torch.int32),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }
