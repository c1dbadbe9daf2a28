"""The sample fields besides ``input_ids`` and ``labels``: token fields, per-sample values, the vision fields.

:func:`add_sample_fields` runs after the text core and adds to the batch's fields: each name in
``token_fields`` concatenated to ``(1, T)``; an ``attention_mask`` without zeros dropped (one with zeros
raises: packing needs unpadded samples); a field that every sample holds as a number or 0-d tensor as a
``(B,)`` tensor; any other field as the list of its B per-sample values (None where a sample lacks it); a
field named like an output raises. The vision fields and mRoPE positions come from
:func:`omnibal_kernels.vision.fields.pack_batch_vision`, called once per batch that has any of them.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..vision.fields import SAMPLE_KEYS as VISION_SAMPLE_KEYS
from ..vision.fields import pack_batch_vision
from .batch import TEXT_FIELDS
from .options import PackOptions

__all__ = ["add_sample_fields"]

# Text fields pack_batch produces from input_ids and labels; a sample field of one of these names is an error.
_RESERVED = frozenset(TEXT_FIELDS) - {"input_ids", "labels"}


def add_sample_fields(samples: Sequence[Mapping[str, Any]], fields: dict[str, Any], opts: PackOptions) -> None:
    """Add the fields of ``samples`` other than ``input_ids``/``labels`` to ``fields`` (the module docstring)."""
    keys: dict[str, None] = {}
    for sample in samples:
        for key in sample:
            if key != "input_ids" and key != "labels":
                keys[key] = None
    num_samples = len(samples)
    lens = fields["seq_lens"][:num_samples].tolist()
    padded = fields["input_ids"].shape[1]
    for name in opts.token_fields:
        fields[name] = _pack_token_field(samples, name, lens, padded)
    vision = opts.mrope_enabled
    for key in keys:
        if key in opts.token_fields:
            continue
        if key in VISION_SAMPLE_KEYS:
            vision = True
            continue
        if key == "attention_mask":
            # Packing drops padding-free attention masks: the segment boundaries replace them.
            for i, sample in enumerate(samples):
                if key in sample and not bool(torch.as_tensor(sample[key]).all()):
                    raise ValueError(
                        f"sample {i}: attention_mask has zeros; pack_batch packs unpadded samples, "
                        "strip the padding first"
                    )
            continue
        if key in _RESERVED:
            first = next(i for i, s in enumerate(samples) if key in s)
            raise ValueError(f"sample {first} has a {key!r} field, which pack_batch produces itself")
        fields[key] = _collect_per_sample([sample.get(key) for sample in samples])
    if vision:
        pack_batch_vision(samples, fields, opts)


def _collect_per_sample(values: list[Any]) -> Any:
    """Numbers and 0-d tensors (all present) stack into a (B,) tensor; anything else stays a list."""
    if all(isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, complex) for v in values):
        return torch.tensor(values)
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in values):
        return torch.stack(values)
    return values


def _pack_token_field(samples: Sequence[Mapping[str, Any]], name: str, lens: list[int], padded: int) -> torch.Tensor:
    """Sample field ``name`` (one value per token) of every sample, concatenated and zero-padded to ``(1, T)``."""
    parts = []
    for i, sample in enumerate(samples):
        if name not in sample:
            raise ValueError(f"sample {i} has no {name!r} field (named in token_fields)")
        value = sample[name]
        # a reversed numpy view has negative strides, which torch cannot wrap: copy it
        if isinstance(value, np.ndarray):
            tensor = torch.from_numpy(np.ascontiguousarray(value))
        else:
            tensor = torch.as_tensor(value)
        if tensor.dim() != 1 or tensor.shape[0] != lens[i]:
            raise ValueError(
                f"sample {i}: token field {name!r} must be 1-D with {lens[i]} values (one per token), "
                f"got shape {tuple(tensor.shape)}"
            )
        parts.append(tensor)
    total = sum(lens)
    if padded > total:
        parts.append(torch.zeros(padded - total, dtype=parts[0].dtype))
    return torch.cat(parts)[None]
