"""Per-sample loads from image sizes and text lengths: what a length file holds, before any pixel is read."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._checks import QWEN2VL_MAX_RATIO, as_int_array, check_image_sizes, check_positive_int, is_tensor
from .._progress import progress_bar
from ..lengths import Lengths
from .counts import internvl_num_tiles, qwen2vl_grid

__all__ = ["MODELS", "compute_loads", "flatten_image_sizes"]

# Images per chunk of the counting (bounds the InternVL candidate matrix and updates the progress bar).
_CHUNK = 1 << 16

# The model families whose counting rules compute_loads knows.
MODELS = ("internvl", "qwen2vl")


def flatten_image_sizes(image_sizes: Sequence[Any], progress: bool | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample ``None`` / ``(w, h)`` / list of ``(w, h)`` -> ``(M, 2)`` sizes and ``(M,)`` owning sample."""
    sizes: list[Any] = []
    owner: list[int] = []
    bar = progress_bar(total=len(image_sizes), desc="reading image sizes", enabled=progress)
    for i, entry in enumerate(image_sizes):
        bar.update(1)
        if entry is None:
            continue
        arr = np.asarray(entry)
        if arr.size == 0:
            continue
        if arr.ndim == 1 and arr.shape[0] == 2:
            arr = arr.reshape(1, 2)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"sample {i}: image sizes must be (width, height) pairs, got shape {tuple(arr.shape)}")
        sizes.append(arr)
        owner.extend([i] * arr.shape[0])
    bar.close()
    if not sizes:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64)
    flat = np.concatenate(sizes, axis=0)
    if not np.issubdtype(flat.dtype, np.integer):
        flat_f = flat.astype(np.float64)
        if (flat_f != np.floor(flat_f)).any():
            j = int(np.flatnonzero((flat_f != np.floor(flat_f)).any(axis=1))[0])
            raise TypeError(f"sample {owner[j]}: image size {flat[j].tolist()} is not integral")
    return flat.astype(np.int64), np.asarray(owner, dtype=np.int64)


