"""The contract of the vision counting ops (InternVL tile grids, Qwen2-VL ``smart_resize``): size checks and
result types, shared by the Triton ops (:mod:`omnibal_kernels.ops.vision_counts`), their numpy twins
(:mod:`omnibal_kernels.cpu.vision_counts`) and the public functions of :mod:`omnibal_kernels.vision.counts`.

Sizes are ``(N,)`` integers per image: on the host (lists, numpy arrays, CPU tensors) they are checked as
numpy arrays (:func:`host_sizes`), on the GPU as int64 tensors with one host sync to name the first bad image
(:func:`device_sizes`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._checks import MAX_IMAGE_SIDE, as_int_array, check_image_sizes, is_tensor

__all__ = ["ResizedSize", "TileGrid", "device_sizes", "host_sizes", "like_input"]


class TileGrid(NamedTuple):
    """InternVL tiling of N images (all ``(N,)`` int64, numpy or torch like the input)."""

    cols: Any
    """tiles along the width (``target_aspect_ratio[0]``)"""
    rows: Any
    """tiles along the height (``target_aspect_ratio[1]``)"""
    num_tiles: Any
    """``cols * rows`` plus the thumbnail when ``use_thumbnail`` and ``cols * rows > 1``"""


class ResizedSize(NamedTuple):
    """Qwen2-VL ``smart_resize`` of N images (both ``(N,)`` int64, numpy or torch like the input)."""

    height: Any
    """resized height in pixels, a multiple of ``factor``"""
    width: Any
    """resized width in pixels, a multiple of ``factor``"""


def host_sizes(widths: Any, heights: Any, max_ratio: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(widths, heights)`` as int64 numpy arrays, every side in ``[1, MAX_IMAGE_SIDE]`` and, with
    ``max_ratio``, every aspect ratio at most that; errors name the image."""
    w = as_int_array(widths, "widths")
    h = as_int_array(heights, "heights")
    check_image_sizes(w, h, max_ratio=max_ratio)
    return w, h


def device_sizes(widths: Any, heights: Any, max_ratio: float | None = None) -> tuple[Any, Any]:
    """:func:`host_sizes` for torch tensors on one device: contiguous int64 tensors on that device."""
    import torch

    if not isinstance(widths, torch.Tensor) or not isinstance(heights, torch.Tensor):
        raise TypeError("widths and heights must both be torch tensors for the Triton path")
    if widths.device != heights.device:
        raise ValueError(f"widths on {widths.device} but heights on {heights.device}")
    if widths.dim() != 1 or widths.shape != heights.shape:
        raise ValueError(f"widths {tuple(widths.shape)} and heights {tuple(heights.shape)} must be equal 1-D shapes")
    for name, t in (("widths", widths), ("heights", heights)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    w = widths.to(torch.int64).contiguous()
    h = heights.to(torch.int64).contiguous()
    # one host sync to name the first bad image
    bad = (w <= 0) | (h <= 0) | (w > MAX_IMAGE_SIDE) | (h > MAX_IMAGE_SIDE)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"image {i}: size {int(w[i])}x{int(h[i])} has a side outside [1, {MAX_IMAGE_SIDE}]")
    if max_ratio is not None and w.numel():
        ratio = torch.maximum(w, h).double() / torch.minimum(w, h).double()
        bad = ratio > max_ratio
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"image {i}: absolute aspect ratio must be at most {max_ratio}, "
                f"got {float(ratio[i])} (height {int(h[i])}, width {int(w[i])})"
            )
    return w, h


def like_input(x: Any, *arrays: np.ndarray) -> tuple[Any, ...]:
    """``arrays`` as CPU torch tensors when ``x`` is a tensor, else as they are."""
    if is_tensor(x):
        import torch

        return tuple(torch.from_numpy(a) for a in arrays)
    return arrays
