"""Per-stage recomputation plans and ``apply_recompute``.

A stage that holds ``k`` micro-batches of activations needs ``static + k * kept`` bytes, where ``kept`` sums
``activation_bytes`` over the layers that keep their activations and ``input bytes`` over the layers that are
recomputed (a checkpointed layer keeps only its input and runs its forward again in the backward pass).
Choosing the layers to recompute so that the stage fits its budget at the least recompute time is a 0/1
knapsack (a min-cost cover of the bytes to save); ``min_cost_cover`` solves it exactly with a Pareto frontier
of (bytes saved, time) over the layers, which stays small when many layers share one shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

__all__ = ["min_cost_cover", "pareto_frontier", "StageMemory", "stage_recompute", "apply_recompute",
           "CheckpointWrapper"]


def pareto_frontier(weights: Sequence[float], costs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """All non-dominated ``(saved, cost)`` sums of subsets of the items, ``saved`` and ``cost`` increasing.

    Items with ``weight <= 0`` are never worth taking and are left out. The first point is ``(0, 0)``.
    """
    w_front = np.zeros(1)
    c_front = np.zeros(1)
    for w, c in zip(weights, costs):
        if w <= 0:
            continue
        w_front, c_front = _add_item(w_front, c_front, float(w), float(c))
    return w_front, c_front


def _add_item(w_front: np.ndarray, c_front: np.ndarray, w: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    w_all = np.concatenate([w_front, w_front + w])
    c_all = np.concatenate([c_front, c_front + c])
    # Walk from the most saved down: keep a point only when it is cheaper than every point saving more.
    order = np.lexsort((c_all, -w_all))
    w_all, c_all = w_all[order], c_all[order]
    best_above = np.minimum.accumulate(np.concatenate([[np.inf], c_all[:-1]]))
    keep = c_all < best_above
    return w_all[keep][::-1].copy(), c_all[keep][::-1].copy()


def min_cost_cover(weights: Sequence[float], costs: Sequence[float], need: float) -> Optional[tuple[float, list[int]]]:
    """The cheapest subset of items whose weights sum to at least ``need``: ``(cost, sorted indices)``, or
    ``None`` when even all items fall short. Exact (a Pareto frontier over the items, subsets tracked)."""
    if need <= 0:
        return 0.0, []
    points: list[tuple[float, float, int]] = [(0.0, 0.0, 0)]  # (saved, cost, bitmask of items)
    for j, (w, c) in enumerate(zip(weights, costs)):
        if w <= 0:
            continue
        grown = points + [(sw + w, sc + c, mask | (1 << j)) for sw, sc, mask in points]
        grown.sort(key=lambda t: (-t[0], t[1]))
        points = []
        best = math.inf
        for point in grown:
            if point[1] < best:
                points.append(point)
                best = point[1]
        points.reverse()
    feasible = [p for p in points if p[0] >= need]
    if not feasible:
        return None
    _, cost, mask = min(feasible, key=lambda t: (t[1], -t[0]))
    return float(cost), [j for j in range(len(weights)) if mask >> j & 1]


@dataclass(frozen=True)
class StageMemory:
    """The memory of one stage under a recompute choice: ``static + held * kept`` bytes."""

    static_bytes: float
    kept_bytes: float
    held: int

    @property
    def peak_bytes(self) -> float:
        return self.static_bytes + self.held * self.kept_bytes


def stage_recompute(
    activation_bytes: Sequence[float],
    input_bytes: Sequence[float],
    forward_ms: Sequence[float],
    static_bytes: float,
    held: int,
    budget: Optional[float],
) -> Optional[tuple[float, list[int], StageMemory]]:
    """The least-recompute-time choice for one stage's layers: ``(recompute_ms, local indices, memory)``, or
    ``None`` when the stage cannot fit ``budget`` even recomputing everything worth recomputing."""
    act = np.asarray(activation_bytes, dtype=np.float64)
    inp = np.asarray(input_bytes, dtype=np.float64)
    full = static_bytes + held * act.sum()
    if budget is None or full <= budget:
        return 0.0, [], StageMemory(float(static_bytes), float(act.sum()), held)
    need = (full - budget) / held
    found = min_cost_cover(act - inp, forward_ms, need)
    if found is None:
        return None
    cost, chosen = found
    kept = act.sum() - sum(act[j] - inp[j] for j in chosen)
    return cost, chosen, StageMemory(float(static_bytes), float(kept), held)


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


def apply_recompute(module: Any, layers: Iterable[Union[str, int]]) -> Any:
    """Wraps the named sub-modules of ``module`` (qualified names such as ``"llm.3"``, or indices of an
    ``nn.Sequential``/``nn.ModuleList``) with non-reentrant ``torch.utils.checkpoint``, in place.

    Returns ``module``. A name that is not a sub-module raises ``ValueError``; a layer already wrapped stays
    wrapped once.
    """
    import torch

    global _WRAPPER
    if _WRAPPER is None:
        _WRAPPER = _wrapper_class()
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
            parent[int(child)] = _WRAPPER(target)
        else:
            setattr(parent, child, _WRAPPER(target))
    return module
