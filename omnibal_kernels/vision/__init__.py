"""Vision side of the flow: how many ViT tiles/patches and LLM tokens an image costs, and the multimodal fields
of a packed batch.

=============  ===================================================================================================
``counts``     InternVL tile grids and Qwen2-VL ``smart_resize`` grids of many images (numpy, or Triton on CUDA)
``loads``      per-sample ``Lengths`` from image sizes and text lengths (what a length file holds)
``buckets``    images grouped by patch count (a counting sort; numba, or Triton on CUDA)
``mrope``      Qwen2-VL / Qwen2.5-VL multimodal rotary positions
``fields``     the vision fields of a packed batch and the hook ``pack_batch`` calls
=============  ===================================================================================================

Patchifying images (images -> Qwen2-VL patches) is a kernel: :func:`omnibal_kernels.ops.patchify.patchify`.
Names are imported from their modules on first use, so ``import omnibal_kernels.vision`` stays light.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "INTERNVL_MAX_TILES": "counts",
    "MAX_IMAGE_SIDE": "counts",
    "QWEN2VL_MAX_RATIO": "counts",
    "TileGrid": "counts",
    "ResizedGrid": "counts",
    "ResizedSize": "counts",
    "internvl_target_ratios": "counts",
    "internvl_tile_grid": "counts",
    "internvl_num_tiles": "counts",
    "qwen2vl_smart_resize": "counts",
    "qwen2vl_grid": "counts",
    "MODELS": "loads",
    "compute_loads": "loads",
    "PatchBuckets": "buckets",
    "bucket_by_patches": "buckets",
    "MRopePositions": "mrope",
    "mrope_position_ids": "mrope",
    "pack_vision_fields": "fields",
    "unpack_vision_fields": "fields",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