def compute_loads(image_sizes: Any, text_tokens: Any, *, model: str = "internvl", image_to_sample: Any = None,
                  num_frames: Any = None, num_image_token: int = 256, min_num: int = 1, max_num: int = 12,
                  image_size: int = 448, use_thumbnail: bool = True, patch_size: int = 14, merge_size: int = 2,
                  temporal_patch_size: int = 2, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280,
                  progress: bool | None = None) -> Lengths:
    """Turn a dataset's image sizes and text lengths into the ``vit``/``llm`` loads of a length file.

    Args:
        image_sizes: one entry per sample, each ``None``/empty (text only), one ``(width, height)`` pair or a
            list of pairs; or, with ``image_to_sample``, an ``(M, 2)`` array of ``(width, height)`` rows.
        text_tokens: ``(N,)`` text tokens per sample, image tokens excluded.
        model: ``"internvl"`` (vit = tiles, llm = text + tiles * ``num_image_token``) or ``"qwen2vl"``
            (vit = patches, llm = text + patches / ``merge_size**2``).
        image_to_sample: ``(M,)`` sample index of each image row (any order) when ``image_sizes`` is flat.
        num_frames: ``(M,)`` frames per image row for Qwen2-VL videos (flat layout only); None for images.
        num_image_token: LLM tokens per InternVL tile (256 for 448-pixel tiles with pixel shuffle 0.5).
        min_num, max_num, image_size, use_thumbnail: InternVL tiling, see :func:`internvl_tile_grid`.
        patch_size, merge_size, temporal_patch_size, min_pixels, max_pixels: Qwen2-VL, see :func:`qwen2vl_grid`.
        progress: progress bars on stderr (default: when stderr is a terminal).

    Returns:
        :class:`~omnibal_kernels.Lengths` with ``vit`` and ``llm`` of shape ``(N,)`` int64.

    Raises:
        ValueError: unknown model, bad sizes (naming the sample), negative text lengths, mismatched lengths.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    num_image_token = check_positive_int("num_image_token", num_image_token, minimum=0, maximum=2**31 - 1)
    text = as_int_array(text_tokens, "text_tokens")
    n = text.shape[0]
    if (text < 0).any():
        i = int(np.flatnonzero(text < 0)[0])
        raise ValueError(f"sample {i}: text_tokens = {int(text[i])} is negative")
    if image_to_sample is None:
        if num_frames is not None:
            raise ValueError("num_frames needs the flat layout (image_sizes as (M, 2) with image_to_sample)")
        if len(image_sizes) != n:
            raise ValueError(f"image_sizes has {len(image_sizes)} samples but text_tokens has {n}")
        sizes, owner = flatten_image_sizes(image_sizes, progress)
    else:
        sizes = np.asarray(image_sizes.detach().cpu() if is_tensor(image_sizes) else image_sizes)
        if sizes.size == 0:
            sizes = sizes.reshape(0, 2)
        if sizes.ndim != 2 or sizes.shape[1] != 2:
            raise ValueError(f"image_sizes must be (M, 2) with image_to_sample, got shape {tuple(sizes.shape)}")
        owner = as_int_array(image_to_sample, "image_to_sample") if sizes.shape[0] else np.zeros(0, np.int64)
        if owner.shape[0] != sizes.shape[0]:
            raise ValueError(f"image_to_sample has {owner.shape[0]} entries for {sizes.shape[0]} images")
        if owner.size and (owner.min() < 0 or owner.max() >= n):
            j = int(np.flatnonzero((owner < 0) | (owner >= n))[0])
            raise ValueError(f"image_to_sample[{j}] = {int(owner[j])} is not a sample index in [0, {n})")
    frames = None if num_frames is None else as_int_array(num_frames, "num_frames")
    if frames is not None and frames.shape[0] != sizes.shape[0]:
        raise ValueError(f"num_frames has {frames.shape[0]} entries for {sizes.shape[0]} images")
    if sizes.shape[0]:
        check_image_sizes(as_int_array(sizes[:, 0], "image widths"), as_int_array(sizes[:, 1], "image heights"),
                          max_ratio=QWEN2VL_MAX_RATIO if model == "qwen2vl" else None, owner=owner)
    vit_per_image = np.zeros(sizes.shape[0], dtype=np.int64)
    llm_per_image = np.zeros(sizes.shape[0], dtype=np.int64)
    bar = progress_bar(total=sizes.shape[0], desc=f"counting {model} images", enabled=progress)
    try:
        for lo in range(0, sizes.shape[0], _CHUNK):
            hi = min(lo + _CHUNK, sizes.shape[0])
            w = as_int_array(sizes[lo:hi, 0], "widths")
            h = as_int_array(sizes[lo:hi, 1], "heights")
            if model == "internvl":
                tiles = internvl_num_tiles(w, h, min_num=min_num, max_num=max_num, image_size=image_size,
                                           use_thumbnail=use_thumbnail)
                vit_per_image[lo:hi] = tiles
                llm_per_image[lo:hi] = tiles * num_image_token
            else:
                g = qwen2vl_grid(w, h, None if frames is None else frames[lo:hi], patch_size=patch_size,
                                 merge_size=merge_size, temporal_patch_size=temporal_patch_size,
                                 min_pixels=min_pixels, max_pixels=max_pixels)
                vit_per_image[lo:hi] = g.num_patches
                llm_per_image[lo:hi] = g.num_tokens
            bar.update(hi - lo)
    finally:
        bar.close()
    vit = np.bincount(owner, weights=vit_per_image, minlength=n).astype(np.int64) if owner.size else np.zeros(n, np.int64)
    img_llm = np.bincount(owner, weights=llm_per_image, minlength=n).astype(np.int64) if owner.size else np.zeros(n, np.int64)
    return Lengths(vit, text + img_llm)
