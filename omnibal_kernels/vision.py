"""Vision side of packing: ViT tile/patch counts, per-sample loads, patch-count buckets, multimodal fields.

Counting follows the published preprocessing of two model families, vectorized over many images:

* InternVL dynamic resolution (:func:`internvl_tile_grid`, :func:`internvl_num_tiles`): an image of
  ``(width, height)`` is cut into a ``cols x rows`` grid of ``image_size`` tiles, the grid chosen among all
  ``min_num <= cols * rows <= max_num`` by the closest aspect ratio, ties broken as InternVL's
  ``find_closest_aspect_ratio`` breaks them; one thumbnail tile is added when the grid has more than one tile
  and ``use_thumbnail`` is set. The tile count is the ``vit_num`` of OmniBal length files.
* Qwen2-VL / Qwen2.5-VL (:func:`qwen2vl_smart_resize`, :func:`qwen2vl_grid`): ``smart_resize`` to
  multiples of ``factor = patch_size * merge_size`` within ``[min_pixels, max_pixels]`` (the rounding of
  transformers' ``Qwen2VLImageProcessor``), ``grid_thw = (ceil(frames / temporal_patch_size), h / 14, w / 14)``,
  ``num_patches = t * h * w`` and ``num_tokens = num_patches / merge_size**2``.

CPU inputs (lists, numpy arrays, CPU tensors) are counted with numpy; CUDA tensors go to the Triton twins in
:mod:`omnibal_kernels.ops.vision_counts`, which give the same integers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

__all__ = [
    "TileGrid",
    "ResizedGrid",
    "Loads",
    "internvl_target_ratios",
    "internvl_tile_grid",
    "internvl_num_tiles",
    "qwen2vl_smart_resize",
    "qwen2vl_grid",
    "compute_loads",
    "write_lengths",
    "add_lengths_parser",
    "run_lengths",
    "main_lengths",
    "PatchBuckets",
    "bucket_by_patches",
    "MRopePositions",
    "mrope_position_ids",
    "pack_vision_fields",
    "unpack_vision_fields",
    "PackedPatches",
]

# Sizes are limited so that width * height and every intermediate of the published float formulas stay
# exact in float64 (2**26 * 2**26 = 2**52 < 2**53): then numpy, Triton and Python's float arithmetic agree.
MAX_IMAGE_SIDE = 2**26
# Images per numpy chunk: bounds the (chunk, candidates) float64 matrix of the InternVL search to ~20 MB.
_CHUNK = 1 << 16
# Qwen2-VL's smart_resize rejects images whose long side exceeds 200x the short side.
QWEN2VL_MAX_RATIO = 200
# Most tiles of an InternVL grid: the configs use 6 to 40; the candidate scan grows as max_num**3
# (256 takes 0.4 s on one core), and an absurd value would never finish.
INTERNVL_MAX_TILES = 256


# --------------------------------------------------------------------------------------------- helpers


def _is_torch(x: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(x, torch.Tensor)


def _is_cuda(x: Any) -> bool:
    return _is_torch(x) and x.is_cuda


def _as_int_array(x: Any, name: str) -> np.ndarray:
    """1-D int64 numpy copy of ``x``; integer-valued floats are accepted, anything else is a TypeError."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        if arr.size == 0:
            return arr.astype(np.int64)
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TypeError(f"{name}[{i}] = {arr[i]!r} is not an integer")
    return arr.astype(np.int64)


def _check_sides(widths: np.ndarray, heights: np.ndarray) -> None:
    if widths.shape != heights.shape:
        raise ValueError(f"widths and heights differ in length: {widths.shape[0]} vs {heights.shape[0]}")
    for name, side in (("widths", widths), ("heights", heights)):
        bad = (side <= 0) | (side > MAX_IMAGE_SIDE)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"image {i}: {name}[{i}] = {int(side[i])} is not in [1, {MAX_IMAGE_SIDE}]")


