"""The ``Lengths`` table: every sample's ViT and LLM loads, with its optional ViT sequence lengths, label
counts and sources, checked once and read-only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, cast

import numpy as np

from .. import _ext
from .._checks import is_tensor
from .._csr import check_offsets, offsets_from_counts, row_ids, row_sums, take_rows

__all__ = ["LLM_BIN", "Lengths", "LoadStats"]

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
    source: np.ndarray = field(default=None)  # type: ignore[arg-type]  # None: __post_init__ makes it zeros
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

    def vit_square_sums(self) -> Optional[np.ndarray]:
        """``(N,)`` float64 ``sum_j s_j**2`` over every sample's ViT sequences, the squares added in order
        (read-only, computed once per ``Lengths``: what a cost model's quadratic ViT term reads); None when the
        loads have no ViT sequences."""
        if self.vit_seqlens is None:
            return None
        cached = self.__dict__.get("_vit_square_sums")
        if cached is None:
            offsets = cast(np.ndarray, self.vit_seqlens_offsets)  # set with vit_seqlens
            cached = _frozen(_ext.load().row_square_sums(offsets, self.vit_seqlens))
            object.__setattr__(self, "_vit_square_sums", cached)
        return cached

    def __getitem__(self, index: slice | np.ndarray | Sequence[int]) -> Lengths:
        """A subset of samples (by slice, index array or boolean mask), keeping their sources and ViT sequences."""
        seqlens = offsets = None
        if self.vit_seqlens is not None:
            rows = np.arange(len(self), dtype=np.int64)[index]
            # __post_init__ keeps vit_seqlens and vit_seqlens_offsets both set or both None
            offsets, seqlens = take_rows(
                cast(np.ndarray, self.vit_seqlens_offsets), self.vit_seqlens, np.atleast_1d(rows)
            )
            offsets, seqlens = _frozen(offsets), _frozen(seqlens)
        label = None if self.label is None else _frozen(self.label[index])
        return Lengths(
            _frozen(self.vit[index]),
            _frozen(self.llm[index]),
            _frozen(self.source[index]),
            self.sources,
            seqlens,
            offsets,
            label,
        )

    @classmethod
    def concat(cls, parts: Iterable[Lengths]) -> Lengths:
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
        raise ValueError(
            f"{prefix}sample {i}: label is {int(label[i])} but llm is {int(llm[i])}; a sample has at "
            "most llm - 1 label tokens (its first token is never a target)"
        )
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
            counts.append(np.diff(cast(np.ndarray, part.vit_seqlens_offsets)))  # set with vit_seqlens
        elif not part.vit.any():
            counts.append(np.zeros(len(part), dtype=np.int64))
        else:
            raise ValueError(
                f"{', '.join(part.sources)}: has no vit_seqlens but ViT loads, while other parts have "
                f"vit_seqlens; give every part with images its ViT sequence lengths"
            )
    offsets = offsets_from_counts(np.concatenate(counts))
    return _frozen(np.concatenate(flat).astype(np.int64, copy=False)), _frozen(offsets)


def _check_vit_seqlens(
    seqlens: object, offsets: object, vit: np.ndarray, where: str = ""
) -> tuple[np.ndarray, np.ndarray]:
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
        raise ValueError(
            f"{prefix}vit_seqlens must be a 1-D integer array, got dtype {values.dtype}, shape {values.shape}"
        )
    offsets = check_offsets("vit_seqlens_offsets", offsets, vit.shape[0], values.shape[0], where)
    bad = np.flatnonzero((values < 0) | (values > _MAX_LOAD))
    if bad.size:
        j = int(bad[0])
        kind = "negative" if values[j] < 0 else "too large (>= 2**31)"
        raise ValueError(
            f"{prefix}sample {int(row_ids(offsets)[j])}: vit_seqlens holds a {kind} length ({int(values[j])})"
        )
    values = np.ascontiguousarray(values, dtype=np.int64)
    sums = row_sums(offsets, values)
    bad = np.flatnonzero(sums != vit)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{prefix}sample {i}: vit_seqlens sum to {int(sums[i])}, but its ViT load is {int(vit[i])}")
    return values, offsets


def _writeable_anywhere(arr: Optional[np.ndarray]) -> bool:
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
