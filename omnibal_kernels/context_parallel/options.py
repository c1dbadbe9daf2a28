"""How a pack is split over a context-parallel group: ``ContextParallelOptions``, one frozen object, checked once.

The planner (``PlanOptions.context_parallel``), the sampler, the collator, the loss and the reports read the
same object, so the layout a report prices is the layout the collator builds:

    cp = ContextParallelOptions(size=4, strategy="hybrid", max_rank_tokens=32_768)
    options = PlanOptions(llm_capacity=131_072, vit_capacity=0, context_parallel=cp)
    sampler = BalancedBatchSampler(lengths, options, world_size=world, rank=rank)
    collate = PackCollator(context_parallel=sampler.context_parallel)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from .._checks import check_positive_int
from .cost import ContextParallelCost

__all__ = ["DEFAULT_CONTEXT_PARALLEL", "STRATEGIES", "ContextParallelOptions", "Strategy", "check_options"]

Strategy = Literal["auto", "zigzag", "per_document", "hybrid", "contiguous"]
STRATEGIES: tuple[str, ...] = ("auto", "zigzag", "per_document", "hybrid", "contiguous")
# Far above any context-parallel group; bounds the per-rank arrays a layout allocates.
MAX_CONTEXT_PARALLEL_SIZE = 1 << 24


@dataclass(frozen=True)
class ContextParallelOptions:
    """How every pack is sharded over the ranks of a context-parallel (CP) group. Checked when built: a wrong
    type is a ``TypeError``, a wrong value a ``ValueError``, naming the field.

    Attributes:
        size: ranks of a CP group that share each pack, ``C`` (1: no context parallelism).
        strategy: ``"auto"`` (per pack, the fixed strategy with the least predicted step time among those that
            exchange no more K/V rows than zigzag), ``"zigzag"``,
            ``"per_document"``, ``"hybrid"`` or ``"contiguous"`` (:mod:`omnibal_kernels.context_parallel`
            describes them).
        cost: the cost terms the strategies balance and the reports price with (``None``:
            :meth:`ContextParallelCost.llama3_8b`).
        pad_sequences: zigzag only: pad every sequence to a multiple of ``2 * size`` (Megatron THD,
            ring-flash-attention).
        max_rank_tokens: the most tokens one CP rank may hold (its activation memory), or ``None``: ``hybrid``
            and ``auto`` keep within it, a fixed strategy over it is a ``ValueError`` when a pack is sharded.
    """

    size: int = 1
    strategy: Strategy = "auto"
    cost: ContextParallelCost = field(default_factory=ContextParallelCost.llama3_8b)
    pad_sequences: bool = False
    max_rank_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "size", check_positive_int("context_parallel.size", self.size, maximum=MAX_CONTEXT_PARALLEL_SIZE)
        )
        if not isinstance(self.strategy, str) or self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not isinstance(self.pad_sequences, bool):
            raise TypeError(f"pad_sequences must be a bool, got {self.pad_sequences!r}")
        if self.pad_sequences and self.strategy != "zigzag":
            raise ValueError(
                f"pad_sequences=True is the zigzag strategy's Megatron padding; strategy is {self.strategy!r}"
            )
        if self.max_rank_tokens is not None:
            object.__setattr__(self, "max_rank_tokens", check_positive_int("max_rank_tokens", self.max_rank_tokens))
        if self.cost is None:  # None asks for the default, as documented
            object.__setattr__(self, "cost", ContextParallelCost.llama3_8b())
        elif not isinstance(self.cost, ContextParallelCost):
            raise TypeError(f"cost must be a ContextParallelCost or None, got {type(self.cost).__name__}")

    @property
    def enabled(self) -> bool:
        """Whether packs are sharded (``size > 1``)."""
        return self.size > 1

    def replace(self, **changes: Any) -> ContextParallelOptions:
        """A copy with ``changes`` (fields of ``ContextParallelOptions``), checked again."""
        return dataclasses.replace(self, **changes)


DEFAULT_CONTEXT_PARALLEL = ContextParallelOptions()


def check_options(options: object, name: str = "context_parallel") -> ContextParallelOptions:
    """``options`` when it is a ``ContextParallelOptions``, else a ``TypeError`` naming ``name``."""
    if not isinstance(options, ContextParallelOptions):
        raise TypeError(f"{name} must be a ContextParallelOptions, got {type(options).__name__}")
    return options
