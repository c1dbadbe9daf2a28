"""Input conversion of :func:`~omnibal_kernels.packing.pack_batch`: each sample's token sequences as 1-D int64
CPU tensors, and the errors that name the sample behind a failure.

The text core takes tensors as they are and calls these only to convert other input (lists, numpy arrays)
or, after a batch-wide operation failed, to find and name the first bad sample.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .options import is_int

__all__ = ["as_int64_parts", "as_token_tensor", "check_each", "sample_error"]

_INT64 = torch.int64
_INT64_MAX = 2**63 - 1
_UINT64 = getattr(torch, "uint64", None)
INTEGER_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
)
# unsigned dtypes torch.cat cannot combine with int64 ("Promotion for uint16, uint32, uint64 types is not supported")
_UNPROMOTABLE = frozenset(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))


def _int_list_tensor(values: list[Any] | tuple[Any, ...] | range) -> torch.Tensor:
    """A non-empty list of ints as a tensor: int64 written by ``struct``, else ``torch.tensor``'s result.

    ``struct`` converts each item with ``__index__`` in C, straight into the tensor's memory, which is faster
    than ``torch.tensor``, ``array.array`` or ``np.array(values, dtype=np.int64)`` (which also truncates
    floats); the ``lists`` input of benchmarks/bench_pack.py times it inside ``pack_batch``. It takes ints and
    numpy or 0-d tensor integers and rejects floats, strings, None and values outside int64. Whatever it
    rejects, and lists that start with a bool (torch makes a bool tensor of an all-bool list, which the caller
    rejects), goes to ``torch.tensor``, so every error and every rejected dtype is ``torch.tensor``'s.
    """
    if type(values[0]) is not bool:
        out = torch.empty(len(values), dtype=_INT64)
        try:
            # numpy's stubs do not declare ndarray a Buffer; it is a writable one
            struct.pack_into(f"{len(values)}q", out.numpy(), 0, *values)  # type: ignore[arg-type]
        except (TypeError, struct.error):
            pass
        else:
            return out
    return torch.tensor(values)


def as_token_tensor(value: Any, index: int, field: str) -> torch.Tensor:
    """One sample's ``field`` as a 1-D integer tensor, or a TypeError/ValueError naming the sample.

    Unsigned tensors come back as int64 (torch cannot concatenate them with int64 ones), numpy arrays as
    contiguous int64 (a reversed view is copied); values above the int64 range are a ValueError.
    """
    if isinstance(value, torch.Tensor):
        tensor = value
        if tensor.dtype is _UINT64 and tensor.dim() == 1 and tensor.is_cpu:
            _check_int64_range(tensor.view(_INT64).numpy(), index, field)
        if tensor.dtype in _UNPROMOTABLE:
            tensor = tensor.to(_INT64)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"sample {index}: {field} must hold integers, got numpy dtype {value.dtype}")
        if value.dtype.kind == "u" and value.dtype.itemsize == 8 and value.ndim == 1:
            _check_int64_range(value.view(np.int64), index, field)
        array = np.ascontiguousarray(value, dtype=np.int64)
        if any(stride < 0 for stride in array.strides):
            # numpy calls a one-element (or empty) view contiguous whatever its stride, and passes a reversed
            # one through unchanged; torch refuses negative strides
            array = array.copy()
        tensor = torch.from_numpy(array)
    elif isinstance(value, (list, tuple, range)):
        if len(value) == 0:
            tensor = torch.empty(0, dtype=_INT64)
        else:
            try:
                tensor = _int_list_tensor(value)
            except (TypeError, ValueError, RuntimeError, OverflowError) as err:
                outside = [j for j, v in enumerate(value) if is_int(v) and not -_INT64_MAX - 1 <= v <= _INT64_MAX]
                if outside:
                    j = outside[0]
                    raise ValueError(
                        f"sample {index}: {field}[{j}] = {value[j]} does not fit in int64 (token "
                        f"ids and labels are int64)"
                    ) from None
                raise TypeError(f"sample {index}: {field} must be a list of ints ({err})") from None
    else:
        raise TypeError(
            f"sample {index}: {field} must be a 1-D torch tensor, numpy array or list of ints, "
            f"got {type(value).__name__}"
        )
    if tensor.dim() != 1:
        raise ValueError(f"sample {index}: {field} must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in INTEGER_DTYPES:
        raise TypeError(f"sample {index}: {field} must hold integers, got {tensor.dtype}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"sample {index}: {field} is on {tensor.device}; pack_batch packs CPU tensors "
            "(move the packed batch with .to(device))"
        )
    return tensor


def _check_int64_range(signed_view: np.ndarray, index: int, field: str) -> None:
    """uint64 values seen as int64: a negative one is a uint64 >= 2**63, which would wrap around."""
    wrapped = np.flatnonzero(signed_view < 0)
    if wrapped.size:
        j = int(wrapped[0])
        raise ValueError(
            f"sample {index}: {field}[{j}] = {int(signed_view[j]) + 2**64} does not fit in int64 "
            f"(token ids and labels are int64, at most {_INT64_MAX})"
        )


def as_int64_parts(parts: Sequence[Any], field: str) -> list[torch.Tensor]:
    """Every sample's ``field`` as an int64 tensor, or the error naming the first bad sample."""
    return [as_token_tensor(x, i, field).to(_INT64) for i, x in enumerate(parts)]


def check_each(ids: Sequence[Any], labels: Sequence[Any] | None) -> None:
    """Raise the error of the first bad sample, if any."""
    for i, x in enumerate(ids):
        x = as_token_tensor(x, i, "input_ids")
        if labels is not None and labels[i] is not ids[i]:
            y = as_token_tensor(labels[i], i, "labels")
            if y.numel() != x.numel():
                raise ValueError(f"sample {i}: labels has {y.numel()} tokens but input_ids has {x.numel()}")


def sample_error(samples: Sequence[Any]) -> None:
    """Raise the error of the first sample that is no mapping or has no ``input_ids``, if any."""
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise TypeError(f"sample {i} must be a mapping with an 'input_ids' field, got {type(sample).__name__}")
        if "input_ids" not in sample:
            raise ValueError(f"sample {i} has no 'input_ids' field (fields: {sorted(map(str, sample))})")
