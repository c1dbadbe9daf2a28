"""Where the records come from: a JSON list or JSON Lines file, a list in memory, a ``datasets.Dataset``.

A source has a length, hands out the records of a range (``chunk(a, b)``, called in the worker that counts
them) and an ``identity``: a digest of the content, so that a run resumes and its shards merge wherever the
data lie and whatever their file times. A file is hashed as bytes; records in memory as canonical JSON in
which the objects that are not JSON stand for what the counting reads of them (a PIL image for its size and
EXIF orientation, bytes for their digest), never for their memory address.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .records import RecordError

__all__ = ["open_source", "records_identity"]

# bytes of a JSON Lines file scanned for line ends (and hashed) at a time
_SCAN_BLOCK = 1 << 26
_BOM = b"\xef\xbb\xbf"
_EXIF_ORIENTATION = 0x0112


class _Records:
    """Records held in memory (a JSON list file, a Python list)."""

    def __init__(self, records: Sequence[Any], identity: str) -> None:
        self.records, self.identity = records, identity

    def __len__(self) -> int:
        return len(self.records)

    def chunk(self, a: int, b: int) -> list:
        return list(self.records[a:b])


def _line_bounds(mm: Any, size: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Start and end offsets of every line of a mapped file, and the file's SHA-256, in one pass."""
    digest = hashlib.sha256()
    found = []
    # In blocks, so that memory holds the line offsets (16 bytes a sample), not the file.
    for lo in range(0, size, _SCAN_BLOCK):
        count = min(_SCAN_BLOCK, size - lo)
        block = np.frombuffer(mm, dtype=np.uint8, count=count, offset=lo)
        digest.update(block.data)
        found.append(np.flatnonzero(block == ord("\n")).astype(np.int64) + lo)
        del block
    newlines = np.concatenate(found)
    starts = np.concatenate([[0], newlines + 1])
    ends = np.concatenate([newlines, [size]])
    if mm[: len(_BOM)] == _BOM:
        starts[0] = len(_BOM)  # a byte order mark is no part of the first record
    return starts, np.maximum(ends, starts), digest.hexdigest()


def _blank(mm: Any, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each line holds only whitespace (or nothing): such lines are not samples."""
    blank = ends == starts
    rows = np.flatnonzero(~blank)
    if rows.size:
        first = np.frombuffer(mm, dtype=np.uint8)[starts[rows]]
        # A record starts with "{" (or another non-space byte): only lines that start with a space are read.
        spaced = rows[np.isin(first, np.frombuffer(b" \t\r\n\x0b\x0c", dtype=np.uint8))]
        for i in spaced:
            blank[i] = not mm[int(starts[i]) : int(ends[i])].strip()
    return blank


class _JsonLines:
    """A JSON Lines file; only line offsets are kept, each chunk parses its own lines (in its worker).
    Lines that hold only whitespace are not samples: sample ``i`` is the ``i``-th line that holds a record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        size = path.stat().st_size
        if size == 0:
            self.starts = self.ends = np.zeros(0, dtype=np.int64)
            self.identity = f"sha256:{hashlib.sha256(b'').hexdigest()}"
            return
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            starts, ends, digest = _line_bounds(mm, size)
            keep = ~_blank(mm, starts, ends)
        self.starts, self.ends = starts[keep], ends[keep]
        self.identity = f"sha256:{digest}"

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def chunk(self, a: int, b: int) -> list:
        if b <= a:
            return []
        base = int(self.starts[a])
        with open(self.path, "rb") as f:
            f.seek(base)
            blob = f.read(int(self.ends[b - 1]) - base)
        out = []
        for i in range(a, b):
            line = blob[int(self.starts[i]) - base : int(self.ends[i]) - base]
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                out.append(RecordError(f"sample {i}: {self.path}: the line is not JSON ({exc})"))
        return out


class _Dataset:
    """A ``datasets.Dataset``: rows are read chunk by chunk (columns -> row dicts)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.identity = f"datasets:{getattr(ds, '_fingerprint', id(ds))}:{len(ds)}"

    def __len__(self) -> int:
        return len(self.ds)

    def chunk(self, a: int, b: int) -> list:
        cols = self.ds[a:b]
        names = list(cols)
        return [dict(zip(names, values)) for values in zip(*(cols[n] for n in names))]


def _as_json(obj: Any) -> Any:
    """What the counting reads of an object that is not JSON (``json.dumps`` ``default``)."""
    from PIL import Image

    if isinstance(obj, Image.Image):
        return {"PIL.Image": [*obj.size, obj.getexif().get(_EXIF_ORIENTATION)]}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"bytes": hashlib.sha256(obj).hexdigest()}
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, numbers.Number):
        return obj.item() if isinstance(obj, np.generic) else repr(obj)
    # Read as neither a record nor a media reference (a bad record or unreadable media): only its type counts.
    return {"object": f"{type(obj).__module__}.{type(obj).__qualname__}"}


def records_identity(records: Sequence[Any]) -> str:
    """A SHA-256 of the records as canonical JSON (see the module docstring)."""
    digest = hashlib.sha256()
    for rec in records:
        try:
            text = json.dumps(rec, default=_as_json, sort_keys=True)
        except TypeError:  # keys of mixed types cannot be sorted: their order as given
            text = json.dumps(rec, default=_as_json)
        digest.update(text.encode())
        digest.update(b"\n")
    return f"records:sha256:{digest.hexdigest()}"


def open_source(data: Any) -> Any:
    """The source for ``data`` (see :func:`~omnibal_kernels.raw_lengths.lengths_from_raw`)."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise ValueError(f"data: {str(path)!r} is not a file")
        with open(path, "rb") as f:
            head = f.read(4096)
        if head.startswith(_BOM):
            head = head[len(_BOM) :]
        if head.lstrip().startswith(b"["):
            raw = path.read_bytes()
            try:
                records = json.loads(raw.decode("utf-8-sig"))
            except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise ValueError(f"data: {path} is not valid JSON ({exc})") from exc
            if not isinstance(records, list):
                raise ValueError(f"data: {path} is not a JSON list of records")
            return _Records(records, f"sha256:{hashlib.sha256(raw).hexdigest()}")
        return _JsonLines(path)
    if hasattr(data, "column_names") and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _Dataset(data)
    if isinstance(data, Sequence):
        return _Records(data, records_identity(data))
    raise TypeError(f"data must be a path, a list of records or a datasets.Dataset, got {type(data).__name__}")
