"""omnibal_kernels: balance and pack variable-length (vision-)language training data across GPUs.

The data flows one way, and so do the imports:

    lengths -> balance (plan packs, C++) -> sampler / streaming -> pack_batch -> ops (Triton) -> attention

beside it: the cost model fitted to measured time (calibration), the loss over an optimizer step (loss),
context-parallel shards (context_parallel), model and memory balance over pipeline stages (pipeline), the three
balances composed in one simulated run (omniverse), length files from raw data (raw_lengths), the benchmarks
suite (bench) and the command line (cli).

The public API is re-exported here lazily, grouped by that flow: importing the package loads neither torch,
triton, numba nor the compiled extension; each name is imported from its module on first use.
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
    "lengths_from_raw": "raw_lengths",
    "merge_length_parts": "raw_lengths",
    "RawLengths": "raw_lengths",
    # balance: plans, capacities, metrics
    "Plan": "balance",
    "PlanOptions": "balance",
    "IsfOptions": "balance",
    "CostModel": "balance",
    "plan_packs": "balance",
    "search_capacity": "balance",
    "balance_report": "balance",
    "BalanceReport": "balance",
    "context_parallel_report": "balance",
    "ContextParallelReport": "balance",
    "epoch_cost": "balance",
    "epoch_bound": "balance",
    "OversizeError": "balance",
    "TooFewPacksError": "balance",
    # cost models fitted to measured time
    "measure_pack_times": "calibration",
    # training: samplers over plans
    "BalancedBatchSampler": "sampler",
    "SamplerReport": "sampler",
    "BalancedPacker": "streaming",
    "StreamingReport": "streaming",
    "streaming_report": "streaming",
    # collate: one pack -> its varlen batch
    "pack_batch": "packing",
    "PackCollator": "packing",
    "PackedBatch": "packing",
    "PackOptions": "packing",
    "StaticShapes": "packing",
    "MRopeOptions": "packing",
    "LabelOptions": "packing",
    "unpack_batch": "packing",
    "LossCounts": "packing",
    # the loss over the optimizer step: counts from the plan, or one all-reduce per step
    "step_loss": "loss",
    "step_batches": "loss",
    # vision: loads, counts, multimodal fields
    "compute_loads": "vision",
    "internvl_num_tiles": "vision",
    "qwen2vl_grid": "vision",
    "bucket_by_patches": "vision",
    "PatchBuckets": "vision",
    "mrope_position_ids": "vision",
    "pack_vision_fields": "vision",
    # GPU ops (Triton; CPU data goes to the twins in cpu/)
    "unpad": "ops.unpad",
    "pad": "ops.unpad",
    "unpad_from_mask": "ops.unpad",
    "PackedTokens": "_contracts.unpad",
    "varlen_metadata": "ops.varlen_metadata",
    "VarlenMetadata": "_contracts.varlen_metadata",
    "patchify": "ops.patchify",
    "PackedPatches": "_contracts.patchify",
    # attention
    "varlen_attention": "attention",
    # context parallelism: a pack's shards over CP ranks, their predicted times, the attention across them
    "shard_for_context_parallel": "context_parallel",
    "ContextParallelShard": "context_parallel",
    "ContextParallelShards": "context_parallel",
    "context_parallel_attention": "context_parallel",
    "context_parallel_rank_times": "context_parallel",
    "ContextParallelCost": "context_parallel",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
