"""The result of a raw-data count (:class:`RawLengths`) and its files: the length file with its report, and
the ``.npz`` part one shard writes for :func:`~omnibal_kernels.raw_lengths.merge_length_parts`."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._files import atomic_write, write_json
from ..lengths import Lengths, write_lengths
from .issues import ISSUE_KINDS

__all__ = ["PART_VERSION", "RawLengths", "load_part", "write_npz"]

PART_VERSION = 2


@dataclasses.dataclass
class RawLengths:
    """Loads of the kept samples of a raw data set (or of one shard of it) and what was found on the way."""

    index: np.ndarray
    """``(K,)`` int64 indices, in the data, of the samples whose loads are given, increasing"""
    vit: np.ndarray
    """``(K,)`` int64 ViT load (InternVL tiles, Qwen2-VL patches)"""
    llm: np.ndarray
    """``(K,)`` int64 LLM tokens (chat-templated text plus image tokens)"""
    start: int
    """first sample index of the counted range"""
    stop: int
    """one past the last sample index of the counted range"""
    num_samples: int
    """samples in the whole data set"""
    issues: list
    """``{"index", "kind", "message", "kept"}`` per problem, in sample order"""
    settings: dict
    """the model settings and options the loads were counted with (``settings["paths"]``: where the data,
    tokenizer and media were on the machine that counted; no part of a run's identity)"""
    shard: tuple[int, int] = (0, 1)
    """``(i, n)``: the ``i``-th of ``n`` shards (``(0, 1)``: the whole data set)"""

    @property
    def loads(self) -> Lengths:
        """The kept samples' loads as a :class:`~omnibal_kernels.Lengths` (for ``write_lengths``)."""
        return Lengths(self.vit, self.llm)

    @property
    def skipped(self) -> np.ndarray:
        """``(S,)`` int64 indices of the samples in the range that have no loads, increasing."""
        mask = np.ones(self.stop - self.start, dtype=bool)
        mask[self.index - self.start] = False
        return np.flatnonzero(mask).astype(np.int64) + self.start

    def counts(self) -> dict[str, int]:
        """Problems per kind (every kind listed, zeros included)."""
        out = {kind: 0 for kind in ISSUE_KINDS}
        for issue in self.issues:
            out[issue["kind"]] = out.get(issue["kind"], 0) + 1
        return out

    def report(self) -> dict:
        """A JSON-ready summary: sample counts, problems per kind, skipped indices and every problem."""
        return {"num_samples": self.num_samples, "start": self.start, "stop": self.stop,
                "kept": int(self.index.shape[0]), "skipped": self.skipped.tolist(), "counts": self.counts(),
                "issues": self.issues, "settings": self.settings}

    def write(self, path: str | Path) -> tuple[Path, Path]:
        """Write the length file (``.json`` OmniBal list or ``.npz``) and ``<stem>.report.json`` next to it,
        each atomically; returns both paths. The length file lists the kept samples in data order; the
        report's ``skipped`` indices say which samples of the data set it leaves out."""
        path = Path(path)
        fmt = path.suffix.lstrip(".").lower()
        if fmt not in ("json", "npz"):
            raise ValueError(f"output: {str(path)!r} needs a .json or .npz suffix")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_lengths(path, self.loads, fmt=fmt)
        report = path.with_name(path.stem + ".report.json")
        write_json(report, self.report())
        return path, report

    def save_part(self, path: str | Path) -> Path:
        """Write this shard as one ``.npz`` part for :func:`merge_length_parts` (atomically)."""
        path = Path(path)
        meta = json.dumps({"version": PART_VERSION, "shard": list(self.shard), "start": self.start,
                           "stop": self.stop, "num_samples": self.num_samples, "issues": self.issues,
                           "settings": self.settings})
        write_npz(path, index=self.index, vit=self.vit, llm=self.llm, meta=np.array(meta))
        return path


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """``numpy.savez`` into ``path``, atomically (its folder is made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        np.savez(f, allow_pickle=False, **arrays)


def _read_part(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {name: np.asarray(z[name]) for name in ("index", "vit", "llm")}
    except Exception as exc:  # zipfile, zlib, numpy and json each raise their own types for a damaged file
        raise ValueError(f"--merge: {path} is damaged or not a part written with --shard "
                         f"({type(exc).__name__}: {exc})") from None
    return meta, arrays


def _check_meta(path: Path, meta: Any) -> None:
    if not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict):
        raise ValueError(f"--merge: {path} is not a part written with --shard (no settings)")
    if meta.get("version") != PART_VERSION:
        raise ValueError(f"--merge: {path} is a part of format version {meta.get('version')!r}, this version reads "
                         f"{PART_VERSION}; count that shard again")
    shard = meta.get("shard")
    ints = [meta.get(k) for k in ("start", "stop", "num_samples")] + (shard if isinstance(shard, list) else [])
    if not (isinstance(shard, list) and len(shard) == 2 and all(isinstance(v, int) for v in ints)
            and isinstance(meta.get("issues"), list)):
        raise ValueError(f"--merge: {path} is damaged (its shard, range or issues are missing)")
    i, n = shard
    start, stop, total = meta["start"], meta["stop"], meta["num_samples"]
    if not (0 <= i < n and (start, stop) == (i * total // n, (i + 1) * total // n)):
        raise ValueError(f"--merge: {path} is damaged (shard {i}/{n} of {total} samples cannot cover "
                         f"samples {start}..{stop - 1})")


def load_part(path: str | Path) -> RawLengths:
    """Read one part written by :meth:`RawLengths.save_part`.

    Raises:
        ValueError: a damaged or truncated file, a file that is not a part, or one of another format version,
            in one line naming the file.
    """
    path = Path(path)
    meta, arrays = _read_part(path)
    _check_meta(path, meta)
    index, vit, llm = arrays["index"], arrays["vit"], arrays["llm"]
    if not all(a.ndim == 1 and a.dtype.kind in "iu" and a.shape == index.shape for a in (index, vit, llm)):
        raise ValueError(f"--merge: {path} is damaged (index, vit and llm are not integer arrays of one length)")
    if index.size and (index[0] < meta["start"] or index[-1] >= meta["stop"] or (np.diff(index) <= 0).any()):
        raise ValueError(f"--merge: {path} is damaged (sample indices outside its range or not increasing)")
    return RawLengths(index=index.astype(np.int64), vit=vit.astype(np.int64), llm=llm.astype(np.int64),
                      start=meta["start"], stop=meta["stop"], num_samples=meta["num_samples"],
                      issues=meta["issues"], settings=meta["settings"], shard=tuple(meta["shard"]))

