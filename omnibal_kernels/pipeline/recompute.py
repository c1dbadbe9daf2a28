"""Per-stage recomputation plans and ``apply_recompute``.

A stage that holds ``k`` micro-batches of activations needs ``static + k * kept`` bytes, where ``kept`` sums
``activation_bytes`` over the layers that keep their activations and ``input bytes`` over the layers that are
recomputed (a checkpointed layer keeps only its input and runs its forward again in the backward pass; what
that costs is the profile's ``recompute_ms`` in the backward plus ``checkpoint_forward_ms`` in the forward).
Choosing the layers to recompute so that the stage fits its budget at the least recompute time is a 0/1
knapsack (a min-cost cover of the bytes to save), NP-hard in general. :func:`cover` solves it on a Pareto
frontier of (bytes saved, time) bounded to ``FRONTIER_POINTS`` points (``pipeline._frontier``): exact while the
frontier stays within the bound (layers of a few shapes, or a few dozen layers of any), else optimal for a
budget smaller by a reported slack. :func:`min_cost_cover` is the unbounded exact solver.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from ._frontier import add_item, solve

__all__ = [
    "FRONTIER_POINTS",
    "Cover",
    "CheckpointWrapper",
    "StageMemory",
    "StageRecompute",
    "apply_recompute",
    "checkpointed",
    "cover",
    "min_cost_cover",
    "pareto_frontier",
    "stage_recompute",
]

# Points a frontier keeps before the grid takes over: it bounds one stage's search to O(layers * points) time
# and memory; frontiers of real models (repeated blocks) stay far below it, so they are solved exactly.
FRONTIER_POINTS = 4096

# per-item weights or costs: a sequence or a 1-D array
Floats = Union[Sequence[float], np.ndarray]


class Cover(NamedTuple):
    """A min-cost cover: ``cost``, the sorted ``chosen`` item indices, and ``grid``: 0 when exact, else the
    bytes each item's weight was floored to (the cover is then optimal for ``need + len(items) * grid``)."""

    cost: float
    chosen: list[int]
    grid: float


