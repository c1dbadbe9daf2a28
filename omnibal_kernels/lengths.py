"""Per-sample loads: every sample's ViT load (image tiles or patches) and LLM load (tokens).

``load_lengths`` reads them (``write_lengths`` writes them) from the formats in use, validates them and returns one columnar ``Lengths``:

* the OmniBal JSON list format: ``[{"vit_num": 5, "token_num": 1420, ...}, ...]``;
* JSON Lines with the same fields, one object per line (``.jsonl``);
* OmniBal's meta file, ``{"name": {"token_lengths": "path/to/list.json", ...}, ...}``, whose paths are
  read in order (relative paths are taken from the meta file's folder);
* ``.npy``: a 1-D array of token counts (text-only data, ViT load 0) or an ``(N, 2)`` array of
  ``(vit, llm)`` rows;
* ``.npz``: arrays ``vit`` and ``llm`` (or ``vit_num`` and ``token_num``); ``llm`` alone means text-only;
  an optional array ``label`` holds each sample's label tokens (see ``Lengths.label``).

Each sample may also carry its ViT sequence lengths, ``vit_seqlens``: one per image, video frame group or tile,
in ViT load units, summing to the sample's ViT load (a text-only sample has none). In ``.npz`` files they are
the arrays ``vit_seqlens`` (flat int64) and ``vit_seqlens_offsets`` (``N + 1`` int64 from 0: sample ``i`` has
``vit_seqlens[offsets[i]:offsets[i + 1]]``); in JSON and JSON Lines the key ``"vit_seqlens": [...]`` of each
sample (without ``vit_num`` a sample's ViT load is their sum), read by the same C++ scan as the loads. Without
them, a cost model takes each sample's whole ViT load as one sequence
(:class:`~omnibal_kernels.balance.CostModel`).

A missing ``vit_num`` means a text-only sample (ViT load 0). A missing ``token_num``, a negative, non-integer
or too large value raises ``ValueError`` naming the file and the sample index. JSON is scanned by the C++
extension in one pass, with no Python object per sample, so inputs of tens of millions of samples load in
seconds. The JSON must be strict (commas between samples, nothing after a list's closing ``]``) and UTF-8
everywhere, ignored fields included (a byte order mark is skipped; errors name the line and column); a file
without samples is an error unless ``allow_empty=True``.

The arrays of a ``Lengths`` are read-only: statistics computed once (and the plans made from them) stay true.
Derive new loads as a new ``Lengths``, e.g. ``Lengths(L.vit, L.llm + 2000, L.source, L.sources)``.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _ext
from ._checks import is_tensor
from ._csr import check_offsets, row_ids, row_sums, take_rows

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Lengths", "load_lengths", "write_lengths", "default_lengths"]

# Loads are stored as int64; one sample's load must stay below 2**31 (the extension packs them as int32).
_MAX_LOAD = 2**31 - 1
# The OmniBal authors round sample lengths up to multiples of 256 tokens for their capacity grid's step.
LLM_BIN = 256


class LoadStats(NamedTuple):
    """Totals and maxima of both loads, and the LLM total with every sample rounded up to ``LLM_BIN`` tokens."""

    vit_sum: int
    llm_sum: int
    vit_max: int
    llm_max: int
    llm_sum_binned: int


@dataclass(frozen=True)
class Lengths:
    """Per-sample loads of a dataset, columnar.

    The arrays are read-only (``L.llm += 1`` raises): ``stats()`` is computed once and plans trust it. Arrays
    given by the caller are copied unless they are read-only already, so editing them later cannot reach a
    ``Lengths`` either. For other loads build a new one: ``Lengths(L.vit, L.llm + 2000, L.source, L.sources)``.

    Attributes:
        vit: (N,) int64 ViT load per sample (tiles or patches; 0 for text-only samples).
        llm: (N,) int64 LLM load per sample (tokens, image tokens included).
        source: (N,) int32 index into ``sources`` of the file each sample came from.
        sources: the files, in the order read.
        vit_seqlens: (S,) int64 ViT sequence lengths of all samples back to back (one per image, video frame
            group or tile, in ViT load units), or None when the loads do not say.
        vit_seqlens_offsets: (N + 1,) int64 from 0: sample ``i``'s sequences are
            ``vit_seqlens[vit_seqlens_offsets[i]:vit_seqlens_offsets[i + 1]]``; they sum to ``vit[i]``
            (none for a text-only sample). Given together with ``vit_seqlens`` or not at all.
        label: None, or (N,) int64 label tokens per sample as a causal LM loss counts them: the positions after
            the sample's first whose label is not ``ignore_index`` (the targets after the shift by one; packing
            masks every sample's first label, so a pack trains exactly the sum of its samples' counts). At most
            ``llm - 1``. With it a sampler knows every optimizer step's label tokens from the plan.
    """

    vit: np.ndarray
    llm: np.ndarray
    source: np.ndarray = field(default=None)  # type: ignore[assignment]
    sources: tuple[str, ...] = ()
    vit_seqlens: Optional[np.ndarray] = None
    vit_seqlens_offsets: Optional[np.ndarray] = None
    label: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        vit = _as_load_array(self.vit, "vit")
        llm = _as_load_array(self.llm, "llm")
        if vit.shape != llm.shape:
            raise ValueError(f"vit and llm must have the same length, got {vit.shape[0]} and {llm.shape[0]}")
        source = self.source
        if source is None:
            source = np.zeros(vit.shape[0], dtype=np.int32)
        source = np.ascontiguousarray(source, dtype=np.int32)
        if source.shape != vit.shape:
            raise ValueError(f"source must have one entry per sample, got {source.shape[0]} for {vit.shape[0]}")
        object.__setattr__(self, "vit", _read_only(vit, self.vit))
        object.__setattr__(self, "llm", _read_only(llm, self.llm))
        object.__setattr__(self, "source", _read_only(source, self.source))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources) or ("<memory>",))
        if self.vit_seqlens is not None or self.vit_seqlens_offsets is not None:
            seqlens, offsets = _check_vit_seqlens(self.vit_seqlens, self.vit_seqlens_offsets, vit)
            object.__setattr__(self, "vit_seqlens", _read_only(seqlens, self.vit_seqlens))
            object.__setattr__(self, "vit_seqlens_offsets", _read_only(offsets, self.vit_seqlens_offsets))
        if self.label is not None:
            object.__setattr__(self, "label", _read_only(_check_label(self.label, llm), self.label))

    def __len__(self) -> int:
        return int(self.vit.shape[0])

    def stats(self) -> LoadStats:
        """Totals and maxima (one pass in C++, computed once per ``Lengths``)."""
        cached = self.__dict__.get("_stats")
        if cached is None:
            s = _ext.load().load_stats(self.vit, self.llm, LLM_BIN)
            cached = LoadStats(s.vit_sum, s.llm_sum, s.vit_max, s.llm_max, s.llm_sum_binned)
            object.__setattr__(self, "_stats", cached)
        return cached

    def __getitem__(self, index: slice | np.ndarray | Sequence[int]) -> "Lengths":
        """A subset of samples (by slice, index array or boolean mask), keeping their sources and ViT sequences."""
        seqlens = offsets = None
        if self.vit_seqlens is not None:
            rows = np.arange(len(self), dtype=np.int64)[index]
            offsets, seqlens = take_rows(self.vit_seqlens_offsets, self.vit_seqlens, np.atleast_1d(rows))
            offsets, seqlens = _frozen(offsets), _frozen(seqlens)
        label = None if self.label is None else _frozen(self.label[index])
        return Lengths(_frozen(self.vit[index]), _frozen(self.llm[index]), _frozen(self.source[index]),
                       self.sources, seqlens, offsets, label)

    @classmethod
    def concat(cls, parts: Iterable["Lengths"]) -> "Lengths":
        """Samples of several ``Lengths`` one after another (sample ids follow that order); ``label`` when every
        part has it."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one Lengths")
        sources: list[str] = []
        source_ids = []
        for part in parts:
            offset = len(sources)
            sources.extend(part.sources)
            source_ids.append(part.source + offset)
        seqlens, offsets = _concat_vit_seqlens(parts)
        return cls(
            _frozen(np.concatenate([p.vit for p in parts])),
            _frozen(np.concatenate([p.llm for p in parts])),
            _frozen(np.concatenate(source_ids)),
            tuple(sources),
            seqlens,
            offsets,
            None if any(p.label is None for p in parts) else _frozen(np.concatenate([p.label for p in parts])),
        )

    def summary(self) -> dict[str, float]:
        """Count, totals and min/mean/max of both loads."""
        out: dict[str, float] = {"samples": len(self)}
        for name, arr in (("vit", self.vit), ("llm", self.llm)):
            out[f"{name}_total"] = int(arr.sum()) if len(arr) else 0
            out[f"{name}_min"] = int(arr.min()) if len(arr) else 0
            out[f"{name}_mean"] = float(arr.mean()) if len(arr) else 0.0
            out[f"{name}_max"] = int(arr.max()) if len(arr) else 0
        return out


