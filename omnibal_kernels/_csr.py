"""Ragged integer data in compressed rows (CSR): ``values`` flat, row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

One layout for every per-sample list the package carries (a sample's ViT sequence lengths) and for packs of
samples. ``offsets`` is int64 of length ``rows + 1``, starting at 0, non-decreasing, ending at ``len(values)``.
Nothing here knows what the rows mean: callers name them in their errors.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = [
    "INT32_MAX",
    "check_int32_total",
    "check_offset_values",
    "check_offsets",
    "offsets_from_counts",
    "row_ids",
    "row_sums",
    "row_totals",
    "take_rows",
]

# Offsets handed to kernels as cu_seqlens are int32 (flash-attention's layout): their total must fit.
INT32_MAX = 2**31 - 1


def offsets_from_counts(counts: Any) -> np.ndarray:
    """int64 ``(len(counts) + 1,)`` offsets of rows of ``counts`` values each: 0, then the running sums."""
    counts = np.asarray(counts)
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    if counts.size:  # an empty list is a float64 array, which cumsum would refuse to write into int64
        np.cumsum(counts, out=offsets[1:])
    return offsets


def check_int32_total(name: str, total: int, what: str = "tokens", where: str = "") -> None:
    """``total`` ``what`` (the last offset) fit the int32 offsets ``name``; else a ValueError saying so."""
    if total > INT32_MAX:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{total} {what} in total overflow int32 {name} (at most {INT32_MAX})")


def check_offsets(name: str, offsets: Any, rows: int, total: int, where: str = "", row: str = "sample") -> np.ndarray:
    """``offsets`` as int64 ``(rows + 1,)`` from 0 to ``total``, non-decreasing; else a ValueError naming the row.

    Args:
        name: the argument, for the messages.
        offsets: the offsets (any integer array-like).
        rows: the number of rows wanted.
        total: the length of the flat values.
        where: a prefix for the messages (a file name), or empty.
        row: what a row is, for the messages (``"sample"``, ``"pack"``).
    """
    prefix = f"{where}: " if where else ""
    arr = np.asarray(offsets)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{prefix}{name} must be a 1-D integer array, got dtype {arr.dtype}, shape {arr.shape}")
    if arr.shape[0] != rows + 1:
        raise ValueError(f"{prefix}{name} must have {rows + 1} entries (one per {row}, plus one), got {arr.shape[0]}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    check_offset_values(name, arr, total, where=where, row=row)
    return arr


def check_offset_values(
    name: str,
    offsets: np.ndarray,
    total: Optional[int] = None,
    *,
    where: str = "",
    row: str = "sample",
    total_of: str = "values",
) -> None:
    """The rules of every offsets array, ``cu_seqlens`` included: it starts at 0, never decreases and, when
    ``total`` is given, ends at ``total``. A ValueError names ``name``, and the ``row`` that a decrease would
    give a negative length; ``where`` prefixes the messages, ``total_of`` says what ``total`` counts."""
    prefix = f"{where}: " if where else ""
    arr = np.asarray(offsets, dtype=np.int64)  # int64: differences of int32 offsets cannot wrap around
    if arr.size and arr[0] != 0:
        raise ValueError(f"{prefix}{name} must start at 0, got {int(arr[0])}")
    steps = np.diff(arr)
    if steps.size and steps.min() < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(
            f"{prefix}{row} {i}: {name} must be non-decreasing, but {name}[{i + 1}] = {int(arr[i + 1])} "
            f"< {name}[{i}] = {int(arr[i])}"
        )
    if total is not None and arr.size and arr[-1] != total:
        raise ValueError(
            f"{prefix}{name} must end at the number of {total_of} ({total}), got {name}[-1] = {int(arr[-1])}"
        )


def row_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``(rows,)`` int64 sum of every row (0 for an empty row)."""
    totals = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return totals[offsets[1:]] - totals[offsets[:-1]]


def row_totals(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``(rows,)`` float64 sum of every row (0 for an empty row); each row is added on its own, so a row's sum
    does not carry the rounding of a running sum over the rows before it."""
    values = np.asarray(values, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    out = np.zeros(sizes.shape[0])
    nonempty = sizes > 0
    if nonempty.any():
        # only the non-empty rows' starts: they rise strictly and stay inside values, and a reduceat at a
        # repeated index would give that element instead of an empty sum
        out[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty])
    return out


def row_ids(offsets: np.ndarray) -> np.ndarray:
    """``(len(values),)`` int64 row of every value."""
    return np.repeat(np.arange(offsets.shape[0] - 1, dtype=np.int64), np.diff(offsets))


def take_rows(offsets: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``rows`` (an int array, any order, repeats allowed) as new ``(offsets, values)``."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    new_offsets = offsets_from_counts(counts)
    # position j of new row k reads values[starts[k] + j]
    shift = np.repeat(starts - new_offsets[:-1], counts)
    return new_offsets, np.ascontiguousarray(values[np.arange(new_offsets[-1], dtype=np.int64) + shift])