def _check_positive_int(value: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


# --------------------------------------------------------------------------------------------- InternVL


class TileGrid(NamedTuple):
    """InternVL tiling of N images (all ``(N,)`` int64, numpy or torch like the input)."""

    cols: Any
    """tiles along the width (``target_aspect_ratio[0]``)"""
    rows: Any
    """tiles along the height (``target_aspect_ratio[1]``)"""
    num_tiles: Any
    """``cols * rows`` plus the thumbnail when ``use_thumbnail`` and ``cols * rows > 1``"""


def internvl_target_ratios(min_num: int = 1, max_num: int = 12) -> list[tuple[int, int]]:
    """Candidate ``(cols, rows)`` grids with ``min_num <= cols * rows <= max_num``, in InternVL's scan order.

    InternVL builds the candidates as a set and sorts it by tile count (a stable sort), so grids with the
    same tile count keep the set's iteration order. That order decides exact ties, so it is reproduced here
    by building the same set in the same insertion order.
    """
    min_num = _check_positive_int(min_num, "min_num")
    max_num = _check_positive_int(max_num, "max_num", maximum=INTERNVL_MAX_TILES)
    if max_num < min_num:
        raise ValueError(f"max_num ({max_num}) must be >= min_num ({min_num})")
    grids: set[tuple[int, int]] = set()
    for n in range(min_num, max_num + 1):
        for cols in range(1, n + 1):
            for rows in range(1, n + 1):
                if min_num <= cols * rows <= max_num:
                    grids.add((cols, rows))
    return sorted(grids, key=lambda g: g[0] * g[1])


def _internvl_numpy(widths: np.ndarray, heights: np.ndarray, ratios: list[tuple[int, int]], image_size: int,
                    use_thumbnail: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cand_cols = np.array([r[0] for r in ratios], dtype=np.int64)
    cand_rows = np.array([r[1] for r in ratios], dtype=np.int64)
    cand_aspect = cand_cols / cand_rows
    # InternVL's tie rule: a later candidate with the same difference wins when the image area exceeds
    # half the area of that candidate's tiles; the threshold is evaluated in float64 left to right.
    cand_half_area = 0.5 * image_size * image_size * cand_cols.astype(np.float64) * cand_rows.astype(np.float64)
    n = widths.shape[0]
    cols = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    order = np.arange(len(ratios))
    for lo in range(0, n, _CHUNK):
        w = widths[lo:lo + _CHUNK]
        h = heights[lo:lo + _CHUNK]
        aspect = w / h
        diff = np.abs(aspect[:, None] - cand_aspect[None, :])
        best = diff.min(axis=1, keepdims=True)
        ties = diff == best
        first = ties.argmax(axis=1)
        # The scan keeps the first minimum (strictly smaller than all before it) and then replaces it with
        # every later exact tie whose area test passes; the last such candidate is the answer.
        area = (w * h).astype(np.float64)
        takes = ties & ((area[:, None] > cand_half_area[None, :]) | (order[None, :] == first[:, None]))
        last = len(ratios) - 1 - takes[:, ::-1].argmax(axis=1)
        cols[lo:lo + _CHUNK] = cand_cols[last]
        rows[lo:lo + _CHUNK] = cand_rows[last]
    tiles = cols * rows
    if use_thumbnail:
        tiles = tiles + (tiles != 1)
    return cols, rows, tiles


def internvl_tile_grid(widths: Any, heights: Any, *, min_num: int = 1, max_num: int = 12, image_size: int = 448,
                       use_thumbnail: bool = True) -> TileGrid:
    """InternVL dynamic-resolution tiling of many images at once.

    Args:
        widths, heights: ``(N,)`` image sizes in pixels (``PIL.Image.size`` order is ``(width, height)``);
            lists, numpy arrays or torch tensors. CUDA tensors run the Triton twin.
        min_num, max_num: bounds on the number of tiles of the grid (InternVL-Chat trains with 1 and 6 or 12).
        image_size: tile side in pixels (448 for InternViT-300M/6B).
        use_thumbnail: add one thumbnail tile when the grid has more than one tile (InternVL-Chat configs
            set it; ``dynamic_preprocess``'s own default is False).

    Returns:
        :class:`TileGrid` of ``(N,)`` int64 arrays (torch tensors on the input's device for tensor input).

    Raises:
        ValueError: a non-positive or oversized side (naming the image), bad ``min_num``/``max_num``.
    """
    ratios = internvl_target_ratios(min_num, max_num)
    image_size = _check_positive_int(image_size, "image_size", maximum=MAX_IMAGE_SIDE)
    if _is_cuda(widths) or _is_cuda(heights):
        from .ops.vision_counts import internvl_tile_grid_triton

        cols, rows, tiles = internvl_tile_grid_triton(widths, heights, ratios, image_size, bool(use_thumbnail))
        return TileGrid(cols, rows, tiles)
    w = _as_int_array(widths, "widths")
    h = _as_int_array(heights, "heights")
    _check_sides(w, h)
    cols, rows, tiles = _internvl_numpy(w, h, ratios, image_size, bool(use_thumbnail))
    if _is_torch(widths):
        import torch

        return TileGrid(torch.from_numpy(cols), torch.from_numpy(rows), torch.from_numpy(tiles))
    return TileGrid(cols, rows, tiles)


def internvl_num_tiles(widths: Any, heights: Any, *, min_num: int = 1, max_num: int = 12, image_size: int = 448,
                       use_thumbnail: bool = True) -> Any:
    """``(N,)`` int64 ViT tiles per image (thumbnail included); see :func:`internvl_tile_grid`."""
    return internvl_tile_grid(widths, heights, min_num=min_num, max_num=max_num, image_size=image_size,
                              use_thumbnail=use_thumbnail).num_tiles


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
    factor = _check_positive_int(factor, "factor")
    min_pixels = _check_positive_int(min_pixels, "min_pixels")
    max_pixels = _check_positive_int(max_pixels, "max_pixels")
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    return factor, min_pixels, max_pixels


def _smart_resize_numpy(heights: np.ndarray, widths: np.ndarray, factor: int, min_pixels: int,
                        max_pixels: int) -> tuple[np.ndarray, np.ndarray]:
    ratio = np.maximum(heights, widths) / np.minimum(heights, widths)
    bad = ratio > QWEN2VL_MAX_RATIO
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"image {i}: absolute aspect ratio must be at most {QWEN2VL_MAX_RATIO}, got {ratio[i]} "
                         f"(height {int(heights[i])}, width {int(widths[i])})")
    # round(side / factor) of a float is round-half-to-even; for integer sides it equals this integer form.
    h_bar = _round_half_even_div(heights, factor) * factor
    w_bar = _round_half_even_div(widths, factor) * factor
    area = heights * widths
    h_out = h_bar.copy()
    w_out = w_bar.copy()
    down = h_bar * w_bar > max_pixels
    up = ~down & (h_bar * w_bar < min_pixels)
    if down.any():
        beta = np.sqrt(area[down] / max_pixels)
        h_out[down] = np.maximum(factor, np.floor(heights[down] / beta / factor).astype(np.int64) * factor)
        w_out[down] = np.maximum(factor, np.floor(widths[down] / beta / factor).astype(np.int64) * factor)
    if up.any():
        beta = np.sqrt(min_pixels / area[up])
        h_out[up] = np.ceil(heights[up] * beta / factor).astype(np.int64) * factor
        w_out[up] = np.ceil(widths[up] * beta / factor).astype(np.int64) * factor
    return h_out, w_out


def _round_half_even_div(x: np.ndarray, d: int) -> np.ndarray:
    q, r = np.divmod(x, d)
    return q + ((2 * r > d) | ((2 * r == d) & (q % 2 == 1)))


def qwen2vl_smart_resize(widths: Any, heights: Any, *, factor: int = 28, min_pixels: int = 56 * 56,
                         max_pixels: int = 28 * 28 * 1280) -> tuple[Any, Any]:
    """Qwen2-VL ``smart_resize`` of many images: ``(resized_height, resized_width)``, each ``(N,)`` int64.

    Both sides are rounded (half to even) to multiples of ``factor``; if the area then exceeds
    ``max_pixels`` the image is scaled by ``beta = sqrt(h * w / max_pixels)`` and floored to multiples of
    ``factor`` (at least ``factor``); if it falls below ``min_pixels`` it is scaled by
    ``sqrt(min_pixels / (h * w))`` and ceiled. Defaults are transformers' ``smart_resize`` defaults.

    Args:
        widths, heights: ``(N,)`` sizes in pixels (note the ``(width, height)`` argument order of
            ``PIL.Image.size``; the published function takes ``(height, width)``).

    Raises:
        ValueError: a side <= 0 or above ``MAX_IMAGE_SIDE``, or an aspect ratio above 200 (as published),
            naming the image.
    """
    factor, min_pixels, max_pixels = _check_pixels(factor, min_pixels, max_pixels)
    if _is_cuda(widths) or _is_cuda(heights):
        from .ops.vision_counts import smart_resize_triton

        return smart_resize_triton(widths, heights, factor, min_pixels, max_pixels)
    w = _as_int_array(widths, "widths")
    h = _as_int_array(heights, "heights")
    _check_sides(w, h)
    h_out, w_out = _smart_resize_numpy(h, w, factor, min_pixels, max_pixels)
    if _is_torch(widths):
        import torch

        return torch.from_numpy(h_out), torch.from_numpy(w_out)
    return h_out, w_out


def qwen2vl_grid(widths: Any, heights: Any, num_frames: Any = None, *, patch_size: int = 14, merge_size: int = 2,
                 temporal_patch_size: int = 2, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> ResizedGrid:
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
    patch_size = _check_positive_int(patch_size, "patch_size", maximum=MAX_IMAGE_SIDE)
    merge_size = _check_positive_int(merge_size, "merge_size", maximum=MAX_IMAGE_SIDE)
    temporal_patch_size = _check_positive_int(temporal_patch_size, "temporal_patch_size", maximum=MAX_IMAGE_SIDE)
    factor = patch_size * merge_size
    h_out, w_out = qwen2vl_smart_resize(widths, heights, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    if _is_torch(h_out):
        import torch

        if num_frames is None:
            t = torch.ones_like(h_out)
        else:
            t = torch.as_tensor(num_frames, device=h_out.device).to(torch.int64)
            if t.shape != h_out.shape:
                raise ValueError(f"num_frames has shape {tuple(t.shape)}, expected {tuple(h_out.shape)}")
            if bool((t <= 0).any()):
                raise ValueError(f"video {int(torch.nonzero(t <= 0)[0, 0])}: num_frames must be >= 1")
        grid = torch.stack([(t + temporal_patch_size - 1) // temporal_patch_size, h_out // patch_size,
                            w_out // patch_size], dim=1)
    else:
        if num_frames is None:
            t = np.ones_like(h_out)
        else:
            t = _as_int_array(num_frames, "num_frames")
            if t.shape != h_out.shape:
                raise ValueError(f"num_frames has shape {t.shape}, expected {h_out.shape}")
            if (t <= 0).any():
                raise ValueError(f"video {int(np.flatnonzero(t <= 0)[0])}: num_frames must be >= 1")
        grid = np.stack([(t + temporal_patch_size - 1) // temporal_patch_size, h_out // patch_size,
                         w_out // patch_size], axis=1)
    patches = grid[:, 0] * grid[:, 1] * grid[:, 2]
    return ResizedGrid(h_out, w_out, grid, patches, patches // (merge_size * merge_size))


# --------------------------------------------------------------------------------------------- loads


class Loads(NamedTuple):
    """Per-sample loads the balancer needs (``(N,)`` int64 each)."""

    vit: np.ndarray
    """ViT load: InternVL tiles (thumbnail included) or Qwen2-VL patches"""
    llm: np.ndarray
    """LLM load: text tokens plus image tokens"""


_MODELS = ("internvl", "qwen2vl")


def _flatten_image_sizes(image_sizes: Sequence[Any], progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample ``None`` / ``(w, h)`` / list of ``(w, h)`` -> ``(M, 2)`` sizes and ``(M,)`` owning sample."""
    from tqdm.auto import tqdm

    sizes: list[Any] = []
    owner: list[int] = []
    for i, entry in enumerate(tqdm(image_sizes, desc="reading image sizes", unit="sample", disable=not progress,
                                   mininterval=1.0)):
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
    if not sizes:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64)
    flat = np.concatenate(sizes, axis=0)
    if not np.issubdtype(flat.dtype, np.integer):
        flat_f = flat.astype(np.float64)
        if (flat_f != np.floor(flat_f)).any():
            j = int(np.flatnonzero((flat_f != np.floor(flat_f)).any(axis=1))[0])
            raise TypeError(f"sample {owner[j]}: image size {flat[j].tolist()} is not integral")
    return flat.astype(np.int64), np.asarray(owner, dtype=np.int64)


def _check_sample_sizes(sizes: np.ndarray, owner: np.ndarray, model: str) -> None:
    """Validate all image sizes up front so that errors name the sample, not a row of a chunk."""
    if sizes.shape[0] == 0:
        return
    w = _as_int_array(sizes[:, 0], "image widths")
    h = _as_int_array(sizes[:, 1], "image heights")
    bad = (w <= 0) | (h <= 0) | (w > MAX_IMAGE_SIDE) | (h > MAX_IMAGE_SIDE)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sample {int(owner[j])}: image size {int(w[j])}x{int(h[j])} (width x height) has a side "
                         f"outside [1, {MAX_IMAGE_SIDE}]")
    if model == "qwen2vl":
        ratio = np.maximum(w, h) / np.minimum(w, h)
        bad = ratio > QWEN2VL_MAX_RATIO
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sample {int(owner[j])}: image {int(w[j])}x{int(h[j])} has aspect ratio {ratio[j]:.1f}, "
                             f"above Qwen2-VL's limit of {QWEN2VL_MAX_RATIO}")


def compute_loads(image_sizes: Any, text_tokens: Any, *, model: str = "internvl", image_to_sample: Any = None,
                  num_frames: Any = None, num_image_token: int = 256, min_num: int = 1, max_num: int = 12,
                  image_size: int = 448, use_thumbnail: bool = True, patch_size: int = 14, merge_size: int = 2,
                  temporal_patch_size: int = 2, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280,
                  progress: bool = True) -> Loads:
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
        progress: show a tqdm progress bar.

    Returns:
        :class:`Loads` with ``vit`` and ``llm`` of shape ``(N,)`` int64.

    Raises:
        ValueError: unknown model, bad sizes (naming the sample), negative text lengths, mismatched lengths.
    """
    from tqdm.auto import tqdm

    if model not in _MODELS:
        raise ValueError(f"model must be one of {_MODELS}, got {model!r}")
    num_image_token = _check_positive_int(num_image_token, "num_image_token", minimum=0, maximum=2**31 - 1)
    text = _as_int_array(text_tokens, "text_tokens")
    n = text.shape[0]
    if (text < 0).any():
        i = int(np.flatnonzero(text < 0)[0])
        raise ValueError(f"sample {i}: text_tokens = {int(text[i])} is negative")
    if image_to_sample is None:
        if num_frames is not None:
            raise ValueError("num_frames needs the flat layout (image_sizes as (M, 2) with image_to_sample)")
        if len(image_sizes) != n:
            raise ValueError(f"image_sizes has {len(image_sizes)} samples but text_tokens has {n}")
        sizes, owner = _flatten_image_sizes(image_sizes, progress)
    else:
        sizes = np.asarray(image_sizes.detach().cpu() if _is_torch(image_sizes) else image_sizes)
        if sizes.size == 0:
            sizes = sizes.reshape(0, 2)
        if sizes.ndim != 2 or sizes.shape[1] != 2:
            raise ValueError(f"image_sizes must be (M, 2) with image_to_sample, got shape {tuple(sizes.shape)}")
        owner = _as_int_array(image_to_sample, "image_to_sample") if sizes.shape[0] else np.zeros(0, np.int64)
        if owner.shape[0] != sizes.shape[0]:
            raise ValueError(f"image_to_sample has {owner.shape[0]} entries for {sizes.shape[0]} images")
        if owner.size and (owner.min() < 0 or owner.max() >= n):
            j = int(np.flatnonzero((owner < 0) | (owner >= n))[0])
            raise ValueError(f"image_to_sample[{j}] = {int(owner[j])} is not a sample index in [0, {n})")
    frames = None if num_frames is None else _as_int_array(num_frames, "num_frames")
    if frames is not None and frames.shape[0] != sizes.shape[0]:
        raise ValueError(f"num_frames has {frames.shape[0]} entries for {sizes.shape[0]} images")
    _check_sample_sizes(sizes, owner, model)
    vit_per_image = np.zeros(sizes.shape[0], dtype=np.int64)
    llm_per_image = np.zeros(sizes.shape[0], dtype=np.int64)
    with tqdm(total=sizes.shape[0], desc=f"counting {model} images", unit="img", disable=not progress,
              mininterval=1.0) as bar:
        for lo in range(0, sizes.shape[0], _CHUNK):
            hi = min(lo + _CHUNK, sizes.shape[0])
            w = _as_int_array(sizes[lo:hi, 0], "widths")
            h = _as_int_array(sizes[lo:hi, 1], "heights")
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
    vit = np.bincount(owner, weights=vit_per_image, minlength=n).astype(np.int64) if owner.size else np.zeros(n, np.int64)
    img_llm = np.bincount(owner, weights=llm_per_image, minlength=n).astype(np.int64) if owner.size else np.zeros(n, np.int64)
    return Loads(vit, text + img_llm)


def write_lengths(path: str | Path, loads: Loads | Mapping[str, Any], *, fmt: str | None = None,
                  allow_empty: bool = False) -> Path:
    """Write per-sample loads as a length file, atomically (a temporary file renamed into place).

    Args:
        path: ``.json`` for the OmniBal format (a list of ``{"vit_num": int, "token_num": int}``, one per
            sample) or ``.npz`` for int32 arrays ``vit`` and ``llm``.
        loads: :class:`Loads` or a mapping with ``vit`` and ``llm`` ``(N,)``.
        fmt: ``"json"`` or ``"npz"`` to override the suffix.
        allow_empty: write a file without samples (``load_lengths`` reads it only with ``allow_empty=True``).

    Returns:
        The path written.

    Raises:
        ValueError: values ``load_lengths`` would refuse (negative, non-integer, ``>= 2**31``, no samples),
            naming the sample; an unknown format.
    """
    from .lengths import _write_length_file

    vit = loads[0] if isinstance(loads, tuple) else loads["vit"]
    llm = loads[1] if isinstance(loads, tuple) else loads["llm"]
    vit, llm = (x.detach().cpu().numpy() if _is_torch(x) else x for x in (vit, llm))
    return _write_length_file(path, vit, llm, fmt=fmt, allow_empty=allow_empty)


# --------------------------------------------------------------------------------------------- CLI


def _read_records(path: Path) -> list[Mapping[str, Any]]:
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a records file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark is skipped
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON list of records ({exc})") from exc
    else:
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                records.extend([json.loads(line)] if line.strip() else [])
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {n} is not a JSON record ({exc.msg}, column {exc.colno})") from exc
    if not isinstance(records, list) or not records:
        raise ValueError(f"{path}: no records (expected a JSON list of objects or JSON Lines)")
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise ValueError(f"{path}: record {i} is not a JSON object")
    return records


def _record_fields(records: Sequence[Mapping[str, Any]], sizes_key: str, text_key: str,
                   frames_key: str | None) -> tuple[list[Any], list[int], list[int] | None]:
    sizes: list[Any] = []
    text: list[int] = []
    frames: list[int] = [] if frames_key else None  # type: ignore[assignment]
    for i, rec in enumerate(records):
        entry = rec.get(sizes_key)
        if entry is None and "width" in rec and "height" in rec:
            entry = [rec["width"], rec["height"]]
        sizes.append(entry)
        if text_key not in rec:
            raise ValueError(f"record {i}: no {text_key!r} field (text tokens, an int or a token list)")
        value = rec[text_key]
        if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
            raise ValueError(f"record {i}: {text_key!r} must be a token count or a token list, got {value!r}")
        text.append(len(value) if isinstance(value, (list, tuple)) else value)
        if frames is not None:
            frames.append(rec.get(frames_key, 1))
    return sizes, text, frames


def add_lengths_parser(subparsers: Any) -> Any:
    """Add the ``lengths`` subcommand to an ``argparse`` subparsers object; returns its parser."""
    p = subparsers.add_parser(
        "lengths",
        help="build a length file (vit/llm loads) from image sizes and text lengths",
        description="Read records (JSON list or JSON lines) with image sizes and text token counts and write the "
                    "per-sample vit/llm loads as an OmniBal .json or an .npz length file.",
    )
    p.add_argument("input", type=Path, help="records: JSON list or JSON lines")
    p.add_argument("-o", "--output", type=Path, required=True, help="length file to write (.json or .npz)")
    p.add_argument("--model", choices=_MODELS, default="internvl")
    p.add_argument("--sizes-key", default="image_sizes",
                   help="field with [width, height] or a list of them (else 'width'/'height' fields)")
    p.add_argument("--text-key", default="text_tokens", help="field with the text token count or token list")
    p.add_argument("--frames-key", default=None, help="qwen2vl: field with frames per record (one video each)")
    p.add_argument("--num-image-token", type=int, default=256, help="internvl: LLM tokens per tile")
    p.add_argument("--min-num", type=int, default=1, help="internvl: fewest tiles")
    p.add_argument("--max-num", type=int, default=12, help="internvl: most tiles")
    p.add_argument("--image-size", type=int, default=448, help="internvl: tile side")
    p.add_argument("--no-thumbnail", dest="use_thumbnail", action="store_false", help="internvl: no thumbnail tile")
    p.add_argument("--patch-size", type=int, default=14, help="qwen2vl: ViT patch side")
    p.add_argument("--merge-size", type=int, default=2, help="qwen2vl: spatial merge")
    p.add_argument("--temporal-patch-size", type=int, default=2, help="qwen2vl: frames per temporal patch")
    p.add_argument("--min-pixels", type=int, default=56 * 56, help="qwen2vl: smart_resize min_pixels")
    p.add_argument("--max-pixels", type=int, default=28 * 28 * 1280, help="qwen2vl: smart_resize max_pixels")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run_lengths)
    return p


def run_lengths(args: Any) -> int:
    """Run the ``lengths`` subcommand from parsed ``args``; prints a one-line summary, returns 0."""
    records = _read_records(Path(args.input))
    try:  # errors in the records name the input file
        sizes, text, frames = _record_fields(records, args.sizes_key, args.text_key, args.frames_key)
        common = dict(model=args.model, num_image_token=args.num_image_token, min_num=args.min_num,
                      max_num=args.max_num, image_size=args.image_size, use_thumbnail=args.use_thumbnail,
                      patch_size=args.patch_size, merge_size=args.merge_size,
                      temporal_patch_size=args.temporal_patch_size, min_pixels=args.min_pixels,
                      max_pixels=args.max_pixels, progress=args.progress)
        if frames is not None:
            flat, owner = _flatten_image_sizes(sizes, False)
            counts = np.bincount(owner, minlength=len(sizes)) if owner.size else np.zeros(len(sizes), np.int64)
            if (counts > 1).any():
                raise ValueError(f"record {int(np.flatnonzero(counts > 1)[0])}: --frames-key needs one video per "
                                 "record")
            loads = compute_loads(flat, text, image_to_sample=owner,
                                  num_frames=np.asarray(frames, dtype=np.int64)[owner], **common)
        else:
            loads = compute_loads(sizes, text, **common)
    except (TypeError, ValueError) as exc:
        raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{args.input}: {exc}") from exc
    out = write_lengths(args.output, loads)
    print(f"wrote {len(text)} samples to {out}: vit total {int(loads.vit.sum())}, llm total {int(loads.llm.sum())}")
    return 0


def main_lengths(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``omnibal-kernels lengths ...``; ``argv`` are the arguments after ``lengths``."""
    import argparse

    parser = argparse.ArgumentParser(prog="omnibal-kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    add_lengths_parser(sub)
    args = parser.parse_args(["lengths", *(argv if argv is not None else [])])
    return int(args.func(args))


# --------------------------------------------------------------------------------------------- bucketing


class PatchBuckets(NamedTuple):
    """Images grouped by patch count (numpy arrays, or torch tensors on the input's device)."""

    perm: Any
    """``(N,)`` int64: image indices bucket by bucket, original order inside each bucket (stable)"""
    offsets: Any
    """``(K + 1,)`` int64: bucket ``b`` holds ``perm[offsets[b]:offsets[b + 1]]``; ``offsets[-1] == N``"""
    bucket_ids: Any
    """``(N,)`` int32: bucket of each image, in the original order"""
    boundaries: Any
    """``(K - 1,)`` int64: bucket ``b >= 1`` holds counts ``>= boundaries[b - 1]`` and ``< boundaries[b]``"""


def bucket_by_patches(counts: Any, boundaries: Any = None, *, num_buckets: int | None = None) -> PatchBuckets:
    """Group images by patch count with a stable counting sort (histogram, exclusive scan, scatter).

    A ViT without varlen attention can run each bucket as a dense batch; with the default (one bucket per
    distinct count) that batch has no padding at all. A balancer can spread whole buckets over ranks.

    Args:
        counts: ``(N,)`` non-negative patch (or tile) counts per image: list, numpy array or torch tensor.
            CUDA tensors run the Triton op (:mod:`omnibal_kernels.ops.bucket`), everything else the numba
            twin (:mod:`omnibal_kernels.cpu.bucket`).
        boundaries: ``(K - 1,)`` non-decreasing bucket edges: the bucket of a count is the number of
            boundaries ``<=`` it, so bucket 0 is ``[0, boundaries[0])`` and the last is
            ``[boundaries[-1], inf)``.
        num_buckets: instead of ``boundaries``, ``K`` buckets of about equal numbers of images: boundaries
            are the counts at ranks ``k * N // K`` of the sorted counts (equal counts never split, so some
            buckets can be empty).

    With neither, there is one bucket per distinct count, in increasing order.

    Returns:
        :class:`PatchBuckets`.

    Raises:
        ValueError: both ``boundaries`` and ``num_buckets``, negative counts, decreasing boundaries.
    """
    if boundaries is not None and num_buckets is not None:
        raise ValueError("give boundaries or num_buckets, not both")
    if num_buckets is not None:
        num_buckets = _check_positive_int(num_buckets, "num_buckets")
    if _is_cuda(counts):
        import torch

        from .ops.bucket import bucket_sort as _gpu_sort

        if counts.dim() != 1:
            raise ValueError(f"counts must be 1-D, got shape {tuple(counts.shape)}")
        if counts.dtype.is_floating_point or counts.dtype == torch.bool:
            raise TypeError(f"counts must be an integer tensor, got {counts.dtype}")
        c = counts.to(torch.int64)
        if c.numel() and bool((c < 0).any()):
            raise ValueError(f"counts[{int(torch.nonzero(c < 0)[0, 0])}] is negative")
        if boundaries is not None:
            bnd = torch.as_tensor(boundaries, device=c.device).to(torch.int64).reshape(-1)
            if bnd.numel() > 1 and bool((bnd[1:] < bnd[:-1]).any()):
                raise ValueError("boundaries must be non-decreasing")
        elif num_buckets is not None:
            sorted_counts = torch.sort(c).values
            ranks = torch.arange(1, num_buckets, device=c.device) * c.numel() // num_buckets
            bnd = sorted_counts[ranks] if c.numel() else torch.zeros(num_buckets - 1, dtype=torch.int64,
                                                                      device=c.device)
        else:
            bnd = torch.unique(c)[1:]
        return _gpu_sort(c, bnd)
    from .cpu.bucket import bucket_sort as _cpu_sort

    c = _as_int_array(counts, "counts")
    if (c < 0).any():
        raise ValueError(f"counts[{int(np.flatnonzero(c < 0)[0])}] = {int(c[np.flatnonzero(c < 0)[0]])} is negative")
    if boundaries is not None:
        bnd = _as_int_array(boundaries, "boundaries") if np.size(boundaries) else np.zeros(0, np.int64)
        if (np.diff(bnd) < 0).any():
            raise ValueError("boundaries must be non-decreasing")
    elif num_buckets is not None:
        ranks = np.arange(1, num_buckets) * c.shape[0] // num_buckets
        bnd = np.sort(c)[ranks] if c.shape[0] else np.zeros(num_buckets - 1, np.int64)
    else:
        bnd = np.unique(c)[1:]
    out = _cpu_sort(c, bnd)
    if _is_torch(counts):
        import torch

        return PatchBuckets(*(torch.from_numpy(np.ascontiguousarray(x)) for x in out))
    return out


# --------------------------------------------------------------------------------------------- mRoPE


class MRopePositions(NamedTuple):
    """Qwen2-VL multimodal rotary positions of a packed batch of ``B`` samples, ``T`` tokens in all."""

    position_ids: Any
    """``(3, 1, T)`` int64 temporal/height/width positions; the three rows are equal on text tokens"""
    text_position_ids: Any
    """``(1, T)`` int64 ``0..len-1`` per sample: the 1-D positions packed-sequence detection looks at"""
    rope_deltas: Any
    """``(B,)`` int64 per sample ``max position + 1 - len`` (what ``get_rope_index`` returns for generation)"""


def _grid_rows(grid: Any, name: str) -> np.ndarray:
    if grid is None:
        return np.zeros((0, 3), dtype=np.int64)
    arr = np.asarray(grid.detach().cpu() if _is_torch(grid) else grid)
    if arr.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name} must be (num, 3) rows of (t, h, w), got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if (arr <= 0).any():
        raise ValueError(f"{name} row {int(np.flatnonzero((arr <= 0).any(axis=1))[0])} has a non-positive entry")
    return arr.astype(np.int64)


def _as_ids(x: Any, i: int) -> np.ndarray:
    arr = np.asarray(x.detach().cpu() if _is_torch(x) else x)
    if arr.ndim != 1:
        raise ValueError(f"sample {i}: input_ids must be 1-D, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"sample {i}: input_ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def mrope_position_ids(input_ids: Sequence[Any], image_grid_thw: Any = None, video_grid_thw: Any = None, *,
                       image_token_id: int, video_token_id: int | None = None, spatial_merge_size: int = 2,
                       second_per_grid_ts: Any = None, tokens_per_second: float | None = None) -> MRopePositions:
    """Qwen2-VL / Qwen2.5-VL mRoPE ``position_ids`` for samples packed into one row, restarting per sample.

    Each sample follows ``get_rope_index``: text tokens advance all three positions by one; an image or video
    is a run of ``t * (h / m) * (w / m)`` placeholder tokens (``m = spatial_merge_size``) in ``(t, h, w)``
    row-major order whose positions are ``start + (t_index, h_index, w_index)``, where ``start`` is the
    position the first placeholder would have had as text; the text after it continues from the largest
    position used plus one. ``t_index`` is ``0..t-1``, or for Qwen2.5-VL videos (``second_per_grid_ts`` and
    ``tokens_per_second`` given) ``floor(k * second_per_grid_t * tokens_per_second)``.

    Args:
        input_ids: ``B`` per-sample 1-D token sequences (tensors, arrays or lists).
        image_grid_thw: ``(I, 3)`` rows for all images of the batch in order of appearance (as a Hugging Face
            processor returns them), or a list with one ``(I_b, 3)`` entry per sample.
        video_grid_thw: the same for videos (needs ``video_token_id``).
        image_token_id, video_token_id: the placeholder tokens (``<|image_pad|>``, ``<|video_pad|>``).
        second_per_grid_ts: ``(V,)`` seconds per temporal grid step of each video (Qwen2.5-VL).
        tokens_per_second: the vision config's ``tokens_per_second`` (Qwen2.5-VL; 2 for the released models).

    Returns:
        :class:`MRopePositions` of torch tensors.

    Raises:
        ValueError: a placeholder run that does not match its grid, grids left over or missing, naming the sample.
    """
    import torch

    m = _check_positive_int(spatial_merge_size, "spatial_merge_size")
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        raise TypeError("input_ids must be a sequence of per-sample token sequences")
    if len(input_ids) == 0:
        raise ValueError("input_ids is empty: no samples")
    if (second_per_grid_ts is None) != (tokens_per_second is None):
        raise ValueError("second_per_grid_ts and tokens_per_second go together (Qwen2.5-VL videos)")
    ids_list = [_as_ids(x, i) for i, x in enumerate(input_ids)]
    kinds = [("image", image_grid_thw, image_token_id)]
    if video_grid_thw is not None:
        if video_token_id is None:
            raise ValueError("video_grid_thw needs video_token_id")
        kinds.append(("video", video_grid_thw, video_token_id))
    # per sample, per kind: the grid rows of that sample
    per_sample: dict[str, list[np.ndarray]] = {}
    for kind, grid, token in kinds:
        if isinstance(grid, (list, tuple)) and len(grid) == len(ids_list) and all(
                g is None or np.ndim(g.detach().cpu() if _is_torch(g) else g) == 2 for g in grid):
            per_sample[kind] = [_grid_rows(g, f"{kind}_grid_thw[{i}]") for i, g in enumerate(grid)]
            continue
        rows = _grid_rows(grid, f"{kind}_grid_thw")
        tokens_per_item = rows[:, 0] * (rows[:, 1] // m) * (rows[:, 2] // m)
        splits, k = [], 0
        for i, ids in enumerate(ids_list):
            need = int((ids == token).sum())
            start = k
            while need > 0 and k < rows.shape[0]:
                need -= int(tokens_per_item[k])
                k += 1
            if need != 0:
                raise ValueError(f"sample {i}: its {kind} placeholder tokens do not add up to whole "
                                 f"{kind}_grid_thw rows (rows {start}..{k - 1})")
            splits.append(rows[start:k])
        if k != rows.shape[0]:
            raise ValueError(f"{kind}_grid_thw has {rows.shape[0]} rows but the samples use {k}")
        per_sample[kind] = splits
    seconds = None
    if second_per_grid_ts is not None:
        seconds = np.asarray(second_per_grid_ts.detach().cpu() if _is_torch(second_per_grid_ts)
                             else second_per_grid_ts, dtype=np.float64).reshape(-1)
    video_counter = 0
    pieces, text_pieces, deltas = [], [], []
    for i, ids in enumerate(ids_list):
        n = ids.shape[0]
        tokens = {kind: tok for kind, _, tok in kinds}
        is_visual = np.zeros(n, dtype=bool)
        for tok in tokens.values():
            is_visual |= ids == tok
        visual_pos = np.flatnonzero(is_visual)
        queues = {kind: list(per_sample[kind][i]) for kind in tokens}
        used = {kind: 0 for kind in tokens}
        pos = np.zeros((3, n), dtype=np.int64)
        shift = np.zeros(n + 1, dtype=np.int64)  # text position = index + cumulative shift
        items = []
        st, acc = 0, 0
        while True:
            j = np.searchsorted(visual_pos, st)
            if j >= visual_pos.shape[0]:
                break
            p = int(visual_pos[j])
            kind = "image" if ids[p] == image_token_id else "video"
            if used[kind] >= len(queues[kind]):
                raise ValueError(f"sample {i}: more {kind} placeholders than {kind}_grid_thw rows")
            t, h, w = (int(v) for v in queues[kind][used[kind]])
            used[kind] += 1
            if h % m or w % m:
                raise ValueError(f"sample {i}: {kind} grid {(t, h, w)} is not divisible by spatial_merge_size {m}")
            gh, gw = h // m, w // m
            length = t * gh * gw
            if p + length > n or not (ids[p:p + length] == tokens[kind]).all():
                raise ValueError(f"sample {i}: {kind} at token {p} needs {length} consecutive placeholders "
                                 f"for grid {(t, h, w)}")
            if kind == "video" and seconds is not None:
                if video_counter >= seconds.shape[0]:
                    raise ValueError("second_per_grid_ts has fewer entries than videos")
                t_steps = np.floor(np.arange(t) * seconds[video_counter] * float(tokens_per_second)).astype(np.int64)
            else:
                t_steps = np.arange(t, dtype=np.int64)
            if kind == "video":
                video_counter += 1
            start = p + acc
            tt = np.repeat(t_steps, gh * gw)
            hh = np.tile(np.repeat(np.arange(gh, dtype=np.int64), gw), t)
            ww = np.tile(np.arange(gw, dtype=np.int64), t * gh)
            pos[0, p:p + length] = start + tt
            pos[1, p:p + length] = start + hh
            pos[2, p:p + length] = start + ww
            span = max(int(t_steps[-1]), gh - 1, gw - 1) + 1
            acc += span - length
            shift[p + length] += span - length
            items.append((p, length))
            st = p + length
        for kind in tokens:
            if used[kind] != len(queues[kind]):
                raise ValueError(f"sample {i}: {len(queues[kind])} {kind}_grid_thw rows but {used[kind]} "
                                 f"{kind} placeholder runs")
        text_pos = np.arange(n, dtype=np.int64) + np.cumsum(shift)[:n]
        text_mask = np.ones(n, dtype=bool)
        for p, length in items:
            text_mask[p:p + length] = False
        pos[:, text_mask] = text_pos[text_mask]
        pieces.append(pos)
        text_pieces.append(np.arange(n, dtype=np.int64))
        deltas.append((int(pos.max()) + 1 - n) if n else 0)
    if seconds is not None and video_counter != seconds.shape[0]:
        raise ValueError(f"second_per_grid_ts has {seconds.shape[0]} entries for {video_counter} videos")
    position_ids = torch.from_numpy(np.concatenate(pieces, axis=1)).reshape(3, 1, -1)
    text_position_ids = torch.from_numpy(np.concatenate(text_pieces)).reshape(1, -1)
    return MRopePositions(position_ids, text_position_ids, torch.tensor(deltas, dtype=torch.int64))


# --------------------------------------------------------------------------------------------- multimodal fields


def _pixel_layout(samples: Sequence[Mapping[str, Any]], pixel_key: str = "pixel_values",
                  grid_key: str = "image_grid_thw") -> tuple[list[int], str | None]:
    """Indices of samples with pixels and the common layout: ``"tiles"`` (n, C, H, W) or ``"patches"`` (n, D)."""
    import torch

    with_pixels: list[int] = []
    layout: str | None = None
    ref_shape: tuple[int, ...] = ()
    ref_dtype = None
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise TypeError(f"sample {i}: expected a mapping, got {type(s).__name__}")
        pv = s.get(pixel_key)
        if pv is None:
            grid = s.get(grid_key)
            if grid is not None and (grid.numel() if isinstance(grid, torch.Tensor) else len(grid)) > 0:
                raise ValueError(f"sample {i}: {grid_key} without {pixel_key}")
            continue
        if not isinstance(pv, torch.Tensor):
            raise TypeError(f"sample {i}: {pixel_key} must be a torch tensor, got {type(pv).__name__}")
        if pv.dim() == 4:
            this = "tiles"
        elif pv.dim() == 2:
            this = "patches"
        else:
            raise ValueError(f"sample {i}: {pixel_key} must be (n, C, H, W) tiles or (n_patches, D) patches, "
                             f"got shape {tuple(pv.shape)}")
        if layout is None:
            layout, ref_shape, ref_dtype = this, tuple(pv.shape[1:]), pv.dtype
        elif this != layout or tuple(pv.shape[1:]) != ref_shape:
            raise ValueError(f"sample {i}: {pixel_key} shape {tuple(pv.shape)} does not match the batch's "
                             f"(n, {', '.join(map(str, ref_shape))})")
        elif pv.dtype != ref_dtype:
            raise ValueError(f"sample {i}: {pixel_key} dtype {pv.dtype} differs from the batch's {ref_dtype}")
        with_pixels.append(i)
    return with_pixels, layout


def pack_vision_fields(samples: Sequence[Mapping[str, Any]], *, spatial_merge_size: int | None = None,
                       shared: bool = False, pixel_key: str = "pixel_values",
                       grid_key: str = "image_grid_thw") -> dict:
    """Concatenate the vision fields of a batch of samples (the multimodal half of packing).

    A sample may carry ``pixel_values`` as InternVL-style tiles ``(n, C, H, W)`` (each tile one ViT sequence)
    or Qwen2-VL-style flat patches ``(n_patches, D)`` with optional ``image_grid_thw`` ``(k, 3)`` whose
    ``t * h * w`` add up to ``n_patches`` (without it the sample's patches are one image). Samples without
    ``pixel_values`` (text only) contribute nothing; all others share one layout and dtype.

    Returns:
        ``{}`` when no sample has pixels, else a dict with
        ``pixel_values`` (``(sum n, C, H, W)`` or ``(sum n_patches, D)``, samples in batch order);
        ``vit_cu_seqlens`` int32 ``(S + 1,)``: ViT attention segments in rows of ``pixel_values`` (one per tile;
        one per frame group of each image for grids, exactly as Qwen2-VL's vision tower segments them; one
        per image otherwise); ``vit_max_seqlen`` Python int; ``image_to_sample`` int32 ``(I,)``: sample of
        each image (tile); ``num_images`` int32 ``(B,)``: images (tiles) per sample; and ``image_grid_thw``
        int64 ``(I, 3)`` when the samples give grids.

    ``spatial_merge_size``: check that grid heights and widths are multiples of it. ``shared``: allocate
    ``pixel_values`` in shared memory (inside DataLoader workers, so handing it over copies nothing).
    ``pixel_key``/``grid_key``: read these sample keys instead (``"pixel_values_videos"``/``"video_grid_thw"``
    for videos); the output keys stay the same.

    Raises:
        ValueError/TypeError: mixed layouts or dtypes, grids that do not cover the patches, naming the sample.
    """
    import torch

    if len(samples) == 0:
        raise ValueError("empty batch: no samples")
    with_pixels, layout = _pixel_layout(samples, pixel_key, grid_key)
    if layout is None:
        return {}
    b = len(samples)
    num_images = np.zeros(b, dtype=np.int64)
    image_rows: list[np.ndarray] = []
    segment_rows: list[np.ndarray] = []
    grids: list[np.ndarray] = []
    has_grid: bool | None = None
    for i in with_pixels:
        pv = samples[i][pixel_key]
        n = int(pv.shape[0])
        grid = samples[i].get(grid_key)
        if layout == "tiles":
            if grid is not None:
                raise ValueError(f"sample {i}: {grid_key} given with (n, C, H, W) tiles")
            num_images[i] = n
            image_rows.append(np.ones(n, dtype=np.int64))
            segment_rows.append(np.ones(n, dtype=np.int64))
            continue
        this_has = grid is not None
        if has_grid is None:
            has_grid = this_has
        elif has_grid != this_has:
            raise ValueError(f"sample {i}: {grid_key} must be given for all samples with {pixel_key} or none")
        if not this_has:
            num_images[i] = 1
            image_rows.append(np.array([n], dtype=np.int64))
            segment_rows.append(np.array([n], dtype=np.int64))
            continue
        rows = _grid_rows(grid, f"sample {i}: {grid_key}")
        if spatial_merge_size is not None and ((rows[:, 1:] % spatial_merge_size) != 0).any():
            raise ValueError(f"sample {i}: {grid_key} h/w must be multiples of {spatial_merge_size}")
        per_image = rows[:, 0] * rows[:, 1] * rows[:, 2]
        if int(per_image.sum()) != n:
            raise ValueError(f"sample {i}: {grid_key} covers {int(per_image.sum())} patches but {pixel_key} "
                             f"has {n}")
        num_images[i] = rows.shape[0]
        image_rows.append(per_image)
        segment_rows.append(np.repeat(rows[:, 1] * rows[:, 2], rows[:, 0]))
        grids.append(rows)
    seg = np.concatenate(segment_rows)
    cu = np.zeros(seg.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg, out=cu[1:])
    if cu[-1] >= 2**31:
        raise ValueError(f"{int(cu[-1])} pixel rows overflow int32 vit_cu_seqlens")
    parts = [samples[i][pixel_key] for i in with_pixels]
    if shared:
        rows_total = sum(int(p.shape[0]) for p in parts)
        pixels = _shared_empty((rows_total, *parts[0].shape[1:]), parts[0].dtype)
        torch.cat(parts, dim=0, out=pixels)
    else:
        pixels = torch.cat(parts, dim=0)
    out = {
        "pixel_values": pixels,
        "vit_cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        "vit_max_seqlen": int(seg.max()) if seg.size else 0,
        "image_to_sample": torch.from_numpy(np.repeat(np.arange(b, dtype=np.int32), num_images)),
        "num_images": torch.from_numpy(num_images.astype(np.int32)),
    }
    if grids:
        out["image_grid_thw"] = torch.from_numpy(np.concatenate(grids, axis=0))
    return out


def unpack_vision_fields(fields: Mapping[str, Any], batch_size: int | None = None) -> list[dict]:
    """Inverse of :func:`pack_vision_fields`: one dict per sample with its ``pixel_values`` (and
    ``image_grid_thw``), empty for text-only samples. Row slices are views of the packed tensor."""
    if not fields:
        if batch_size is None:
            raise ValueError("batch_size is needed to unpack a batch without vision fields")
        return [{} for _ in range(batch_size)]
    num_images = np.asarray(fields["num_images"]).astype(np.int64)
    grid = fields.get("image_grid_thw")
    pv = fields["pixel_values"]
    if grid is not None:
        g = np.asarray(grid).astype(np.int64)
        image_rows = g[:, 0] * g[:, 1] * g[:, 2]
    elif pv.dim() == 4:
        image_rows = np.ones(int(num_images.sum()), dtype=np.int64)
    else:
        cu = np.asarray(fields["vit_cu_seqlens"]).astype(np.int64)
        image_rows = np.diff(cu)
    img_cu = np.concatenate([[0], np.cumsum(num_images)])
    row_cu = np.concatenate([[0], np.cumsum(image_rows)])
    out: list[dict] = []
    for i in range(num_images.shape[0]):
        a, b = int(img_cu[i]), int(img_cu[i + 1])
        if a == b:
            out.append({})
            continue
        d = {"pixel_values": pv[int(row_cu[a]):int(row_cu[b])]}
        if grid is not None:
            d["image_grid_thw"] = grid[a:b]
        out.append(d)
    return out


# --------------------------------------------------------------------------------------------- pack_batch hook

# Sample keys the hook consumes (omnibal_kernels.packing._FIELD_PACKERS sends them here) and the keys it adds.
_VIDEO_RENAME = {
    "pixel_values": "pixel_values_videos",
    "image_grid_thw": "video_grid_thw",
    "vit_cu_seqlens": "video_vit_cu_seqlens",
    "vit_max_seqlen": "video_vit_max_seqlen",
    "image_to_sample": "video_to_sample",
    "num_images": "num_videos",
}
_PRODUCED = frozenset(
    ("vit_cu_seqlens", "vit_max_seqlen", "image_to_sample", "num_images", "text_position_ids",
     *(v for k, v in _VIDEO_RENAME.items() if k not in ("pixel_values", "image_grid_thw")))
)


def _shared_empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialized contiguous tensor in shared memory (what DataLoader workers hand over without a copy)."""
    import torch

    numel = int(np.prod(shape, dtype=np.int64))
    storage = torch.UntypedStorage._new_shared(max(numel, 1) * torch.empty(0, dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _sample_seconds(samples: Sequence[Mapping[str, Any]], video_rows: list[np.ndarray]) -> list[np.ndarray]:
    """Per sample ``(V_b,)`` float64 ``second_per_grid_ts``; 1.0 for videos of samples without the field."""
    out = []
    for i, (s, rows) in enumerate(zip(samples, video_rows)):
        value = s.get("second_per_grid_ts")
        if value is None:
            out.append(np.ones(rows.shape[0], dtype=np.float64))
            continue
        arr = np.asarray(value.detach().cpu() if _is_torch(value) else value, dtype=np.float64).reshape(-1)
        if arr.shape[0] != rows.shape[0]:
            raise ValueError(f"sample {i}: second_per_grid_ts has {arr.shape[0]} entries for {rows.shape[0]} "
                             "videos (video_grid_thw rows)")
        out.append(arr)
    return out


def _pack_batch_vision(samples: Sequence[Mapping[str, Any]], fields: dict, options: Any) -> None:
    """``pack_batch``'s multimodal packer: adds the vision fields and, when ``options.mrope``, mRoPE positions.

    Called by :func:`omnibal_kernels.packing.pack_batch` after the text fields are built (``fields`` holds
    them); see :class:`omnibal_kernels.packing.PackOptions` for the options and :func:`pack_vision_fields`
    for the fields.
    """
    import warnings

    import torch

    for key in _PRODUCED:
        for i, s in enumerate(samples):
            if key in s:
                raise ValueError(f"sample {i} has a {key!r} field, which pack_batch produces itself")
    shared = torch.utils.data.get_worker_info() is not None
    merge = options.spatial_merge_size if options.mrope else None
    images = pack_vision_fields(samples, spatial_merge_size=merge, shared=shared)
    fields.update(images)
    has_videos = any(s.get("pixel_values_videos") is not None or s.get("video_grid_thw") is not None
                     for s in samples)
    if has_videos:
        videos = pack_vision_fields(samples, spatial_merge_size=merge, shared=shared,
                                    pixel_key="pixel_values_videos", grid_key="video_grid_thw")
        fields.update({_VIDEO_RENAME[k]: v for k, v in videos.items()})
    video_rows = [_grid_rows(s.get("video_grid_thw"), f"sample {i}: video_grid_thw") for i, s in enumerate(samples)]
    if any("second_per_grid_ts" in s for s in samples):
        seconds = _sample_seconds(samples, video_rows)
        fields["second_per_grid_ts"] = torch.from_numpy(np.concatenate(seconds).astype(np.float32))
    if not options.mrope:
        if "image_grid_thw" in fields or "video_grid_thw" in fields:
            warnings.warn("samples carry image_grid_thw/video_grid_thw but image_token_id is not set: "
                          "position_ids stay 1-D text positions, not Qwen2-VL mRoPE (pass image_token_id)",
                          stacklevel=5)
        return

    num_samples = len(samples)
    lens = fields["seq_lens"][:num_samples].tolist()
    total = sum(lens)
    text_pos = fields["position_ids"]  # (1, T), restarting per segment, padding included
    ids = fields["input_ids"][0, :total].split(lens)
    image_rows = [_grid_rows(s.get("image_grid_thw"), f"sample {i}: image_grid_thw") for i, s in enumerate(samples)]
    if options.video_token_id is None:
        for i, rows in enumerate(video_rows):
            if rows.shape[0]:
                raise ValueError(f"sample {i}: has video_grid_thw but video_token_id is not set")
    seconds = None
    if options.tokens_per_second is not None and any(rows.shape[0] for rows in video_rows):
        seconds = np.concatenate(_sample_seconds(samples, video_rows))
    mrope = mrope_position_ids(
        ids, image_rows, video_rows if options.video_token_id is not None else None,
        image_token_id=options.image_token_id, video_token_id=options.video_token_id,
        spatial_merge_size=options.spatial_merge_size, second_per_grid_ts=seconds,
        tokens_per_second=options.tokens_per_second if seconds is not None else None,
    )
    rows = 4 if options.mrope_text_row else 3
    padded = text_pos.shape[1]
    position_ids = torch.empty((rows, 1, padded), dtype=torch.int64)
    position_ids[rows - 3:, 0, :total] = mrope.position_ids[:, 0]
    position_ids[rows - 3:, 0, total:] = text_pos[0, total:]  # padding: positions of its own segment
    if rows == 4:
        position_ids[0] = text_pos
    fields["position_ids"] = position_ids
    fields["text_position_ids"] = text_pos


def _unpack_batch_vision(batch: Mapping[str, Any], num_samples: int) -> list[dict]:
    """Per-sample vision fields of a packed batch (images, videos, ``second_per_grid_ts``); see ``unpack_batch``."""
    out: list[dict] = [{} for _ in range(num_samples)]
    if "num_images" in batch:
        images = {k: batch[k] for k in ("pixel_values", "num_images", "image_grid_thw", "vit_cu_seqlens")
                  if k in batch}
        for d, u in zip(out, unpack_vision_fields(images)):
            d.update(u)
    if "num_videos" in batch:
        videos = {k: batch[v] for k, v in _VIDEO_RENAME.items()
                  if k in ("pixel_values", "num_images", "image_grid_thw", "vit_cu_seqlens") and v in batch}
        for d, u in zip(out, unpack_vision_fields(videos)):
            d.update({_VIDEO_RENAME[k]: v for k, v in u.items()})
    if "second_per_grid_ts" in batch:
        counts = [0 if "video_grid_thw" not in d else int(d["video_grid_thw"].shape[0]) for d in out]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        seconds = batch["second_per_grid_ts"]
        for i, d in enumerate(out):
            if counts[i]:
                d["second_per_grid_ts"] = seconds[int(bounds[i]):int(bounds[i + 1])]
    return out


# --------------------------------------------------------------------------------------------- patch packing plan


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


class _PatchPlan(NamedTuple):
    views: list  # per image a 4-D (frames, C, H, W) tensor view (any strides)
    grid: np.ndarray  # (N, 3) int64
    first_patch: np.ndarray  # (N + 1,) int64 patch offsets
    channels: int
    dtype: Any
    device: Any


_ELEMENT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _plan_patches(images: Any, sizes: Any, patch_size: int, merge_size: int, temporal_patch_size: int) -> _PatchPlan:
    """Validate the inputs of ``pack_patches`` and describe every image as a strided 4-D view."""
    import torch

    patch_size = _check_positive_int(patch_size, "patch_size")
    merge_size = _check_positive_int(merge_size, "merge_size")
    temporal_patch_size = _check_positive_int(temporal_patch_size, "temporal_patch_size")
    factor = patch_size * merge_size
    views: list = []
    if isinstance(images, torch.Tensor):
        if sizes is None:
            raise ValueError("a padded images tensor needs sizes: (N, 2) (height, width) per image")
        if images.dim() not in (4, 5):
            raise ValueError(f"padded images must be (N, C, H, W) or (N, T, C, H, W), got {tuple(images.shape)}")
        hw = np.asarray(sizes.detach().cpu() if _is_torch(sizes) else sizes)
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
        if v.element_size() not in _ELEMENT_VIEW:
            raise TypeError(f"image {i}: unsupported dtype {v.dtype}")
        t, _, h, w = v.shape
        if t < 1 or h <= 0 or w <= 0 or h % factor or w % factor:
            raise ValueError(f"image {i}: size {h}x{w} ({t} frames) must be positive multiples of "
                             f"patch_size * merge_size = {factor} (resize with qwen2vl_smart_resize first)")
        grid[i] = ((t + temporal_patch_size - 1) // temporal_patch_size, h // patch_size, w // patch_size)
    per_image = grid[:, 0] * grid[:, 1] * grid[:, 2]
    offsets = np.zeros(len(views) + 1, dtype=np.int64)
    np.cumsum(per_image, out=offsets[1:])
    return _PatchPlan(views, grid, offsets, int(first.shape[1]), first.dtype, first.device)


def _patch_segments(grid: np.ndarray) -> tuple[np.ndarray, int]:
    """``vit_cu_seqlens`` (int32) with one segment of ``h * w`` per frame group, and the longest segment."""
    seg = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    cu = np.zeros(seg.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg, out=cu[1:])
    if cu[-1] >= 2**31:
        raise ValueError(f"{int(cu[-1])} patches overflow int32 vit_cu_seqlens")
    return cu.astype(np.int32), int(seg.max()) if seg.size else 0