def _check_label(label: object, llm: np.ndarray, where: str = "") -> np.ndarray:
    """``label`` as loads (:func:`_as_load_array`), one per sample and at most ``llm - 1`` each (the first token
    of a sample is never a target)."""
    label = _as_load_array(label, "label", where)
    prefix = f"{where}: " if where else ""
    if label.shape != llm.shape:
        raise ValueError(f"{prefix}label must have one entry per sample, got {label.shape[0]} for {llm.shape[0]}")
    bad = np.flatnonzero(label > np.maximum(llm - 1, 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{prefix}sample {i}: label is {int(label[i])} but llm is {int(llm[i])}; a sample has at "
                         "most llm - 1 label tokens (its first token is never a target)")
    return label


def _concat_vit_seqlens(parts: Sequence[Lengths]) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """The ViT sequences of ``parts`` one after another: None when no part has them; a part without them
    joins with none per sample only if it is text-only (else a ValueError naming it: its images are unknown)."""
    if all(p.vit_seqlens is None for p in parts):
        return None, None
    flat, counts = [], []
    for part in parts:
        if part.vit_seqlens is not None:
            flat.append(part.vit_seqlens)
            counts.append(np.diff(part.vit_seqlens_offsets))
        elif not part.vit.any():
            counts.append(np.zeros(len(part), dtype=np.int64))
        else:
            raise ValueError(f"{', '.join(part.sources)}: has no vit_seqlens but ViT loads, while other parts have "
                             f"vit_seqlens; give every part with images its ViT sequence lengths")
    offsets = np.zeros(sum(c.shape[0] for c in counts) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(counts), out=offsets[1:])
    return _frozen(np.concatenate(flat).astype(np.int64, copy=False)), _frozen(offsets)


def _check_vit_seqlens(seqlens: object, offsets: object, vit: np.ndarray, where: str = "") -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """``(seqlens, offsets)`` as int64 CSR rows of ``vit``'s samples, each row non-negative and summing to the
    sample's ViT load; else a ValueError naming ``where`` and the first bad sample."""
    prefix = f"{where}: " if where else ""
    if seqlens is None or offsets is None:
        missing = "vit_seqlens_offsets" if offsets is None else "vit_seqlens"
        raise ValueError(f"{prefix}vit_seqlens and vit_seqlens_offsets come together; {missing} is missing")
    values = np.asarray(seqlens.detach().cpu().numpy() if is_tensor(seqlens) else seqlens)
    if values.size == 0:
        values = values.reshape(0).astype(np.int64)
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise ValueError(f"{prefix}vit_seqlens must be a 1-D integer array, got dtype {values.dtype}, "
                         f"shape {values.shape}")
    offsets = check_offsets("vit_seqlens_offsets", offsets, vit.shape[0], values.shape[0], where)
    bad = np.flatnonzero((values < 0) | (values > _MAX_LOAD))
    if bad.size:
        j = int(bad[0])
        kind = "negative" if values[j] < 0 else "too large (>= 2**31)"
        raise ValueError(f"{prefix}sample {int(row_ids(offsets)[j])}: vit_seqlens holds a {kind} length "
                         f"({int(values[j])})")
    values = np.ascontiguousarray(values, dtype=np.int64)
    sums = row_sums(offsets, values)
    bad = np.flatnonzero(sums != vit)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{prefix}sample {i}: vit_seqlens sum to {int(sums[i])}, but its ViT load is {int(vit[i])}")
    return values, offsets


def _writeable_anywhere(arr: np.ndarray) -> bool:
    """Whether ``arr`` or an array it views can still be written through."""
    while isinstance(arr, np.ndarray):
        if arr.flags.writeable:
            return True
        arr = arr.base
    return False


def _frozen(arr: np.ndarray) -> np.ndarray:
    """An array just made here, read-only (so ``Lengths`` keeps it without a copy)."""
    arr.flags.writeable = False
    return arr


def _read_only(arr: np.ndarray, given: object) -> np.ndarray:
    """``arr`` made read-only; copied first if it shares memory with a writeable array the caller gave."""
    if isinstance(given, np.ndarray) and np.may_share_memory(arr, given) and _writeable_anywhere(given):
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def _as_load_array(values: object, name: str, where: str = "") -> np.ndarray:
    """``values`` as a 1-D int64 array of loads in ``[0, 2**31)``; else a ValueError naming ``where`` and the
    first bad sample. The writer of length files uses the same check, so what is written can be read."""
    arr = np.asarray(values)
    prefix = f"{where}: " if where else ""
    if arr.ndim != 1:
        raise ValueError(f"{prefix}{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"{prefix}sample {int(bad[0])}: {name} is not an integer ({arr[bad[0]]!r})")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"{prefix}{name} must hold integers, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind != "b":
        # Compared in the input's own dtype: a cast first would wrap uint64 >= 2**63 and 1e30 to negatives.
        bad = np.flatnonzero((arr < 0) | (arr > _MAX_LOAD))
        if bad.size:
            i = int(bad[0])
            kind = "negative" if arr[i] < 0 else "too large (>= 2**31)"
            value = int(arr[i]) if arr.dtype.kind != "f" else float(arr[i])
            raise ValueError(f"{prefix}sample {i}: {name} is {kind} ({value})")
    return np.ascontiguousarray(arr, dtype=np.int64)


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
        return memoryview(data)[len(_UTF8_BOM):]
    for bom, encoding, order in _OTHER_BOMS:
        if data.startswith(bom):
            raise ValueError(f"{path}: the file is {encoding} ({order}) encoded; length files must be UTF-8 "
                             f"(convert it, e.g. iconv -f {encoding} -t UTF-8)")
    # Without a mark, UTF-16/32 JSON shows NUL bytes between its ASCII characters.
    if b"\x00" in data[:64]:
        raise ValueError(f"{path}: the file holds NUL bytes (UTF-16 or UTF-32 encoded, or not text); length "
                         f"files must be UTF-8 JSON")
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
        raise ValueError(f"{path}: {where}{records.error}")
    if records.vit_seqlens is not None:
        bare = np.flatnonzero(~records.vit_seqlens_given & (records.vit > 0))
        if bare.size:  # a text-only sample needs none; a sample with images would be costed as one sequence
            i = int(bare[0])
            raise ValueError(f"{path}: sample {i}: no vit_seqlens but a ViT load of {int(records.vit[i])}, while "
                             f"other samples have vit_seqlens")
    label = records.label
    if label is not None and label.size and label.min() < 0:  # -1: the sample has no label_num
        missing, given = int(np.flatnonzero(label < 0)[0]), int(np.flatnonzero(label >= 0)[0])
        raise ValueError(f"{path}: sample {missing}: 'label_num' is missing, but sample {given} has it (give it "
                         f"for every sample or for none)")
    return _JsonRecords(records.vit, records.llm, records.vit_seqlens, records.vit_seqlens_offsets, label)


def _lengths_from_records(path: Path, records: _JsonRecords) -> Lengths:
    """The ``Lengths`` of one JSON length file, with the optional per-sample fields the file holds."""
    optional = {name: _frozen(getattr(records, name)) for name in ("vit_seqlens", "vit_seqlens_offsets", "label")
                if getattr(records, name) is not None}
    return Lengths(_frozen(records.vit), _frozen(records.llm), sources=(str(path),), **optional)


def _read_meta(path: Path, data: memoryview) -> Optional[dict]:
    """The OmniBal meta file in ``data`` (a JSON object whose values hold ``token_lengths``), else None."""
    if not bytes(data[:4096]).lstrip().startswith(b"{"):
        return None
    try:
        meta = json.loads(bytes(data))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # JSON Lines (several objects), or malformed: the record scanner names the problem
    is_meta = isinstance(meta, dict) and any(isinstance(v, dict) and "token_lengths" in v for v in meta.values())
    return meta if is_meta else None


def _meta_parts(path: Path, meta: dict, chain: tuple[Path, ...], allow_empty: bool) -> Lengths:
    """The length files a meta file lists, in order; every entry must name one (none is skipped)."""
    subs = []
    for name, entry in meta.items():
        if not isinstance(entry, dict) or "token_lengths" not in entry:
            raise ValueError(f"{path}: entry {name!r} has no 'token_lengths'; every data set of a meta file "
                             f"needs its length file (else its samples would be missing from the plan)")
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
        wanted = [k for k in ("llm", "token_num", "vit", "vit_num", "vit_seqlens", "vit_seqlens_offsets", "label")
                  if k in z.files]
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
            return Lengths(_frozen(_as_load_array(arr[:, 0], "vit", where)),
                           _frozen(_as_load_array(arr[:, 1], "llm", where)), sources=(where,))
        raise ValueError(f"{path}: expected a 1-D array of tokens or an (N, 2) array of (vit, llm), "
                         f"got shape {arr.shape}")
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
    from ._progress import progress_bar

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
    from .data import DEFAULT_LENGTHS_PATH

    with np.load(DEFAULT_LENGTHS_PATH, allow_pickle=False) as z:
        return Lengths(_frozen(z["vit"]), _frozen(z["llm"]), _frozen(z["source"].astype(np.int32)),
                       tuple(str(s) for s in z["source_names"]))


def write_lengths(path: PathLike, loads: Union[Lengths, Mapping[str, Any], tuple], *, fmt: Optional[str] = None,
                  allow_empty: bool = False) -> Path:
    """Writes per-sample loads as a length file, atomically (a temporary file renamed into place).

    Args:
        path: ``.json`` for the OmniBal format (a list of ``{"vit_num": int, "token_num": int}``, one per
            sample), ``.jsonl`` for the same objects one per line, or ``.npz`` for int32 arrays ``vit`` and
            ``llm``. ViT sequence lengths and label counts, when the loads have them, go along:
            ``"vit_seqlens": [...]`` and ``"label_num"`` in every JSON object, arrays ``vit_seqlens``,
            ``vit_seqlens_offsets`` (int64) and ``label`` (int32) in ``.npz``.
        loads: :class:`Lengths` (what :func:`~omnibal_kernels.vision.compute_loads` returns), a mapping with
            ``vit`` and ``llm`` ``(N,)`` (and optionally ``vit_seqlens`` with ``vit_seqlens_offsets``, and
            ``label``), or a
            ``(vit, llm)`` tuple (arrays, lists or tensors).
        fmt: ``"json"``, ``"jsonl"`` or ``"npz"`` to override the suffix.
        allow_empty: write a file without samples (``load_lengths`` reads it only with ``allow_empty=True``).

    Returns:
        The path written.

    Raises:
        ValueError: values ``load_lengths`` would refuse (negative, non-integer, ``>= 2**31``, no samples, ViT
            sequences that do not sum to the ViT load), naming the sample; an unknown format. Every file written
            here loads with ``load_lengths``, ViT sequences included.
    """
    from ._files import atomic_write

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ("json", "jsonl", "npz"):
        raise ValueError(f"cannot tell the length file format of {str(path)!r}: use a .json, .jsonl or .npz suffix "
                         f"or fmt=")
    where = f"writing {path}"
    vit, llm, seqlens, offsets, label = _loads_to_write(loads, where)
    if vit.size == 0 and not allow_empty:
        raise ValueError(f"{where}: no samples; load_lengths refuses empty files unless allow_empty=True "
                         f"(pass allow_empty=True here too if that is intended)")
    if fmt == "npz":
        arrays = dict(vit=vit.astype(np.int32), llm=llm.astype(np.int32))  # < 2**31: checked above
        if seqlens is not None:
            arrays.update(vit_seqlens=seqlens, vit_seqlens_offsets=offsets)
        if label is not None:
            arrays.update(label=label.astype(np.int32))
        with atomic_write(path) as f:
            np.savez(f, **arrays)
        return path
    records = [f'{{"vit_num": {v}, "token_num": {t}' for v, t in zip(vit.tolist(), llm.tolist())]
    if seqlens is not None:
        bounds = offsets.tolist()
        flat = seqlens.tolist()
        records = [f'{r}, "vit_seqlens": {flat[a:b]}' for r, a, b in zip(records, bounds[:-1], bounds[1:])]
    if label is not None:
        records = [f'{r}, "label_num": {n}' for r, n in zip(records, label.tolist())]
    with atomic_write(path, "w") as f:
        if fmt == "json":
            # One sample per line: the OmniBal list format, readable and diffable.
            f.write("[\n" + ",\n".join(r + "}" for r in records) + "\n]\n")
        else:
            f.write("".join(r + "}\n" for r in records))
    return path


def _loads_to_write(loads: Union[Lengths, Mapping[str, Any], tuple], where: str) -> tuple[
        np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]:
    """``write_lengths``' loads as checked ``(vit, llm, vit_seqlens, vit_seqlens_offsets, label)`` arrays."""
    seqlens = offsets = label = None
    if isinstance(loads, Lengths):
        vit, llm = loads.vit, loads.llm
        seqlens, offsets, label = loads.vit_seqlens, loads.vit_seqlens_offsets, loads.label
    elif isinstance(loads, tuple):
        vit, llm = loads
    else:
        vit, llm = loads["vit"], loads["llm"]
        seqlens, offsets, label = loads.get("vit_seqlens"), loads.get("vit_seqlens_offsets"), loads.get("label")
    vit, llm, offsets, label = (x.detach().cpu().numpy() if is_tensor(x) else x for x in (vit, llm, offsets, label))
    vit = _as_load_array(vit, "vit", where)
    llm = _as_load_array(llm, "llm", where)
    if vit.shape != llm.shape:
        raise ValueError(f"{where}: vit has {vit.shape[0]} samples but llm has {llm.shape[0]}")
    if seqlens is not None or offsets is not None:
        seqlens, offsets = _check_vit_seqlens(seqlens, offsets, vit, where)
    if label is not None:
        label = _check_label(label, llm, where)
    return vit, llm, seqlens, offsets, label