def pareto_frontier(weights: Sequence[float], costs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """All non-dominated ``(saved, cost)`` sums of subsets of the items, ``saved`` and ``cost`` increasing.

    Items with ``weight <= 0`` are never worth taking and are left out. The first point is ``(0, 0)``. The
    frontier can have ``2 ** len(items)`` points."""
    w = np.zeros(1)
    c = np.zeros(1)
    n = 1
    for wt, ct in zip(weights, costs):
        if wt <= 0:
            continue
        out_w, out_c = np.zeros(2 * n), np.zeros(2 * n)
        n = add_item(w, c, n, float(wt), float(ct), np.inf, out_w, out_c)
        w, c = out_w[:n], out_c[:n]
    return w.copy(), c.copy()


def _as_items(weights: Floats, costs: Floats) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    c = np.asarray(costs, dtype=np.float64).reshape(-1)
    if w.shape != c.shape:
        raise ValueError(f"weights and costs must have one length, got {w.size} and {c.size}")
    if not (np.isfinite(w).all() and np.isfinite(c).all()) or (c < 0).any():
        raise ValueError("weights must be finite and costs finite and >= 0")
    return w, c


def cover(weights: Floats, costs: Floats, need: float, *, limit: int = FRONTIER_POINTS) -> Optional[Cover]:
    """The cheapest subset of items whose weights sum to at least ``need``, on a frontier of at most ``limit``
    points (module docstring), or ``None`` when even all items fall short."""
    w, c = _as_items(weights, costs)
    if need <= 0:
        return Cover(0.0, [], 0.0)
    if w[w > 0].sum() < need:
        return None
    for grid in (0.0, need / limit):
        chosen = np.zeros(w.size, np.bool_)
        cost, within = solve(w, c, float(need), grid, int(limit), chosen)
        if within:
            if not np.isfinite(cost):
                return None  # the floored weights fall short; the slack is the price of the bound
            return Cover(float(cost), [int(j) for j in np.flatnonzero(chosen)], grid)
    raise AssertionError("a frontier on a grid of need / limit has at most limit + 2 points")


def min_cost_cover(weights: Sequence[float], costs: Sequence[float], need: float) -> Optional[tuple[float, list[int]]]:
    """The cheapest subset of items whose weights sum to at least ``need``: ``(cost, sorted indices)``, or
    ``None`` when even all items fall short. Exact, on an unbounded frontier (exponential in the worst case)."""
    w, c = _as_items(weights, costs)
    if need <= 0:
        return 0.0, []
    limit = FRONTIER_POINTS
    while True:
        chosen = np.zeros(w.size, np.bool_)
        cost, within = solve(w, c, float(need), 0.0, limit, chosen)
        if within:
            return None if not np.isfinite(cost) else (float(cost), [int(j) for j in np.flatnonzero(chosen)])
        limit *= 2


@dataclass(frozen=True)
class StageMemory:
    """The memory of one stage under a recompute choice: ``static + held * kept`` bytes."""

    static_bytes: float
    kept_bytes: float
    held: int

    @property
    def peak_bytes(self) -> float:
        return self.static_bytes + self.held * self.kept_bytes


class StageRecompute(NamedTuple):
    """A stage's recompute choice: ``recompute_ms``, the ``chosen`` local layer indices, its ``memory`` and
    ``slack_bytes`` (0 when exact; else the choice is optimal for a budget smaller by at most this)."""

    recompute_ms: float
    chosen: list[int]
    memory: StageMemory
    slack_bytes: float


def stage_recompute(
    activation_bytes: Sequence[float],
    input_bytes: Sequence[float],
    recompute_ms: Sequence[float],
    static_bytes: float,
    held: int,
    budget: Optional[float],
    *,
    limit: int = FRONTIER_POINTS,
) -> Optional[StageRecompute]:
    """The least-recompute-time choice for one stage's layers, or ``None`` when the stage cannot fit ``budget``
    even recomputing everything worth recomputing. ``recompute_ms``: what recomputing each layer costs (a
    profile's ``recompute_ms + checkpoint_forward_ms``)."""
    act = np.asarray(activation_bytes, dtype=np.float64)
    inp = np.asarray(input_bytes, dtype=np.float64)
    full = static_bytes + held * act.sum()
    if budget is None or full <= budget:
        return StageRecompute(0.0, [], StageMemory(float(static_bytes), float(act.sum()), held), 0.0)
    found = cover(act - inp, recompute_ms, (full - budget) / held, limit=limit)
    if found is None:
        return None
    kept = act.sum() - sum(act[j] - inp[j] for j in found.chosen)
    slack = held * found.grid * int((act - inp > 0).sum())
    return StageRecompute(found.cost, found.chosen, StageMemory(float(static_bytes), float(kept), held), slack)


class CheckpointWrapper:
    """Marker base; the real wrapper class is built lazily so that importing this module needs no torch."""


def _wrapper_class() -> Any:
    import torch

    class _Checkpointed(torch.nn.Module, CheckpointWrapper):
        """Runs ``module`` under non-reentrant ``torch.utils.checkpoint``: keeps its inputs, recomputes the
        rest in the backward pass."""

        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return self.module(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(self.module, *args, use_reentrant=False, **kwargs)

    return _Checkpointed


_WRAPPER: Any = None


def checkpointed(module: Any) -> Any:
    """``module`` run under non-reentrant ``torch.utils.checkpoint`` (a new wrapper around it, which keeps its
    inputs and recomputes the rest in the backward pass): the wrapping ``apply_recompute`` puts in place."""
    global _WRAPPER
    if _WRAPPER is None:
        _WRAPPER = _wrapper_class()
    return _WRAPPER(module)


def apply_recompute(module: Any, layers: Iterable[Union[str, int]]) -> Any:
    """Wraps the named sub-modules of ``module`` (qualified names such as ``"llm.3"``, or indices of an
    ``nn.Sequential``/``nn.ModuleList``) with non-reentrant ``torch.utils.checkpoint``, in place.

    Returns ``module``. A name that is not a sub-module raises ``ValueError``; a layer already wrapped stays
    wrapped once.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    for layer in layers:
        name = str(layer)
        parent_name, _, child = name.rpartition(".")
        try:
            parent = module.get_submodule(parent_name) if parent_name else module
            target = parent.get_submodule(child)
        except AttributeError:
            raise ValueError(f"layers: {name!r} is not a sub-module of the model") from None
        if isinstance(target, CheckpointWrapper):
            continue
        if isinstance(parent, (torch.nn.Sequential, torch.nn.ModuleList)) and child.isdigit():
            parent[int(child)] = checkpointed(target)
        else:
            setattr(parent, child, checkpointed(target))
    return module
