"""Reading length files: OmniBal JSON and meta files, JSON Lines, ``.npy`` and ``.npz``, all checked, with the
sample and file named in every error (the formats are described in :mod:`omnibal_kernels.lengths`)."""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

from .. import _ext
from .table import Lengths, _as_load_array, _check_label, _check_vit_seqlens, _frozen

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["default_lengths", "load_lengths"]

# Byte order marks of the other encodings a JSON length file may arrive in (UTF-32 first: its little-endian
# mark begins with UTF-16's). Only UTF-8 is read; its own mark is skipped.
_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32", "big-endian"),
    (b"\xff\xfe\x00\x00", "UTF-32", "little-endian"),
    (b"\xfe\xff", "UTF-16", "big-endian"),
    (b"\xff\xfe", "UTF-16", "little-endian"),
)
# What numpy raises on a truncated or corrupt .npy/.npz (besides ValueError).
_ARCHIVE_ERRORS = (ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def _utf8_json(path: Path, data: bytes) -> memoryview:
    """The JSON bytes of ``data`` without a UTF-8 byte order mark; a clear error for UTF-16/32."""
    if data.startswith(_UTF8_BOM):
        return memoryview(data)[len(_UTF8_BOM) :]
    for bom, encoding, order in _OTHER_BOMS:
        if data.startswith(bom):
            raise ValueError(
                f"{path}: the file is {encoding} ({order}) encoded; length files must be UTF-8 "
                f"(convert it, e.g. iconv -f {encoding} -t UTF-8)"
            )
    # Without a mark, UTF-16/32 JSON shows NUL bytes between its ASCII characters.
    if b"\x00" in data[:64]:
        raise ValueError(
            f"{path}: the file holds NUL bytes (UTF-16 or UTF-32 encoded, or not text); length files must be UTF-8 JSON"
        )
    return memoryview(data)


class _JsonRecords(NamedTuple):
    """What a JSON or JSON Lines length file of N samples holds, checked (``_read_records``).

    Attributes:
        vit, llm: (N,) int64 loads (``vit_num``, ``token_num``).
        vit_seqlens: (total,) int64 ViT sequence lengths (``vit_seqlens``: per image, video frame group or tile,
            in ViT load units), every sample's run one after another; None when no sample has the key.
        vit_seqlens_offsets: (N + 1,) int64 from 0: sample i's run is ``vit_seqlens[offsets[i]:offsets[i + 1]]``
            and sums to ``vit[i]``; None with ``vit_seqlens``.
        label: (N,) int64 trained label tokens (``label_num``), each at most ``llm[i]``; None when no sample has
            the key.
    """

    vit: np.ndarray
    llm: np.ndarray
    vit_seqlens: np.ndarray | None
    vit_seqlens_offsets: np.ndarray | None
    label: np.ndarray | None


def _read_records(path: Path, data: memoryview) -> _JsonRecords:
    """The samples of a JSON list or JSON Lines ``data`` (UTF-8 without a byte order mark), scanned in C++.

    Malformed JSON, bytes that are not UTF-8 and bad values are a ValueError naming ``path``, the sample, the line
    and the column. Where some sample has ``vit_seqlens``, every sample with a ViT load needs them (a text-only
    sample has none). ``label_num`` is given for every sample or for none: a sample without it would have no
    label count to weight its loss by.
    """
    records = _ext.load().parse_length_records(data, "vit_num", "token_num", "vit_seqlens", "label_num")
    if records.error:
        where = f"sample {records.error_sample}: " if records.error_sample >= 0 else ""
        # records of a data set (images, conversations) rather than its loads: say what turns one into the other
        hint = (
            " (a length file gives every sample its 'token_num', and 'vit_num' where it has images; "
            "`omnibal-kernels lengths` writes one from a data set's records)"
            if records.error.startswith("'token_num' is missing")
            else ""
        )
        raise ValueError(f"{path}: {where}{records.error}{hint}")
    if records.vit_seqlens is not None:
        bare = np.flatnonzero(~records.vit_seqlens_given & (records.vit > 0))
        if bare.size:  # a text-only sample needs none; a sample with images would be costed as one sequence
            i = int(bare[0])
            raise ValueError(
                f"{path}: sample {i}: no vit_seqlens but a ViT load of {int(records.vit[i])}, while "
                f"other samples have vit_seqlens"
            )
    label = records.label
    if label is not None and label.size and label.min() < 0:  # -1: the sample has no label_num
        missing, given = int(np.flatnonzero(label < 0)[0]), int(np.flatnonzero(label >= 0)[0])
        raise ValueError(
            f"{path}: sample {missing}: 'label_num' is missing, but sample {given} has it (give it "
            f"for every sample or for none)"
        )
    return _JsonRecords(records.vit, records.llm, records.vit_seqlens, records.vit_seqlens_offsets, label)


def _lengths_from_records(path: Path, records: _JsonRecords) -> Lengths:
    """The ``Lengths`` of one JSON length file, with the optional per-sample fields the file holds."""
    optional = {
        name: _frozen(getattr(records, name))
        for name in ("vit_seqlens", "vit_seqlens_offsets", "label")
        if getattr(records, name) is not None
    }
    return Lengths(_frozen(records.vit), _frozen(records.llm), sources=(str(path),), **optional)


def _read_meta(path: Path, data: memoryview) -> Optional[dict]:
    """The OmniBal meta file in ``data`` (a JSON object whose values hold ``token_lengths``), else None; a
    ValueError for a JSON object that is neither a meta file nor one sample."""
    if not bytes(data[:4096]).lstrip().startswith(b"{"):
        return None
    try:
        meta = json.loads(bytes(data))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # JSON Lines (several objects), or malformed: the record scanner names the problem
    is_meta = isinstance(meta, dict) and any(isinstance(v, dict) and "token_lengths" in v for v in meta.values())
    if isinstance(meta, dict) and not is_meta and "token_num" not in meta:
        keys = ", ".join(repr(k) for k in list(meta)[:5]) + (", ..." if len(meta) > 5 else "")
        raise ValueError(
            f'{path}: expected a list of samples ([{{"vit_num": ..., "token_num": ...}}, ...]) or an OmniBal '
            f"meta file (objects holding 'token_lengths'), got a JSON object with keys {keys or 'none'}"
        )
    return meta if is_meta else None


def _meta_parts(path: Path, meta: dict, chain: tuple[Path, ...], allow_empty: bool) -> Lengths:
    """The length files a meta file lists, in order; every entry must name one (none is skipped)."""
    subs = []
    for name, entry in meta.items():
        if not isinstance(entry, dict) or "token_lengths" not in entry:
            raise ValueError(
                f"{path}: entry {name!r} has no 'token_lengths'; every data set of a meta file "
                f"needs its length file (else its samples would be missing from the plan)"
            )
        sub = entry["token_lengths"]
        if not isinstance(sub, str) or not sub:
            raise ValueError(f"{path}: entry {name!r}: 'token_lengths' must be a path string, got {sub!r}")
        subs.append(Path(sub))
    parts = []
    for sub in subs:
        if not sub.is_absolute():
            sub = path.parent / sub
        if sub.resolve() in chain:
            raise ValueError(f"{path}: meta file lists {sub}, which leads back to itself")
        parts.append(_load_one(sub, chain, allow_empty))
    return Lengths.concat(parts)


def _read_arrays(path: Path, suffix: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npy`` (key ``""``) or ``.npz`` file; a ValueError naming the file if it is corrupt."""
    try:
        if suffix == ".npy":
            return {"": np.load(path, allow_pickle=False)}
        archive = np.load(path, allow_pickle=False)
    except _ARCHIVE_ERRORS as exc:
        raise ValueError(f"{path}: not a readable {suffix} file ({exc})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a single array (.npy data), not an .npz archive of arrays")
    with archive as z:
        wanted = [
            k
            for k in ("llm", "token_num", "vit", "vit_num", "vit_seqlens", "vit_seqlens_offsets", "label")
            if k in z.files
        ]
        if not any(k in wanted for k in ("llm", "token_num")):
            raise ValueError(f"{path}: needs an array 'llm' (or 'token_num'), has {z.files}")
        try:
            return {k: z[k] for k in wanted}
        except _ARCHIVE_ERRORS as exc:
            raise ValueError(f"{path}: not a readable .npz file ({exc})") from exc


def _load_array_file(path: Path, suffix: str) -> Lengths:
    arrays = _read_arrays(path, suffix)
    where = str(path)
    if suffix == ".npy":
        arr = arrays[""]
        if arr.ndim == 1:
            llm = _frozen(_as_load_array(arr, "llm", where))
            return Lengths(_frozen(np.zeros_like(llm)), llm, sources=(where,))
        if arr.ndim == 2 and arr.shape[1] == 2:
            return Lengths(
                _frozen(_as_load_array(arr[:, 0], "vit", where)),
                _frozen(_as_load_array(arr[:, 1], "llm", where)),
                sources=(where,),
            )
        raise ValueError(
            f"{path}: expected a 1-D array of tokens or an (N, 2) array of (vit, llm), got shape {arr.shape}"
        )
    llm = _frozen(_as_load_array(arrays.get("llm", arrays.get("token_num")), "llm", where))
    vit_arr = arrays.get("vit", arrays.get("vit_num"))
    vit = _frozen(np.zeros_like(llm) if vit_arr is None else _as_load_array(vit_arr, "vit", where))
    if vit.shape != llm.shape:
        raise ValueError(f"{path}: vit has {vit.shape[0]} samples, llm has {llm.shape[0]}")
    seqlens, offsets = arrays.get("vit_seqlens"), arrays.get("vit_seqlens_offsets")
    if seqlens is not None or offsets is not None:
        seqlens, offsets = _check_vit_seqlens(seqlens, offsets, vit, where)
        seqlens, offsets = _frozen(seqlens), _frozen(offsets)
    label = arrays.get("label")
    if label is not None:
        label = _frozen(_check_label(label, llm, where))
    return Lengths(vit, llm, sources=(where,), vit_seqlens=seqlens, vit_seqlens_offsets=offsets, label=label)


def _load_one(path: Path, _meta_chain: tuple[Path, ...] = (), allow_empty: bool = False) -> Lengths:
    if not path.exists():
        raise FileNotFoundError(f"length file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a length file (give the files in it)")
    suffix = path.suffix.lower()
    if suffix in (".npy", ".npz"):
        lengths = _load_array_file(path, suffix)
    elif suffix in (".json", ".jsonl") or suffix == "":
        data = _utf8_json(path, path.read_bytes())
        meta = _read_meta(path, data) if suffix == ".json" else None
        if meta is not None:
            return _meta_parts(path, meta, (*_meta_chain, path.resolve()), allow_empty)
        lengths = _lengths_from_records(path, _read_records(path, data))
    else:
        raise ValueError(f"{path}: unknown length file type {suffix!r} (use .json, .jsonl, .npy or .npz)")
    if len(lengths) == 0 and not allow_empty:
        raise ValueError(f"{path}: no samples (an empty length file); pass allow_empty=True if that is intended")
    return lengths


def load_lengths(*paths: PathLike, progress: bool | None = None, allow_empty: bool = False) -> Lengths:
    """Reads per-sample loads from one or more files, concatenated in the order given.

    Args:
        *paths: OmniBal JSON lists, OmniBal meta files, ``.jsonl``, ``.npy`` or ``.npz`` files.
        progress: a progress bar over the files on stderr (default: when stderr is a terminal and there is
            more than one file).
        allow_empty: accept files without samples (by default an empty file, ``[]``, or a JSON Lines file of
            blank lines is an error: beside other files it would vanish without a trace).

    Returns:
        A ``Lengths`` with ``vit``/``llm`` (int64, read-only, one entry per sample) and each sample's source.

    Raises:
        ValueError: a negative, non-integer, too large or missing value (naming the file and sample index),
            malformed or non-UTF-8 JSON, a corrupt array file, an empty file, a directory, or an unknown format.
        TypeError: a path that is not a ``str`` or ``os.PathLike``.
        FileNotFoundError: a path does not exist.
    """
    if not paths:
        raise ValueError("load_lengths needs at least one path")
    for i, p in enumerate(paths):
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"load_lengths: path {i} must be a str or os.PathLike, got {type(p).__name__}")
    from .._progress import progress_bar

    if progress is None and len(paths) == 1:
        progress = False  # one file: nothing to count
    bar = progress_bar(total=len(paths), desc="reading length files", enabled=progress)
    parts = []
    try:
        for p in paths:
            parts.append(_load_one(Path(p), allow_empty=bool(allow_empty)))
            bar.update(1)
    finally:
        bar.close()
    return Lengths.concat(parts)


def default_lengths() -> Lengths:
    """The bundled real loads: 70,706 samples of four InternVL-Chat SFT datasets (see ``omnibal_kernels.data``)."""
    from ..data import DEFAULT_LENGTHS_PATH

    with np.load(DEFAULT_LENGTHS_PATH, allow_pickle=False) as z:
        return Lengths(
            _frozen(z["vit"]),
            _frozen(z["llm"]),
            _frozen(z["source"].astype(np.int32)),
            tuple(str(s) for s in z["source_names"]),
        )
