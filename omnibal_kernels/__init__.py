"""omnibal_kernels: balance and pack variable-length (vision-)language training data across GPUs.

The public API is re-exported here lazily: importing the package loads neither triton, numba nor the
compiled extension; each name is imported from its module on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    # lengths
    "Lengths": "lengths",
    "load_lengths": "lengths",
    "lengths_from_raw": "raw_lengths",
    "merge_length_parts": "raw_lengths",
    "RawLengths": "raw_lengths",
    # balance
    "Plan": "balance",
    "CostModel": "balance",
    "plan_packs": "balance",
    "search_capacity": "balance",
    "balance_report": "balance",
    "BalanceReport": "balance",
    "OversizeError": "balance",
    # GPU ops (Triton; CPU tensors go to the twins in cpu/)
    "pack": "ops.pack",
    "unpack": "ops.pack",
    "pack_from_mask": "ops.pack",
    "PackedTokens": "ops.pack",
    "varlen_metadata": "ops.varlen_metadata",
    "VarlenMetadata": "ops.varlen_metadata",
    # vision
    "internvl_num_tiles": "vision",
    "qwen2vl_grid": "vision",
    "compute_loads": "vision",
    "write_lengths": "vision",
    "bucket_by_patches": "vision",
    "mrope_position_ids": "vision",
    "pack_vision_fields": "vision",
    "pack_patches": "ops.patches",
    # attention
    "varlen_attention": "attention",
    # packing
    "pack_batch": "packing",
    "PackCollator": "packing",
    "PackedBatch": "packing",
    "unpack_batch": "packing",
    # sampler
    "BalancedBatchSampler": "sampler",
    "SamplerReport": "sampler",
    "BalancedPacker": "streaming",
    "StreamingReport": "streaming",
    "streaming_report": "streaming",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'omnibal_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
