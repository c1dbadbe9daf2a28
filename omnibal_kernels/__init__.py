"""omnibal_kernels: balance and pack variable-length (vision-)language training data across GPUs.

The data path, in the order it runs, is the top level:

    lengths -> plan_packs (PlanOptions) -> BalancedBatchSampler -> PackCollator (PackOptions) -> step_loss

plus the GPU ops the packed batches feed (``unpad``, ``pad``, ``varlen_metadata``, ``patchify``,
``varlen_attention``). The tools have their own documented subpackages, reachable as attributes
(``omnibal_kernels.pipeline``): ``balance`` (planning in detail: cost models, bounds, capacity search),
``context_parallel`` (a pack's shards over CP ranks and their predicted times), ``vision`` (tile and patch
counts, mRoPE), ``pipeline`` (model and memory balance over pipeline stages), ``omniverse`` (the three
balances composed in one simulated run), ``raw_lengths`` (length files from raw data sets), ``calibration``
(cost models fitted to measured time), ``hf`` (the transformers Trainer) and ``bench`` (the benchmarks suite).

Importing the package loads neither torch, triton, numba nor the compiled extension; each name is imported from
its module on first use.
"""

from __future__ import annotations

from ._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package), in the order of the flow
_EXPORTS: dict[str, str] = {
    # per-sample loads
    "Lengths": "lengths",
    "load_lengths": "lengths",
    "write_lengths": "lengths",
    # planning: packs under two capacities, scheduled on ranks and steps
    "PlanOptions": "balance",
    "IsfOptions": "balance",
    "CostModel": "balance",
    "plan_packs": "balance",
    "search_capacity": "balance",
    "Plan": "balance",
    "balance_report": "balance",
    "BalanceReport": "balance",
    "OversizeError": "balance",
    "TooFewPacksError": "balance",
    "OmnibalWarning": "_warnings",
    "CapacityWarning": "_warnings",
    "DuplicatesWarning": "_warnings",
    "TooFewPacksWarning": "_warnings",
    "ContextParallelOptions": "context_parallel",
    # training: samplers over plans
    "BalancedBatchSampler": "sampler",
    "SamplerReport": "sampler",
    "BalancedPacker": "streaming",
    "streaming_report": "streaming",
    "StreamingReport": "streaming",
    # collate: one pack -> its varlen batch
    "PackOptions": "packing",
    "PackCollator": "packing",
    "pack_batch": "packing",
    "PackedBatch": "packing",
    "unpack_batch": "packing",
    "LossCounts": "packing",
    # the loss over the optimizer step: counts from the plan, or one all-reduce per step
    "step_loss": "loss",
    "step_batches": "loss",
    # GPU ops (Triton; CPU data goes to the twins in cpu/) and attention
    "unpad": "ops.unpad",
    "pad": "ops.unpad",
    "unpad_from_mask": "ops.unpad",
    "PackedTokens": "_contracts.unpad",
    "varlen_metadata": "ops.varlen_metadata",
    "VarlenMetadata": "_contracts.varlen_metadata",
    "patchify": "ops.patchify",
    "PackedPatches": "_contracts.patchify",
    "varlen_attention": "attention",
}

# The tools and the stages in detail, as attributes (imported on first use).
_SUBPACKAGES = (
    "balance",
    "bench",
    "calibration",
    "context_parallel",
    "hf",
    "lengths",
    "loss",
    "omniverse",
    "packing",
    "pipeline",
    "raw_lengths",
    "sampler",
    "streaming",
    "synthetic",
    "vision",
)

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), _SUBPACKAGES)
