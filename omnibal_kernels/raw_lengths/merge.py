"""Join the parts of one run's shards (``--shard i/n``) into the whole data set's :class:`RawLengths`.

Parts may come in any order (they are sorted by shard index; empty shards included) and from any machine:
two parts belong to one run when their settings are equal, ``settings["paths"]`` aside (where the data,
tokenizer and media were), and the data are identified by a digest of their content.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .result import RawLengths, joined_loads, load_part

__all__ = ["merge_length_parts"]

# Where the counting machine kept its files: no part of a run's identity.
_LOCATION = "paths"


def _flat(settings: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``{"options.max_length": 8192, ...}``."""
    if not isinstance(settings, dict):
        return {prefix: settings}
    out: dict[str, Any] = {}
    for key, value in settings.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _differences(a: dict, b: dict) -> list[str]:
    fa = _flat({k: v for k, v in a.items() if k != _LOCATION})
    fb = _flat({k: v for k, v in b.items() if k != _LOCATION})
    missing = object()
    return [key for key in sorted(set(fa) | set(fb)) if fa.get(key, missing) != fb.get(key, missing)]


def _check_one_run(parts: list[tuple[Path, RawLengths]]) -> None:
    (first_path, first), *rest = parts
    for path, part in rest:
        keys = _differences(first.settings, part.settings)
        if keys:
            fa, fb = _flat(first.settings), _flat(part.settings)
            shown = "; ".join(
                f"{k}: {fb.get(k)!r} in {path.name}, {fa.get(k)!r} in {first_path.name}" for k in keys[:3]
            )
            more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
            raise ValueError(f"--merge: {path} is a part of another run than {first_path}: {shown}{more}")


def merge_length_parts(paths: Iterable[str | Path]) -> RawLengths:
    """Join the parts written by ``save_part`` for shards ``0 .. n-1`` of one run, in sample order.

    Args:
        paths: the ``n`` part files, in any order.

    Raises:
        ValueError: a damaged file or one that is not a part (one line naming it), parts of different runs
            (naming the first settings that differ), a shard missing or given twice.
    """
    parts = [(Path(p), load_part(p)) for p in paths]
    if not parts:
        raise ValueError("--merge: no parts given")
    _check_one_run(parts)
    n = parts[0][1].shard[1]
    by_shard: dict[int, Path] = {}
    for path, part in parts:
        i = part.shard[0]
        if part.shard[1] != n:
            raise ValueError(f"--merge: {path} is shard {i}/{part.shard[1]}, {parts[0][0]} one of {n}")
        if i in by_shard:
            raise ValueError(
                f"--merge: shard {i}/{n} is given twice ({by_shard[i]} and {path}); expected each of "
                f"shards 0..{n - 1} once"
            )
        if part.num_samples != parts[0][1].num_samples:
            raise ValueError(
                f"--merge: {path} covers {part.num_samples} samples, {parts[0][0]} {parts[0][1].num_samples}"
            )
        by_shard[i] = path
    missing = sorted(set(range(n)) - set(by_shard))
    if missing:
        shown = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise ValueError(f"--merge: the run has {n} shards but {len(parts)} parts were given (missing: {shown})")
    ordered = [part for _, part in sorted(parts, key=lambda t: t[1].shard[0])]
    total = ordered[0].num_samples
    return RawLengths(
        start=0,
        stop=total,
        num_samples=total,
        issues=[d for p in ordered for d in p.issues],
        settings=ordered[0].settings,
        shard=(0, 1),
        **joined_loads(ordered, ordered[0].label is not None),
    )
