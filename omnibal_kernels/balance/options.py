"""How to plan: ``PlanOptions``, one frozen object checked when it is built, with its parts ``IsfOptions`` (the
``isf`` method's settings) and ``ContextParallelOptions`` (how a pack is shared by a context-parallel group).

Every planning entry (:func:`~omnibal_kernels.balance.plan_packs`, :func:`~omnibal_kernels.balance.search_capacity`,
``BalancedBatchSampler``, ``BalancedPacker``, ``streaming_report``, ``omnibal-kernels plan``) takes its settings
as one ``PlanOptions`` and nothing else; ``options.replace(seed=3)`` is a copy with one field changed, checked
again. The data-parallel world size and the epoch are not options: they are where and when a plan runs, and
every call takes them on their own.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import numpy as np

from .._checks import check_positive_int
from ..context_parallel.options import ContextParallelOptions
from .cost import CostModel
from .seeds import check_seed

__all__ = [
    "ISF_ITERATIONS",
    "ISF_LLM_MARGIN",
    "IsfOptions",
    "MAX_CAPACITY",
    "METHODS",
    "OBJECTIVES",
    "OVERSIZE_POLICIES",
    "PlanOptions",
    "check_options",
    "check_world_size",
    "default_isf_thresholds",
]

Method = Literal["balanced", "isf", "random"]
OversizePolicy = Literal["error", "single", "drop"]
Objective = Literal["time", "stages"]
METHODS: tuple[str, ...] = ("balanced", "isf", "random")
OBJECTIVES: tuple[str, ...] = ("time", "stages")
OVERSIZE_POLICIES: tuple[str, ...] = ("error", "single", "drop")

# The ISF settings of the authors' scripts: ViT threshold = ViT capacity, LLM threshold = capacity - 128,
# 50 rounds.
ISF_LLM_MARGIN = 128
ISF_ITERATIONS = 50
# ISF rounds re-pack the pool each time; bounds a mistyped value's running time.
MAX_ISF_ITERATIONS = 100_000
# Far above any data-parallel world; bounds the slots a schedule allocates (world_size per step).
MAX_WORLD_SIZE = 1 << 24
# Far above any real pack (2**48 tokens), and the largest capacity the engine handles exactly: it places open
# packs in buckets by room * buckets / (capacity + 1) in float64, which must stay below the bucket count; up
# to 2**48 every term is exact and the quotient stays 2**-32 below it (at 2**62 a room rounds up to the
# capacity and indexes past the last bucket). Its int64 sums of a pack plus one sample are far from overflow.
MAX_CAPACITY = 1 << 48


def check_world_size(world_size: object) -> int:
    """``world_size`` as an int in ``[1, 2**24]``."""
    world_size = check_positive_int("world_size", world_size)
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be at most {MAX_WORLD_SIZE:,}, got {world_size:,}")
    return world_size


def default_isf_thresholds(vit_capacity: int, llm_capacity: int) -> tuple[int, int]:
    """ISF's keep thresholds for the capacities, as the authors' scripts: ``(vit_capacity, llm_capacity - 128)``
    (the LLM threshold at least 1)."""
    return vit_capacity, max(llm_capacity - ISF_LLM_MARGIN, 1)


@dataclass(frozen=True)
class IsfOptions:
    """Settings of the ``isf`` method, the OmniBal paper's Iterative Sampling and Filtering.

    Attributes:
        vit_threshold, llm_threshold: a pack is kept once its ViT load or its LLM load reaches its threshold;
            ``None`` (default): :func:`default_isf_thresholds` of the capacities. At most the capacities.
        iterations: sampling rounds, in ``[1, 100_000]`` (default 50).
    """

    vit_threshold: Optional[int] = None
    llm_threshold: Optional[int] = None
    iterations: int = ISF_ITERATIONS

    def __post_init__(self) -> None:
        for name in ("vit_threshold", "llm_threshold"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_positive_int(name, value, minimum=0))
        iterations = check_positive_int("iterations", self.iterations)
        if iterations > MAX_ISF_ITERATIONS:
            raise ValueError(f"iterations must be at most {MAX_ISF_ITERATIONS:,}, got {iterations:,}")
        object.__setattr__(self, "iterations", iterations)

    @property
    def has_thresholds(self) -> bool:
        return self.vit_threshold is not None or self.llm_threshold is not None


@dataclass(frozen=True)
class PlanOptions:
    """How samples are grouped into packs and scheduled. Built once, checked once: a wrong type is a
    ``TypeError``, a wrong value a ``ValueError``, naming the field.

    Attributes:
        method: ``"balanced"`` (default), ``"isf"`` or ``"random"`` (:mod:`omnibal_kernels.balance.engine`
            describes them).
        vit_capacity, llm_capacity: the ViT load (tiles or patches) and the LLM tokens one pack may hold, both
            or neither (``None``: searched from ``target_batch_size``); at most ``2**48``.
        target_batch_size: mean samples per pack wanted where capacities are searched (a positive number,
            default 4).
        oversize: a sample that alone exceeds a capacity: ``"error"`` (raise ``OversizeError``, default),
            ``"single"`` (its own pack, reported) or ``"drop"`` (left out, reported).
        drop_last: drop the packs of a ragged last step (reported) instead of filling it with reused packs
            (the balanced method splits packs into whole steps first, where it can: then nothing is dropped).
        seed: with the epoch, what a plan is drawn from; an int in ``[-2**63, 2**64)``.
        cost_model: the per-sample cost the balanced method equalizes (``None``: ``CostModel.internvl_7b()``).
        objective: what the balanced method balances across the ranks of a step: ``"time"`` (default), each
            pack's whole cost (a data-parallel step waits for its costliest pack); ``"stages"``, its ViT cost
            (the ``vit_*`` terms) and its LLM cost (the ``llm_*`` terms, ``per_sample`` and ``per_pack``) each
            on its own, for the ViT and the LLM on different pipeline stages (each stage waits for its own
            costliest pack). Another method with ``"stages"`` is an error.
        isf: the ``isf`` method's settings; thresholds are an error with another method.
        context_parallel: how each pack is shared by a context-parallel (CP) group
            (:class:`~omnibal_kernels.context_parallel.ContextParallelOptions`; default: no CP). With
            ``context_parallel.size = C`` the capacities are per CP group (a pack's tokens over all its ``C``
            ranks, each holding about ``llm_capacity / C``), the plan's ranks are the data-parallel ones, one
            pack per CP group, and the sampler hands the same options to the collator, which shards each pack.
    """

    method: Method = "balanced"
    vit_capacity: Optional[int] = None
    llm_capacity: Optional[int] = None
    target_batch_size: float = 4.0
    oversize: OversizePolicy = "error"
    drop_last: bool = False
    seed: int = 0
    cost_model: CostModel = field(default_factory=CostModel.internvl_7b)
    objective: Objective = "time"
    isf: IsfOptions = field(default_factory=IsfOptions)
    context_parallel: ContextParallelOptions = field(default_factory=ContextParallelOptions)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.oversize not in OVERSIZE_POLICIES:
            raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {self.oversize!r}")
        self._set_capacities()
        target = self.target_batch_size
        if not isinstance(target, numbers.Real) or isinstance(target, bool):
            raise TypeError(
                f"target_batch_size must be a positive number (int or float), got {type(target).__name__} ({target!r})"
            )
        if not (target > 0 and math.isfinite(target)):
            raise ValueError(f"target_batch_size must be a positive number, got {target!r}")
        object.__setattr__(self, "target_batch_size", float(target))
        if not isinstance(self.drop_last, (bool, np.bool_)):
            raise TypeError(f"drop_last must be a bool, got {type(self.drop_last).__name__} ({self.drop_last!r})")
        object.__setattr__(self, "drop_last", bool(self.drop_last))
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.cost_model is None:
            object.__setattr__(self, "cost_model", CostModel.internvl_7b())
        elif not isinstance(self.cost_model, CostModel):
            raise TypeError(f"cost_model must be a CostModel, got {type(self.cost_model).__name__}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.objective == "stages" and self.method != "balanced":
            raise ValueError(f"objective='stages' applies to method='balanced' only, got method={self.method!r}")
        if not isinstance(self.isf, IsfOptions):
            raise TypeError(f"isf must be an IsfOptions, got {type(self.isf).__name__}")
        if self.isf.has_thresholds and self.method != "isf":
            raise ValueError("vit_threshold/llm_threshold apply to method='isf' only")
        if not isinstance(self.context_parallel, ContextParallelOptions):
            raise TypeError(
                f"context_parallel must be a ContextParallelOptions, got {type(self.context_parallel).__name__}"
            )
        if self.has_capacities and self.method == "isf":
            self.isf_thresholds()  # thresholds above the capacities fail here, not at the first plan

    def _set_capacities(self) -> None:
        if (self.vit_capacity is None) != (self.llm_capacity is None):
            raise ValueError("give both vit_capacity and llm_capacity, or neither (then they are searched)")
        if self.vit_capacity is None:
            return
        vit = check_positive_int("vit_capacity", self.vit_capacity, minimum=0)
        llm = check_positive_int("llm_capacity", self.llm_capacity)
        for name, cap in (("vit_capacity", vit), ("llm_capacity", llm)):
            if cap > MAX_CAPACITY:
                raise ValueError(f"{name} must be at most 2**48 (far above any pack), got {cap}")
        object.__setattr__(self, "vit_capacity", vit)
        object.__setattr__(self, "llm_capacity", llm)

    @property
    def has_capacities(self) -> bool:
        """Whether the capacities are given (else they are searched)."""
        return self.vit_capacity is not None

    def capacities(self) -> tuple[int, int]:
        """``(vit_capacity, llm_capacity)``; ``ValueError`` where they are not given."""
        if self.vit_capacity is None or self.llm_capacity is None:
            raise ValueError("these options have no capacities (give vit_capacity and llm_capacity)")
        return self.vit_capacity, self.llm_capacity

    def isf_thresholds(self) -> tuple[int, int]:
        """``(vit_threshold, llm_threshold)`` of the ``isf`` method, defaults filled in from the capacities."""
        vit_capacity, llm_capacity = self.capacities()
        vit_default, llm_default = default_isf_thresholds(vit_capacity, llm_capacity)
        vit = vit_default if self.isf.vit_threshold is None else self.isf.vit_threshold
        llm = llm_default if self.isf.llm_threshold is None else self.isf.llm_threshold
        if vit > vit_capacity or llm > llm_capacity:
            raise ValueError(
                f"ISF thresholds (vit {vit}, llm {llm}) must not exceed the capacities "
                f"(vit {vit_capacity}, llm {llm_capacity}): a pack could never reach them"
            )
        return vit, llm

    def replace(self, **changes: Any) -> PlanOptions:
        """A copy with ``changes`` (fields of ``PlanOptions``), checked again."""
        return dataclasses.replace(self, **changes)


def check_options(options: object) -> PlanOptions:
    """``options`` when it is a ``PlanOptions`` (``None``: the defaults), else a ``TypeError``."""
    if options is None:
        return PlanOptions()
    if not isinstance(options, PlanOptions):
        raise TypeError(f"options must be a PlanOptions, got {type(options).__name__}")
    return options
