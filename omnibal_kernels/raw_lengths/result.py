"""The result of a raw-data count (:class:`RawLengths`) and its files: the length file with its report, and
the ``.npz`` part one shard writes for :func:`~omnibal_kernels.raw_lengths.merge_length_parts`.

A length file holds, per kept sample, ``vit_num``, ``token_num``, its ViT sequences (``vit_seqlens``) and, when
they were counted, its label tokens: ``"label_num"`` in JSON and JSON Lines, array ``label`` in ``.npz``
(beside ``vit``, ``llm``, ``vit_seqlens`` and ``vit_seqlens_offsets``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .._csr import check_offsets, offsets_from_counts, row_ids, row_sums
from .._files import atomic_write, write_json
from ..lengths import Lengths, write_lengths
from .issues import ISSUE_KINDS

__all__ = [
    "PART_VERSION",
    "RawLengths",
    "check_sample_arrays",
    "joined_loads",
    "load_part",
    "sample_arrays",
    "write_npz",
]

# 3: parts carry the ViT sequences and, when counted, the label tokens.
PART_VERSION = 3
# The arrays a part (and a saved chunk) holds per sample, besides the ViT sequences' offsets.
_ARRAYS = ("index", "vit", "llm", "vit_seqlens", "vit_seqlens_offsets")


@dataclasses.dataclass
class RawLengths:
    """Loads of the kept samples of a raw data set (or of one shard of it) and what was found on the way.

    Raises (on construction):
        ValueError: arrays that do not describe the kept samples (naming the sample by its index in the data):
            ViT sequences that are negative or do not sum to the ViT load, label tokens outside
            ``[0, llm - 1]`` (the first token is never a label).
    """

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
    vit_seqlens: Optional[np.ndarray] = None
    """``(S,)`` int64 ViT sequence lengths of the kept samples back to back (one per InternVL tile, one per
    Qwen2-VL image or video frame group), or None when not known"""
    vit_seqlens_offsets: Optional[np.ndarray] = None
    """``(K + 1,)`` int64 from 0: kept sample ``k`` has ``vit_seqlens[offsets[k]:offsets[k + 1]]``"""
    label: Optional[np.ndarray] = None
    """``(K,)`` int64 label tokens of each kept sample: the tokens its chat template marks for training, as the
    causal loss counts them (the first token left out), or None when not counted"""

    def __post_init__(self) -> None:
        check_sample_arrays(self)

    @property
    def loads(self) -> Lengths:
        """The kept samples' loads as a :class:`~omnibal_kernels.Lengths` (for ``write_lengths``); the label
        tokens are :attr:`label` (the files this class writes carry them)."""
        return Lengths(self.vit, self.llm, vit_seqlens=self.vit_seqlens, vit_seqlens_offsets=self.vit_seqlens_offsets)

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
        return {
            "num_samples": self.num_samples,
            "start": self.start,
            "stop": self.stop,
            "kept": int(self.index.shape[0]),
            "skipped": self.skipped.tolist(),
            "counts": self.counts(),
            "issues": self.issues,
            "settings": self.settings,
        }

    def write(self, path: str | Path) -> tuple[Path, Path]:
        """Write the length file (``.json`` OmniBal list, ``.jsonl`` or ``.npz``; see the module docstring for
        the keys) and ``<stem>.report.json`` next to it, each atomically; returns both paths. The length file
        lists the kept samples in data order; the report's ``skipped`` indices say which samples of the data
        set it leaves out."""
        path = Path(path)
        fmt = path.suffix.lstrip(".").lower()
        if fmt not in ("json", "jsonl", "npz"):
            raise ValueError(f"output: {str(path)!r} needs a .json, .jsonl or .npz suffix")
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_length_file(path, fmt, self.loads, self.label)
        report = path.with_name(path.stem + ".report.json")
        write_json(report, self.report())
        return path, report

    def save_part(self, path: str | Path) -> Path:
        """Write this shard as one ``.npz`` part for :func:`merge_length_parts` (atomically)."""
        path = Path(path)
        meta = json.dumps(
            {
                "version": PART_VERSION,
                "shard": list(self.shard),
                "start": self.start,
                "stop": self.stop,
                "num_samples": self.num_samples,
                "issues": self.issues,
                "settings": self.settings,
                "labels": self.label is not None,
            }
        )
        write_npz(path, meta=np.array(meta), **sample_arrays(self))
        return path


def check_sample_arrays(loads: Any) -> None:
    """That the per-sample arrays of a :class:`RawLengths` or a counted chunk agree (see the class); a
    ValueError naming the first bad sample by its index in the data otherwise."""
    index, vit, llm, label = loads.index, loads.vit, loads.llm, loads.label
    k = index.shape[0]
    if not all(a.shape == (k,) for a in (vit, llm)):
        raise ValueError(f"vit and llm must hold one value per kept sample ({k}), got {vit.shape} and {llm.shape}")
    if (loads.vit_seqlens is None) != (loads.vit_seqlens_offsets is None):
        raise ValueError("vit_seqlens and vit_seqlens_offsets come together")
    if loads.vit_seqlens is not None:
        offsets = check_offsets("vit_seqlens_offsets", loads.vit_seqlens_offsets, k, loads.vit_seqlens.shape[0])
        bad = np.flatnonzero(loads.vit_seqlens < 0)
        if bad.size:
            raise ValueError(
                f"sample {int(index[row_ids(offsets)[bad[0]]])}: a negative ViT sequence length "
                f"({int(loads.vit_seqlens[bad[0]])})"
            )
        sums = row_sums(offsets, loads.vit_seqlens)
        bad = np.flatnonzero(sums != vit)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"sample {int(index[i])}: its ViT sequences sum to {int(sums[i])}, but its ViT load is {int(vit[i])}"
            )
    if label is not None:
        if label.shape != (k,):
            raise ValueError(f"label must hold one count per kept sample ({k}), got shape {label.shape}")
        bad = np.flatnonzero((label < 0) | (label > np.maximum(llm - 1, 0)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"sample {int(index[i])}: {int(label[i])} label tokens, outside [0, "
                f"{max(int(llm[i]) - 1, 0)}] for {int(llm[i])} LLM tokens (the first token is never "
                f"a label)"
            )


def sample_arrays(loads: Any) -> dict[str, np.ndarray]:
    """The per-sample arrays of a :class:`RawLengths` or a counted chunk, as saved (``label`` when counted)."""
    arrays = {name: getattr(loads, name) for name in _ARRAYS}
    if loads.label is not None:
        arrays["label"] = loads.label
    return arrays


def _write_length_file(path: Path, fmt: str, loads: Lengths, label: Optional[np.ndarray]) -> None:
    """``write_lengths`` of ``loads``, with ``label`` (when counted) beside them as the module docstring says."""
    if label is None or len(loads) == 0:  # write_lengths refuses a file without samples
        write_lengths(path, loads, fmt=fmt)
        return
    seqlens, offsets = loads.vit_seqlens, loads.vit_seqlens_offsets
    if fmt == "npz":
        arrays = dict(vit=loads.vit.astype(np.int32), llm=loads.llm.astype(np.int32), label=label)
        if seqlens is not None and offsets is not None:
            arrays.update(vit_seqlens=seqlens, vit_seqlens_offsets=offsets)
        write_npz(path, **arrays)
        return
    records = [f'{{"vit_num": {v}, "token_num": {t}' for v, t in zip(loads.vit.tolist(), loads.llm.tolist())]
    if seqlens is not None and offsets is not None:
        bounds, flat = offsets.tolist(), seqlens.tolist()
        records = [f'{r}, "vit_seqlens": {flat[a:b]}' for r, a, b in zip(records, bounds[:-1], bounds[1:])]
    records = [f'{r}, "label_num": {n}}}' for r, n in zip(records, label.tolist())]
    with atomic_write(path, "w") as f:
        f.write("[\n" + ",\n".join(records) + "\n]\n" if fmt == "json" else "".join(r + "\n" for r in records))


def joined_loads(parts: Sequence[Any], labels: bool) -> dict[str, Any]:
    """The per-sample arrays of ``parts`` (counted chunks or :class:`RawLengths` shards, in sample order) one
    after another, as :class:`RawLengths` keywords; ``labels``: whether every part carries label tokens (else
    none does)."""
    empty = np.zeros(0, dtype=np.int64)
    out: dict[str, Any] = {
        name: np.concatenate([getattr(p, name) for p in parts]) if parts else empty
        for name in ("index", "vit", "llm", "vit_seqlens")
    }
    counts = [np.diff(p.vit_seqlens_offsets) for p in parts]
    offsets = offsets_from_counts(np.concatenate(counts) if counts else empty)
    out["vit_seqlens_offsets"] = offsets
    if any((p.label is not None) != labels for p in parts):
        raise ValueError("some parts carry label tokens and others not; count them with one setting")
    out["label"] = np.concatenate([empty] + [p.label for p in parts]) if labels else None
    return out


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """``numpy.savez`` into ``path``, atomically (its folder is made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        np.savez(f, allow_pickle=False, **arrays)


def _read_part(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            version = meta.get("version") if isinstance(meta, dict) else None
            names = _ARRAYS + (("label",) if isinstance(meta, dict) and meta.get("labels") else ())
            arrays = {name: np.asarray(z[name]) for name in names} if version == PART_VERSION else {}
    except Exception as exc:  # zipfile, zlib, numpy and json each raise their own types for a damaged file
        raise ValueError(
            f"--merge: {path} is damaged or not a part written with --shard ({type(exc).__name__}: {exc})"
        ) from None
    return meta, arrays


def _check_meta(path: Path, meta: Any) -> None:
    if not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict):
        raise ValueError(f"--merge: {path} is not a part written with --shard (no settings)")
    if meta.get("version") != PART_VERSION:
        raise ValueError(
            f"--merge: {path} is a part of format version {meta.get('version')!r}, this version reads "
            f"{PART_VERSION} (parts now carry ViT sequences and label tokens); count that shard again"
        )
    shard = meta.get("shard")
    ints = [meta.get(k) for k in ("start", "stop", "num_samples")] + (shard if isinstance(shard, list) else [])
    if not (
        isinstance(shard, list)
        and len(shard) == 2
        and all(isinstance(v, int) for v in ints)
        and isinstance(meta.get("issues"), list)
    ):
        raise ValueError(f"--merge: {path} is damaged (its shard, range or issues are missing)")
    i, n = shard
    start, stop, total = meta["start"], meta["stop"], meta["num_samples"]
    if not (0 <= i < n and (start, stop) == (i * total // n, (i + 1) * total // n)):
        raise ValueError(
            f"--merge: {path} is damaged (shard {i}/{n} of {total} samples cannot cover samples {start}..{stop - 1})"
        )


def load_part(path: str | Path) -> RawLengths:
    """Read one part written by :meth:`RawLengths.save_part`.

    Raises:
        ValueError: a damaged or truncated file, a file that is not a part, or one of another format version,
            in one line naming the file.
    """
    path = Path(path)
    meta, arrays = _read_part(path)
    _check_meta(path, meta)
    index = arrays["index"]
    per_sample = [arrays[k] for k in ("index", "vit", "llm", "label") if k in arrays]
    if not all(a.ndim == 1 and a.dtype.kind in "iu" and a.shape == index.shape for a in per_sample) or not all(
        arrays[k].ndim == 1 and arrays[k].dtype.kind in "iu" for k in ("vit_seqlens", "vit_seqlens_offsets")
    ):
        raise ValueError(f"--merge: {path} is damaged (its per-sample arrays are not integer arrays of one length)")
    if index.size and (index[0] < meta["start"] or index[-1] >= meta["stop"] or (np.diff(index) <= 0).any()):
        raise ValueError(f"--merge: {path} is damaged (sample indices outside its range or not increasing)")
    try:
        return RawLengths(
            start=meta["start"],
            stop=meta["stop"],
            num_samples=meta["num_samples"],
            issues=meta["issues"],
            settings=meta["settings"],
            shard=tuple(meta["shard"]),
            **{k: a.astype(np.int64) for k, a in arrays.items()},
        )
    except ValueError as exc:
        raise ValueError(f"--merge: {path} is damaged ({exc})") from None
