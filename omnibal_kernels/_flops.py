"""The FLOP-count conventions of every cost model (:class:`~omnibal_kernels.CostModel`, its counts from a
transformers config, :class:`~omnibal_kernels.context_parallel.ContextParallelCost`), so that their terms add up.
"""

from __future__ import annotations

__all__ = ["GIGA", "TRAIN_FACTOR"]

# Training = forward + backward, the backward costing about twice the forward (it computes the gradients of both
# the activations and the weights).
TRAIN_FACTOR = 3.0
# The named cost models count work in GFLOP.
GIGA = 1e9
