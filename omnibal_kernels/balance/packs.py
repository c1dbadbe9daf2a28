"""What a plan is: packs of samples and their (step, rank) schedule, and the planning errors.

Nothing here plans; :mod:`omnibal_kernels.balance.engine` builds plans for given capacities and
:func:`omnibal_kernels.balance.plan.plan_packs` is the public entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional, Union

import numpy as np

from ..context_parallel.cost import ContextParallelCost
from ..context_parallel.options import ContextParallelOptions
from ..lengths import Lengths

__all__ = ["Plan", "OversizeError", "TooFewPacksError", "as_lengths", "hash_arrays"]


class OversizeError(ValueError):
    """Some samples alone exceed a capacity (with ``oversize="error"``)."""


class TooFewPacksError(ValueError):
    """Fewer packs than ranks with ``drop_last=True``: not one whole step is left."""


def hash_arrays(*arrays: np.ndarray) -> str:
    """A short sha256 of the arrays' values as int64 (the same on every platform)."""
    h = hashlib.sha256()
    for arr in arrays:
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Plan:
    """Packs of samples and their (step, rank) schedule for one epoch.

    Attributes:
        method: how the packs were made (``"balanced"``, ``"isf"`` or ``"random"``).
        pack_offsets: (num_packs + 1,) int64; pack ``p`` holds ``pack_samples[pack_offsets[p]:pack_offsets[p+1]]``.
        pack_samples: int64 sample ids, pack after pack.
        step_packs: (num_steps, world_size) int64 pack id of every (step, rank) slot.
        world_size: number of data-parallel ranks (with context parallelism: of CP groups, each training the
            pack of its slot on all its ranks).
        vit_capacity, llm_capacity: the capacities packs were made under.
        vit_threshold, llm_threshold: ISF's keep thresholds (``None`` for other methods).
        seed, epoch: what the plan was drawn from.
        oversize_samples: ids of samples that alone exceed a capacity (own packs with ``"single"``,
            dropped with ``"drop"``).
        dropped_samples: ids of samples in no slot (oversize ``"drop"`` and ``drop_last``).
        duplicated_slots: slots of the ragged last step filled by reusing packs.
        num_input_samples: samples in the input.
        seconds: planning time (capacity search included).
        context_parallel: how each pack is shared by a context-parallel group (the options' own; size 1:
            none); the capacities are per group.
    """

    method: str
    pack_offsets: np.ndarray
    pack_samples: np.ndarray
    step_packs: np.ndarray
    world_size: int
    vit_capacity: int
    llm_capacity: int
    vit_threshold: Optional[int] = None
    llm_threshold: Optional[int] = None
    seed: int = 0
    epoch: int = 0
    oversize_samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped_samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    duplicated_slots: int = 0
    num_input_samples: int = 0
    seconds: float = 0.0
    context_parallel: ContextParallelOptions = field(default_factory=ContextParallelOptions)

    def __repr__(self) -> str:
        cp = f", context_parallel_size={self.context_parallel.size}" if self.context_parallel.enabled else ""
        return (
            f"Plan(method={self.method!r}, samples={self.num_input_samples}, packs={self.num_packs}, "
            f"steps={self.num_steps}, world_size={self.world_size}{cp}, capacities=({self.vit_capacity}, "
            f"{self.llm_capacity}), seed={self.seed}, epoch={self.epoch}, dropped={self.dropped_samples.size}, "
            f"duplicated_slots={self.duplicated_slots}, fingerprint={self.fingerprint()!r})"
        )

    @property
    def num_packs(self) -> int:
        return int(self.pack_offsets.shape[0] - 1)

    @property
    def num_steps(self) -> int:
        return int(self.step_packs.shape[0])

    def pack(self, p: int) -> np.ndarray:
        """Sample ids of pack ``p``."""
        return self.pack_samples[self.pack_offsets[p] : self.pack_offsets[p + 1]]

    def pack_sizes(self) -> np.ndarray:
        """(num_packs,) samples per pack."""
        return np.diff(self.pack_offsets)

    def rank_batches(self, rank: int) -> list[np.ndarray]:
        """One array of sample ids per step, for ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return [self.pack(int(p)) for p in self.step_packs[:, rank]]

    def slot_samples(self) -> np.ndarray:
        """All sample ids in slot order (step-major, then rank); duplicated slots appear twice."""
        packs = self.step_packs.reshape(-1)
        sizes = self.pack_sizes()[packs]
        starts = self.pack_offsets[packs]
        # Gather each slot's range without a Python loop: positions = starts repeated + local offsets.
        local = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.pack_samples[np.repeat(starts, sizes) + local]

    def fingerprint(self) -> str:
        """A short hash of the schedule: equal on every rank that computed the same plan."""
        return hash_arrays(self.pack_offsets, self.pack_samples, self.step_packs)

    def save(self, path: Union[str, Path]) -> Path:
        """Writes the plan to an ``.npz`` file atomically (``Plan.load`` reads it back); returns the path written.

        As with ``numpy.savez``, ``.npz`` is appended to a name without it (``"plan"`` writes ``plan.npz``).
        """
        from .._files import atomic_write

        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        meta = {
            k: getattr(self, k)
            for k in (
                "method",
                "world_size",
                "vit_capacity",
                "llm_capacity",
                "seed",
                "epoch",
                "duplicated_slots",
                "num_input_samples",
                "seconds",
            )
        }
        meta["context_parallel"] = json.dumps(dataclasses.asdict(self.context_parallel))
        with atomic_write(path) as f:
            self._write_npz(f, meta)
        return path

    def _write_npz(self, f: IO[bytes], meta: dict) -> None:
        np.savez(
            f,
            pack_offsets=self.pack_offsets,
            pack_samples=self.pack_samples,
            step_packs=self.step_packs,
            oversize_samples=self.oversize_samples,
            dropped_samples=self.dropped_samples,
            thresholds=np.array(
                [
                    -1 if self.vit_threshold is None else self.vit_threshold,
                    -1 if self.llm_threshold is None else self.llm_threshold,
                ],
                np.int64,
            ),
            # numpy's stubs let **kwds fill allow_pickle: bool, which these names never do
            **{f"meta_{k}": np.array(v) for k, v in meta.items()},  # type: ignore[arg-type]
        )

    @classmethod
    def load(cls, path: Union[str, Path]) -> Plan:
        with np.load(path, allow_pickle=False) as z:
            meta = {k[5:]: z[k].item() for k in z.files if k.startswith("meta_")}
            vt, lt = (int(x) for x in z["thresholds"])
            cp = json.loads(meta.pop("context_parallel"))
            cp["cost"] = ContextParallelCost(**cp["cost"])
            return cls(
                pack_offsets=z["pack_offsets"],
                pack_samples=z["pack_samples"],
                step_packs=z["step_packs"],
                oversize_samples=z["oversize_samples"],
                dropped_samples=z["dropped_samples"],
                vit_threshold=None if vt < 0 else vt,
                llm_threshold=None if lt < 0 else lt,
                context_parallel=ContextParallelOptions(**cp),
                **meta,
            )


def as_lengths(lengths: Union[Lengths, tuple, Sequence[int], np.ndarray]) -> Lengths:
    """``lengths`` as a ``Lengths``: a ``(vit, llm)`` tuple, or a 1-D array of token counts (text data)."""
    if isinstance(lengths, Lengths):
        return lengths
    if isinstance(lengths, tuple) and len(lengths) == 2:
        return Lengths(np.asarray(lengths[0]), np.asarray(lengths[1]))
    arr = np.asarray(lengths)
    if arr.ndim == 1:  # token counts only: text data
        return Lengths(np.zeros(arr.shape, np.int64), arr)
    raise TypeError("lengths must be a Lengths, a (vit, llm) tuple of arrays, or a 1-D array of token counts")
