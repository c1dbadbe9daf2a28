"""Writing length files (``.json``, ``.jsonl``, ``.npz``) atomically, in the formats ``load_lengths`` reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union, cast

import numpy as np

from .._checks import is_tensor
from .table import Lengths, _as_load_array, _check_label, _check_vit_seqlens

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["write_lengths"]


def write_lengths(
    path: PathLike,
    loads: Union[Lengths, Mapping[str, Any], tuple],
    *,
    fmt: Optional[str] = None,
    allow_empty: bool = False,
) -> Path:
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
    from .._files import atomic_write

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ("json", "jsonl", "npz"):
        raise ValueError(
            f"cannot tell the length file format of {str(path)!r}: use a .json, .jsonl or .npz suffix or fmt="
        )
    where = f"writing {path}"
    vit, llm, seqlens, offsets, label = _loads_to_write(loads, where)
    if vit.size == 0 and not allow_empty:
        raise ValueError(
            f"{where}: no samples; load_lengths refuses empty files unless allow_empty=True "
            f"(pass allow_empty=True here too if that is intended)"
        )
    if fmt == "npz":
        arrays: dict[str, Any] = dict(vit=vit.astype(np.int32), llm=llm.astype(np.int32))  # < 2**31: checked above
        if seqlens is not None:
            arrays.update(vit_seqlens=seqlens, vit_seqlens_offsets=offsets)
        if label is not None:
            arrays.update(label=label.astype(np.int32))
        with atomic_write(path) as f:
            np.savez(f, **arrays)
        return path
    records = [f'{{"vit_num": {v}, "token_num": {t}' for v, t in zip(vit.tolist(), llm.tolist())]
    if seqlens is not None:
        bounds = cast(np.ndarray, offsets).tolist()  # set with seqlens
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


def _loads_to_write(
    loads: Union[Lengths, Mapping[str, Any], tuple], where: str
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]:
    """``write_lengths``' loads as checked ``(vit, llm, vit_seqlens, vit_seqlens_offsets, label)`` arrays."""
    seqlens = offsets = label = None
    vit: Any
    llm: Any
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
