"""The contract of ``patchify``: argument checks, the plan both implementations follow, and the result type,
shared by the Triton op (:mod:`omnibal_kernels.ops.patchify`) and its CPU twin
(:mod:`omnibal_kernels.cpu.patchify`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .._checks import check_positive_int, is_tensor
from .._csr import check_int32_total, offsets_from_counts

__all__ = ["ELEMENT_VIEW", "PackedPatches", "PatchPlan", "patch_segments", "plan_patches"]


class PackedPatches(NamedTuple):
    """Images cut into Qwen2-VL ViT patches and packed into one varlen sequence of ``P`` patches."""

    patches: Any
    """``(P, C * temporal_patch_size * patch_size**2)``, input dtype; Qwen2-VL's ``pixel_values`` layout"""
    vit_cu_seqlens: Any
    """``(S + 1,)`` int32: one segment per frame group of each image, as Qwen2-VL's vision tower builds it"""
    vit_max_seqlen: int
    """longest segment"""
    patch_positions: Any
    """``(P, 2)`` int64 ``(row, col)`` of each patch in its image, for 2-D rotary embeddings"""
    image_grid_thw: Any
    """``(N, 3)`` int64 ``(t, h, w)`` in patches per image"""


class PatchPlan(NamedTuple):
    """The checked inputs of ``patchify``: every image as a 4-D view, its grid and its first patch."""

    views: list  # per image a 4-D (frames, C, H, W) tensor view (any strides)
    grid: np.ndarray  # (N, 3) int64
    first_patch: np.ndarray  # (N + 1,) int64 patch offsets
    channels: int
    dtype: Any
    device: Any


# Integer dtype of each element size: patches are copied as raw bits, so every dtype moves unchanged.
ELEMENT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def plan_patches(images: Any, sizes: Any, patch_size: int, merge_size: int, temporal_patch_size: int) -> PatchPlan:
    """Validate the inputs of ``patchify`` and describe every image as a strided 4-D view."""
    patch_size = check_positive_int("patch_size", patch_size)
    merge_size = check_positive_int("merge_size", merge_size)
    temporal_patch_size = check_positive_int("temporal_patch_size", temporal_patch_size)
    factor = patch_size * merge_size
    views: list = []
    if isinstance(images, torch.Tensor):
        if sizes is None:
            raise ValueError("a padded images tensor needs sizes: (N, 2) (height, width) per image")
        if images.dim() not in (4, 5):
            raise ValueError(f"padded images must be (N, C, H, W) or (N, T, C, H, W), got {tuple(images.shape)}")
        hw = np.asarray(sizes.detach().cpu() if is_tensor(sizes) else sizes)
        if hw.ndim != 2 or hw.shape != (images.shape[0], 2):
            raise ValueError(f"sizes must be ({images.shape[0]}, 2) (height, width), got shape {tuple(hw.shape)}")
        if not np.issubdtype(hw.dtype, np.integer):
            raise TypeError(f"sizes must be integers, got dtype {hw.dtype}")
        for i in range(images.shape[0]):
            h, w = int(hw[i, 0]), int(hw[i, 1])
            if not (0 < h <= images.shape[-2] and 0 < w <= images.shape[-1]):
                raise ValueError(f"image {i}: size {h}x{w} is outside the padded {images.shape[-2]}x{images.shape[-1]}")
            img = images[i]
            views.append((img.unsqueeze(0) if img.dim() == 3 else img)[..., :h, :w])
    else:
        if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
            raise TypeError("images must be a list of (C, H, W) / (T, C, H, W) tensors or one padded tensor")
        if sizes is not None:
            raise ValueError("sizes is only for a padded images tensor")
        for i, img in enumerate(images):
            if not isinstance(img, torch.Tensor):
                raise TypeError(f"image {i}: expected a torch tensor, got {type(img).__name__}")
            if img.dim() not in (3, 4):
                raise ValueError(f"image {i}: expected (C, H, W) or (T, C, H, W), got shape {tuple(img.shape)}")
            views.append(img.unsqueeze(0) if img.dim() == 3 else img)
    if not views:
        raise ValueError("no images to pack")
    first = views[0]
    grid = np.zeros((len(views), 3), dtype=np.int64)
    for i, v in enumerate(views):
        if v.shape[1] != first.shape[1]:
            raise ValueError(f"image {i}: {v.shape[1]} channels, image 0 has {first.shape[1]}")
        if v.dtype != first.dtype:
            raise ValueError(f"image {i}: dtype {v.dtype}, image 0 has {first.dtype}")
        if v.device != first.device:
            raise ValueError(f"image {i}: on {v.device}, image 0 on {first.device}")
        if v.element_size() not in ELEMENT_VIEW:
            raise TypeError(f"image {i}: unsupported dtype {v.dtype}")
        t, _, h, w = v.shape
        if t < 1 or h <= 0 or w <= 0 or h % factor or w % factor:
            raise ValueError(
                f"image {i}: size {h}x{w} ({t} frames) must be positive multiples of "
                f"patch_size * merge_size = {factor} (resize with qwen2vl_smart_resize first)"
            )
        grid[i] = ((t + temporal_patch_size - 1) // temporal_patch_size, h // patch_size, w // patch_size)
    offsets = offsets_from_counts(grid[:, 0] * grid[:, 1] * grid[:, 2])
    return PatchPlan(views, grid, offsets, int(first.shape[1]), first.dtype, first.device)


def patch_segments(grid: np.ndarray) -> tuple[np.ndarray, int]:
    """``vit_cu_seqlens`` (int32) with one segment of ``h * w`` per frame group, and the longest segment."""
    seg = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    cu = offsets_from_counts(seg)
    check_int32_total("vit_cu_seqlens", int(cu[-1]), "patches")
    return cu.astype(np.int32), int(seg.max()) if seg.size else 0
