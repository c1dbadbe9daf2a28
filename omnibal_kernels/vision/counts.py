"""ViT tile and patch counts of two model families, vectorized over many images.

* InternVL dynamic resolution (:func:`internvl_tile_grid`, :func:`internvl_num_tiles`): an image of
  ``(width, height)`` is cut into a ``cols x rows`` grid of ``image_size`` tiles, the grid chosen among all
  ``min_num <= cols * rows <= max_num`` by the closest aspect ratio, ties broken as InternVL's
  ``find_closest_aspect_ratio`` breaks them; one thumbnail tile is added when the grid has more than one tile
  and ``use_thumbnail`` is set. The tile count is the ``vit_num`` of OmniBal length files.
* Qwen2-VL / Qwen2.5-VL (:func:`qwen2vl_smart_resize`, :func:`qwen2vl_grid`): ``smart_resize`` to
  multiples of ``factor = patch_size * merge_size`` within ``[min_pixels, max_pixels]`` (the rounding of
  transformers' ``Qwen2VLImageProcessor``), ``grid_thw = (ceil(frames / temporal_patch_size), h / 14, w / 14)``,
  ``num_patches = t * h * w`` and ``num_tokens = num_patches / merge_size**2``.

The counting itself is an op with two twins, routed by the one rule of the package: CUDA tensors (or
``backend="triton"``) go to :mod:`omnibal_kernels.ops.vision_counts`, everything else (lists, numpy arrays, CPU
tensors, or ``backend="cpu"``) to the numpy twin in :mod:`omnibal_kernels.cpu.vision_counts`; both give the
same integers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._checks import MAX_IMAGE_SIDE, QWEN2VL_MAX_RATIO, as_int_array, check_positive_int, is_tensor, use_cpu_twin
from .._contracts.vision_counts import ResizedSize, TileGrid

# Most tiles of an InternVL grid: the configs use 6 to 40; the candidate scan grows as max_num**3, and an
# absurd value would never finish.
INTERNVL_MAX_TILES = 256

__all__ = [
    "INTERNVL_MAX_TILES",
    "MAX_IMAGE_SIDE",
    "QWEN2VL_MAX_RATIO",
    "TileGrid",
    "ResizedSize",
    "ResizedGrid",
    "internvl_target_ratios",
    "internvl_tile_grid",
    "internvl_num_tiles",
    "qwen2vl_smart_resize",
    "qwen2vl_grid",
]

# --------------------------------------------------------------------------------------------- InternVL


def internvl_target_ratios(min_num: int = 1, max_num: int = 12) -> list[tuple[int, int]]:
    """Candidate ``(cols, rows)`` grids with ``min_num <= cols * rows <= max_num``, in InternVL's scan order.

    InternVL builds the candidates as a set and sorts it by tile count (a stable sort), so grids with the
    same tile count keep the set's iteration order. That order decides exact ties, so it is reproduced here
    by building the same set in the same insertion order.
    """
    min_num = check_positive_int("min_num", min_num)
    max_num = check_positive_int("max_num", max_num, maximum=INTERNVL_MAX_TILES)
    if max_num < min_num:
        raise ValueError(f"max_num ({max_num}) must be >= min_num ({min_num})")
    grids: set[tuple[int, int]] = set()
    for n in range(min_num, max_num + 1):
        for cols in range(1, n + 1):
            for rows in range(1, n + 1):
                if min_num <= cols * rows <= max_num:
                    grids.add((cols, rows))
    return sorted(grids, key=lambda g: g[0] * g[1])


def internvl_tile_grid(
    widths: Any,
    heights: Any,
    *,
    min_num: int = 1,
    max_num: int = 12,
    image_size: int = 448,
    use_thumbnail: bool = True,
    backend: str = "auto",
) -> TileGrid:
    """InternVL dynamic-resolution tiling of many images at once.

    Args:
        widths, heights: ``(N,)`` image sizes in pixels (``PIL.Image.size`` order is ``(width, height)``);
            lists, numpy arrays or torch tensors. CUDA tensors run the Triton twin.
        min_num, max_num: bounds on the number of tiles of the grid (InternVL-Chat trains with 1 and 6 or 12).
        image_size: tile side in pixels (448 for InternViT-300M/6B).
        use_thumbnail: add one thumbnail tile when the grid has more than one tile (InternVL-Chat configs
            set it; ``dynamic_preprocess``'s own default is False).
        backend: ``"auto"`` (CUDA tensors -> Triton, anything else -> numpy), ``"triton"`` or ``"cpu"``.

    Returns:
        :class:`TileGrid` of ``(N,)`` int64 arrays (torch tensors on the input's device for tensor input).

    Raises:
        ValueError: a non-positive or oversized side (naming the image), bad ``min_num``/``max_num``.
    """
    ratios = internvl_target_ratios(min_num, max_num)
    image_size = check_positive_int("image_size", image_size, maximum=MAX_IMAGE_SIDE)
    if use_cpu_twin("internvl_tile_grid", backend, widths, heights):
        from ..cpu.vision_counts import internvl_tile_grid as count
    else:
        from ..ops.vision_counts import internvl_tile_grid as count
    return count(widths, heights, ratios, image_size, bool(use_thumbnail))


def internvl_num_tiles(
    widths: Any, heights: Any, *, min_num: int = 1, max_num: int = 12, image_size: int = 448, use_thumbnail: bool = True
) -> Any:
    """``(N,)`` int64 ViT tiles per image (thumbnail included); see :func:`internvl_tile_grid`."""
    return internvl_tile_grid(
        widths, heights, min_num=min_num, max_num=max_num, image_size=image_size, use_thumbnail=use_thumbnail
    ).num_tiles


# --------------------------------------------------------------------------------------------- Qwen2-VL


class ResizedGrid(NamedTuple):
    """Qwen2-VL view of N images or videos (all int64, numpy or torch like the input)."""

    height: Any
    """``(N,)`` resized height in pixels, a multiple of ``patch_size * merge_size``"""
    width: Any
    """``(N,)`` resized width"""
    grid_thw: Any
    """``(N, 3)`` ``(t, h, w)`` in patches: the ``image_grid_thw`` / ``video_grid_thw`` rows"""
    num_patches: Any
    """``(N,)`` ``t * h * w``, the ViT sequence length"""
    num_tokens: Any
    """``(N,)`` ``num_patches // merge_size**2``, the LLM image tokens"""


def _check_pixels(factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
    factor = check_positive_int("factor", factor)
    min_pixels = check_positive_int("min_pixels", min_pixels)
    max_pixels = check_positive_int("max_pixels", max_pixels)
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    return factor, min_pixels, max_pixels


def qwen2vl_smart_resize(
    widths: Any,
    heights: Any,
    *,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
    backend: str = "auto",
) -> ResizedSize:
    """Qwen2-VL ``smart_resize`` of many images: :class:`ResizedSize` ``(height, width)``, each ``(N,)`` int64.

    Both sides are rounded (half to even) to multiples of ``factor``; if the area then exceeds
    ``max_pixels`` the image is scaled by ``beta = sqrt(h * w / max_pixels)`` and floored to multiples of
    ``factor`` (at least ``factor``); if it falls below ``min_pixels`` it is scaled by
    ``sqrt(min_pixels / (h * w))`` and ceiled. Defaults are transformers' ``smart_resize`` defaults.

    Args:
        widths, heights: ``(N,)`` sizes in pixels (note the ``(width, height)`` argument order of
            ``PIL.Image.size``; the published function takes ``(height, width)``).
        backend: ``"auto"`` (CUDA tensors -> Triton, anything else -> numpy), ``"triton"`` or ``"cpu"``.

    Raises:
        ValueError: a side <= 0 or above ``MAX_IMAGE_SIDE``, or an aspect ratio above 200 (as published),
            naming the image.
    """
    factor, min_pixels, max_pixels = _check_pixels(factor, min_pixels, max_pixels)
    if use_cpu_twin("qwen2vl_smart_resize", backend, widths, heights):
        from ..cpu.vision_counts import smart_resize
    else:
        from ..ops.vision_counts import smart_resize
    return smart_resize(widths, heights, factor, min_pixels, max_pixels)


def qwen2vl_grid(
    widths: Any,
    heights: Any,
    num_frames: Any = None,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
) -> ResizedGrid:
    """Qwen2-VL / Qwen2.5-VL patch grid, ViT patches and LLM tokens of many images or videos.

    Args:
        widths, heights: ``(N,)`` frame sizes in pixels.
        num_frames: ``(N,)`` frames per video (None: images, one frame each). Frames are padded to a multiple
            of ``temporal_patch_size`` by repeating the last one, as the image processor does.
        patch_size, merge_size, temporal_patch_size: the vision tower's (14, 2, 2 for Qwen2-VL/2.5-VL).
        min_pixels, max_pixels: ``smart_resize`` bounds (per frame).

    Returns:
        :class:`ResizedGrid`; ``grid_thw`` is ``(N, 3)``.
    """
    # A patch (or merged patch) larger than the largest image side means nothing, and bounds int64 products.
    patch_size = check_positive_int("patch_size", patch_size, maximum=MAX_IMAGE_SIDE)
    merge_size = check_positive_int("merge_size", merge_size, maximum=MAX_IMAGE_SIDE)
    temporal_patch_size = check_positive_int("temporal_patch_size", temporal_patch_size, maximum=MAX_IMAGE_SIDE)
    factor = patch_size * merge_size
    h_out, w_out = qwen2vl_smart_resize(widths, heights, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    t: Any  # t and grid: tensors or arrays, as h_out is
    grid: Any
    if is_tensor(h_out):
        import torch

        if num_frames is None:
            t = torch.ones_like(h_out)
        else:
            t = torch.as_tensor(num_frames, device=h_out.device).to(torch.int64)
            if t.shape != h_out.shape:
                raise ValueError(f"num_frames has shape {tuple(t.shape)}, expected {tuple(h_out.shape)}")
            if bool((t <= 0).any()):
                raise ValueError(f"video {int(torch.nonzero(t <= 0)[0, 0])}: num_frames must be >= 1")
        grid = torch.stack(
            [(t + temporal_patch_size - 1) // temporal_patch_size, h_out // patch_size, w_out // patch_size], dim=1
        )
    else:
        if num_frames is None:
            t = np.ones_like(h_out)
        else:
            t = as_int_array(num_frames, "num_frames")
            if t.shape != h_out.shape:
                raise ValueError(f"num_frames has shape {t.shape}, expected {h_out.shape}")
            if (t <= 0).any():
                raise ValueError(f"video {int(np.flatnonzero(t <= 0)[0])}: num_frames must be >= 1")
        grid = np.stack(
            [(t + temporal_patch_size - 1) // temporal_patch_size, h_out // patch_size, w_out // patch_size], axis=1
        )
    patches = grid[:, 0] * grid[:, 1] * grid[:, 2]
    return ResizedGrid(h_out, w_out, grid, patches, patches // (merge_size * merge_size))
