"""What tests and benchmarks share: plain references of every fast path, and the tiny models they train.

* :mod:`omnibal_kernels.testing.references`: ``<what>_reference`` functions (balance, ops, vision, attention,
  ``pack_batch``).
* :mod:`omnibal_kernels.testing.models`: ``TinyCausalLM`` and its building blocks, ``causal_lm_loss``.
* :mod:`omnibal_kernels.testing.processes`: ``free_port`` for local multi-process runs.

Importing this package imports torch; nothing in the library imports it.
"""

from .models import RMSNorm, TinyBlock, TinyCausalLM, causal_lm_loss, count_lm_targets
from .references import (
    bucket_sort_reference,
    dist_ratio_reference,
    internvl_tiles_reference,
    isf_reference,
    mrope_positions_reference,
    next_fit_reference,
    pack_batch_reference,
    pad_input_reference,
    pad_reference,
    patchify_reference,
    qwen2vl_counts_reference,
    random_next_fit_reference,
    smart_resize_reference,
    unpad_input_reference,
    unpad_reference,
    varlen_attention_reference,
    varlen_metadata_reference,
)

__all__ = [
    "RMSNorm",
    "TinyBlock",
    "TinyCausalLM",
    "bucket_sort_reference",
    "causal_lm_loss",
    "count_lm_targets",
    "dist_ratio_reference",
    "internvl_tiles_reference",
    "isf_reference",
    "mrope_positions_reference",
    "next_fit_reference",
    "pack_batch_reference",
    "pad_input_reference",
    "pad_reference",
    "patchify_reference",
    "qwen2vl_counts_reference",
    "random_next_fit_reference",
    "smart_resize_reference",
    "unpad_input_reference",
    "unpad_reference",
    "varlen_attention_reference",
    "varlen_metadata_reference",
]
