"""Per-sample loads: every sample's ViT load (image tiles or patches) and LLM load (tokens).

``load_lengths`` reads them (``write_lengths`` writes them) from the formats in use, validates them and returns one columnar ``Lengths``:

* the OmniBal JSON list format: ``[{"vit_num": 5, "token_num": 1420, ...}, ...]``;
* JSON Lines with the same fields, one object per line (``.jsonl``);
* OmniBal's meta file, ``{"name": {"token_lengths": "path/to/list.json", ...}, ...}``, whose paths are
  read in order (relative paths are taken from the meta file's folder);
* ``.npy``: a 1-D array of token counts (text-only data, ViT load 0) or an ``(N, 2)`` array of
  ``(vit, llm)`` rows;
* ``.npz``: arrays ``vit`` and ``llm`` (or ``vit_num`` and ``token_num``); ``llm`` alone means text-only.

A missing ``vit_num`` means a text-only sample (ViT load 0). A missing ``token_num``, a negative, non-integer
or too large value raises ``ValueError`` naming the file and the sample index. JSON is scanned by the C++
extension in one pass, with no Python object per sample, so inputs of tens of millions of samples load in
seconds.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _ext
from ._checks import as_int_array

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

    Attributes:
        vit: (N,) int64 ViT load per sample (tiles or patches; 0 for text-only samples).
        llm: (N,) int64 LLM load per sample (tokens, image tokens included).
        source: (N,) int32 index into ``sources`` of the file each sample came from.
        sources: the files, in the order read.
    """

    vit: np.ndarray
    llm: np.ndarray
    source: np.ndarray = field(default=None)  # type: ignore[assignment]
    sources: tuple[str, ...] = ()

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
        object.__setattr__(self, "vit", vit)
        object.__setattr__(self, "llm", llm)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources) or ("<memory>",))

    def __len__(self) -> int:
        return int(self.vit.shape[0])

    def stats(self) -> LoadStats:
        """Totals and maxima (one pass in C++, computed once per ``Lengths``)."""
        cached = self.__dict__.get("_stats")
        if cached is None:
            cached = LoadStats(*_ext.load().load_stats(self.vit, self.llm, LLM_BIN))
            object.__setattr__(self, "_stats", cached)
        return cached

    def __getitem__(self, index: slice | np.ndarray | Sequence[int]) -> "Lengths":
        """A subset of samples (by slice, index array or boolean mask), keeping their sources."""
        return Lengths(self.vit[index], self.llm[index], self.source[index], self.sources)

    @classmethod
    def concat(cls, parts: Iterable["Lengths"]) -> "Lengths":
        """Samples of several ``Lengths`` one after another (sample ids follow that order)."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one Lengths")
        sources: list[str] = []
        source_ids = []
        for part in parts:
            offset = len(sources)
            sources.extend(part.sources)
            source_ids.append(part.source + offset)
        return cls(
            np.concatenate([p.vit for p in parts]),
            np.concatenate([p.llm for p in parts]),
            np.concatenate(source_ids),
            tuple(sources),
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


def _as_load_array(values: object, name: str, where: str = "") -> np.ndarray:
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
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size:
        bad = np.flatnonzero((arr < 0) | (arr > _MAX_LOAD))
        if bad.size:
            i = int(bad[0])
            kind = "negative" if arr[i] < 0 else "too large (>= 2**31)"
            raise ValueError(f"{prefix}sample {i}: {name} is {kind} ({int(arr[i])})")
    return arr


def _read_records(path: Path) -> tuple[np.ndarray, np.ndarray]:
    data = path.read_bytes()
    vit, llm, error, sample = _ext.load().parse_length_records(data, "vit_num", "token_num")
    if error:
        where = f"sample {sample}: " if sample >= 0 else ""
        raise ValueError(f"{path}: {where}{error}")
    return vit, llm


def _read_meta(path: Path) -> Optional[dict]:
    """The OmniBal meta file at ``path`` (a JSON object whose values hold ``token_lengths``), else None."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"{"):
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # JSON Lines: several objects
    is_meta = isinstance(meta, dict) and any(isinstance(v, dict) and "token_lengths" in v for v in meta.values())
    return meta if is_meta else None


def _load_one(path: Path, _meta_chain: tuple[Path, ...] = ()) -> Lengths:
    if not path.exists():
        raise FileNotFoundError(f"length file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.ndim == 1:
            llm = _as_load_array(arr, "llm", str(path))
            return Lengths(np.zeros_like(llm), llm, sources=(str(path),))
        if arr.ndim == 2 and arr.shape[1] == 2:
            return Lengths(
                _as_load_array(arr[:, 0], "vit", str(path)),
                _as_load_array(arr[:, 1], "llm", str(path)),
                sources=(str(path),),
            )
        raise ValueError(f"{path}: expected a 1-D array of tokens or an (N, 2) array of (vit, llm), got {arr.shape}")
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            llm_key = next((k for k in ("llm", "token_num") if k in z.files), None)
            vit_key = next((k for k in ("vit", "vit_num") if k in z.files), None)
            if llm_key is None:
                raise ValueError(f"{path}: needs an array 'llm' (or 'token_num'), has {z.files}")
            llm = _as_load_array(z[llm_key], "llm", str(path))
            vit = _as_load_array(z[vit_key], "vit", str(path)) if vit_key else np.zeros_like(llm)
        if vit.shape != llm.shape:
            raise ValueError(f"{path}: vit has {vit.shape[0]} samples, llm has {llm.shape[0]}")
        return Lengths(vit, llm, sources=(str(path),))
    if suffix in (".json", ".jsonl") or suffix == "":
        meta = _read_meta(path) if suffix == ".json" else None
        if meta is not None:
            parts = []  # _read_meta only returns files that list at least one path
            for entry in meta.values():
                if not isinstance(entry, dict) or "token_lengths" not in entry:
                    continue
                sub = Path(entry["token_lengths"])
                if not sub.is_absolute():
                    sub = path.parent / sub
                chain = (*_meta_chain, path.resolve())
                if sub.resolve() in chain:
                    raise ValueError(f"{path}: meta file lists {sub}, which leads back to itself")
                parts.append(_load_one(sub, chain))
            return Lengths.concat(parts)
        vit, llm = _read_records(path)
        return Lengths(vit, llm, sources=(str(path),))
    raise ValueError(f"{path}: unknown length file type {suffix!r} (use .json, .jsonl, .npy or .npz)")


def load_lengths(*paths: PathLike, progress: bool | None = None) -> Lengths:
    """Reads per-sample loads from one or more files, concatenated in the order given.

    Args:
        *paths: OmniBal JSON lists, OmniBal meta files, ``.jsonl``, ``.npy`` or ``.npz`` files.
        progress: a progress bar over the files on stderr (default: when stderr is a terminal and there is
            more than one file).

    Returns:
        A ``Lengths`` with ``vit``/``llm`` (int64, one entry per sample) and each sample's source file.

    Raises:
        ValueError: a negative, non-integer, too large or missing value (naming the file and sample index),
            or an unknown format.
        FileNotFoundError: a path does not exist.
    """
    if not paths:
        raise ValueError("load_lengths needs at least one path")
    from ._progress import progress_bar

    if progress is None and len(paths) == 1:
        progress = False  # one file: nothing to count
    bar = progress_bar(total=len(paths), desc="reading length files", enabled=progress)
    parts = []
    try:
        for p in paths:
            parts.append(_load_one(Path(p)))
            bar.update(1)
    finally:
        bar.close()
    return Lengths.concat(parts)


def default_lengths() -> Lengths:
    """The bundled real loads: 70,706 samples of four InternVL-Chat SFT datasets (see ``omnibal_kernels.data``)."""
    from .data import DEFAULT_LENGTHS_PATH

    with np.load(DEFAULT_LENGTHS_PATH, allow_pickle=False) as z:
        return Lengths(z["vit"], z["llm"], z["source"].astype(np.int32), tuple(str(s) for s in z["source_names"]))


def write_lengths(path: PathLike, loads: Union[Lengths, Mapping[str, Any], tuple], *,
                  fmt: Optional[str] = None) -> Path:
    """Write per-sample loads as a length file.

    Args:
        path: ``.json`` for the OmniBal format (a list of ``{"vit_num": int, "token_num": int}``, one per
            sample) or ``.npz`` for arrays ``vit`` and ``llm`` (int32 when they fit, else int64).
        loads: :class:`Lengths` (what :func:`~omnibal_kernels.vision.compute_loads` returns), a mapping with
            ``vit`` and ``llm`` ``(N,)``, or a ``(vit, llm)`` tuple.
        fmt: ``"json"`` or ``"npz"`` to override the suffix.

    Returns:
        The path written.
    """
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower()
    if fmt not in ("json", "npz"):
        raise ValueError(f"cannot tell the length file format of {str(path)!r}: use a .json or .npz suffix or fmt=")
    if isinstance(loads, Lengths):
        vit, llm = loads.vit, loads.llm
    else:
        vit = as_int_array(loads[0] if isinstance(loads, tuple) else loads["vit"], "vit")
        llm = as_int_array(loads[1] if isinstance(loads, tuple) else loads["llm"], "llm")
    if vit.shape != llm.shape:
        raise ValueError(f"vit has {vit.shape[0]} samples but llm has {llm.shape[0]}")
    if fmt == "json":
        records = [{"vit_num": int(v), "token_num": int(t)} for v, t in zip(vit.tolist(), llm.tolist())]
        with open(path, "w") as f:
            json.dump(records, f)
    else:
        big = max(int(vit.max(initial=0)), int(llm.max(initial=0))) >= 2**31
        dtype = np.int64 if big else np.int32
        with open(path, "wb") as f:
            np.savez(f, vit=vit.astype(dtype), llm=llm.astype(dtype))
    return path
