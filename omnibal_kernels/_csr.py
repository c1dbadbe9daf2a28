"""Ragged integer data in compressed rows (CSR): ``values`` flat, row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

One layout for every per-sample list the package carries (a sample's ViT sequence lengths) and for packs of
samples. ``offsets`` is int64 of length ``rows + 1``, starting at 0, non-decreasing, ending at ``len(values)``.
Nothing here knows what the rows mean: callers name them in their errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_offsets", "row_ids", "row_sums", "take_rows"]


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
    if arr[0] != 0:
        raise ValueError(f"{prefix}{name} must start at 0, got {int(arr[0])}")
    steps = np.diff(arr)
    if steps.size and steps.min() < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{prefix}{row} {i}: {name} decrease ({int(arr[i])} then {int(arr[i + 1])})")
    if arr[-1] != total:
        raise ValueError(f"{prefix}{name} must end at the number of values ({total}), got {int(arr[-1])}")
    return arr


def row_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``(rows,)`` int64 sum of every row (0 for an empty row)."""
    totals = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return totals[offsets[1:]] - totals[offsets[:-1]]


def row_ids(offsets: np.ndarray) -> np.ndarray:
    """``(len(values),)`` int64 row of every value."""
    return np.repeat(np.arange(offsets.shape[0] - 1, dtype=np.int64), np.diff(offsets))


def take_rows(offsets: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``rows`` (an int array, any order, repeats allowed) as new ``(offsets, values)``."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    new_offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    # position j of new row k reads values[starts[k] + j]
    shift = np.repeat(starts - new_offsets[:-1], counts)
    return new_offsets, np.ascontiguousarray(values[np.arange(new_offsets[-1], dtype=np.int64) + shift])
