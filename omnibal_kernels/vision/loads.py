"""Per-sample loads from image sizes and text lengths: what a length file holds, before any pixel is read.

Besides each sample's ``vit`` and ``llm`` load, :func:`compute_loads` gives its ViT sequence lengths
(``Lengths.vit_seqlens``): the pieces its ViT load is attended in, in ViT load units, a sample's images in their
order. InternVL attends each tile alone, and its ViT unit is the tile, so every tile is one sequence of length 1
(``sum_j s_j**2`` is then the tile count, which is how :class:`~omnibal_kernels.balance.CostModel` charges tiles:
their attention is linear in tiles). Qwen2-VL and Qwen2.5-VL attend each image, and each video's frame groups one
by one: an image or video of grid ``(t, h, w)`` is ``t`` sequences of ``h * w`` patches, the ``cu_seqlens`` the
vision tower builds (and :func:`~omnibal_kernels.vision.pack_vision_fields` returns as ``vit_cu_seqlens``).
Qwen2.5-VL's window attention splits those sequences further in most layers; its full-attention layers, whose
cost grows with the square, attend them whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import QWEN2VL_MAX_RATIO, as_int_array, check_image_sizes, check_positive_int, is_tensor
from .._csr import offsets_from_counts
from .._progress import progress_bar
from ..lengths import Lengths
from .counts import internvl_num_tiles, qwen2vl_grid

__all__ = ["MODELS", "compute_loads", "flatten_image_sizes"]

# Images per chunk of the counting (bounds the InternVL candidate matrix and updates the progress bar).
_CHUNK = 1 << 16

# The models whose counting rules compute_loads knows (Qwen2.5-VL counts as Qwen2-VL does).
MODELS = ("internvl", "qwen2vl", "qwen2.5vl")


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


def compute_loads(
    image_sizes: Any,
    text_tokens: Any,
    *,
    model: str = "internvl",
    image_to_sample: Any = None,
    num_frames: Any = None,
    num_image_token: int = 256,
    min_num: int = 1,
    max_num: int = 12,
    image_size: int = 448,
    use_thumbnail: bool = True,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
    progress: bool | None = None,
) -> Lengths:
    """Turn a dataset's image sizes and text lengths into the loads of a length file, ViT sequences included.

    Args:
        image_sizes: one entry per sample, each ``None``/empty (text only), one ``(width, height)`` pair or a
            list of pairs; or, with ``image_to_sample``, an ``(M, 2)`` array of ``(width, height)`` rows.
        text_tokens: ``(N,)`` text tokens per sample, image tokens excluded.
        model: ``"internvl"`` (vit = tiles, llm = text + tiles * ``num_image_token``), ``"qwen2vl"`` or
            ``"qwen2.5vl"`` (vit = patches, llm = text + patches / ``merge_size**2``).
        image_to_sample: ``(M,)`` sample index of each image row (any order) when ``image_sizes`` is flat.
        num_frames: ``(M,)`` frames per image row for Qwen2-VL videos (flat layout only); None for images.
        num_image_token: LLM tokens per InternVL tile (256 for 448-pixel tiles with pixel shuffle 0.5).
        min_num, max_num, image_size, use_thumbnail: InternVL tiling, see :func:`internvl_tile_grid`.
        patch_size, merge_size, temporal_patch_size, min_pixels, max_pixels: Qwen2-VL, see :func:`qwen2vl_grid`.
        progress: progress bars on stderr (default: when stderr is a terminal).

    Returns:
        :class:`~omnibal_kernels.Lengths` with ``vit`` and ``llm`` of shape ``(N,)`` int64 and the ViT
        sequences (the module docstring says which): ``vit_seqlens`` ``(S,)`` and ``vit_seqlens_offsets``
        ``(N + 1,)``, a sample's images in their order (the order of their rows in the flat layout).

    Raises:
        ValueError: unknown model, bad sizes or frame counts (naming the sample), negative text lengths,
            mismatched lengths, a sample whose load reaches ``2**31``.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    num_image_token = check_positive_int("num_image_token", num_image_token, minimum=0, maximum=2**31 - 1)
    text = as_int_array(text_tokens, "text_tokens")
    n = text.shape[0]
    if (text < 0).any():
        i = int(np.flatnonzero(text < 0)[0])
        raise ValueError(f"sample {i}: text_tokens = {int(text[i])} is negative")
    sizes, owner, frames = _image_rows(image_sizes, image_to_sample, num_frames, n, progress)
    if sizes.shape[0]:
        check_image_sizes(
            as_int_array(sizes[:, 0], "image widths"),
            as_int_array(sizes[:, 1], "image heights"),
            max_ratio=None if model == "internvl" else QWEN2VL_MAX_RATIO,
            owner=owner,
        )
    per_image = _ImageCounts(sizes.shape[0])
    bar = progress_bar(total=sizes.shape[0], desc=f"counting {model} images", enabled=progress)
    try:
        for lo in range(0, sizes.shape[0], _CHUNK):
            hi = min(lo + _CHUNK, sizes.shape[0])
            w = as_int_array(sizes[lo:hi, 0], "widths")
            h = as_int_array(sizes[lo:hi, 1], "heights")
            if model == "internvl":
                tiles = internvl_num_tiles(
                    w, h, min_num=min_num, max_num=max_num, image_size=image_size, use_thumbnail=use_thumbnail
                )
                per_image.set(lo, hi, tiles, tiles * num_image_token, tiles, np.ones_like(tiles))
            else:
                g = qwen2vl_grid(
                    w,
                    h,
                    None if frames is None else frames[lo:hi],
                    patch_size=patch_size,
                    merge_size=merge_size,
                    temporal_patch_size=temporal_patch_size,
                    min_pixels=min_pixels,
                    max_pixels=max_pixels,
                )
                per_image.set(
                    lo, hi, g.num_patches, g.num_tokens, g.grid_thw[:, 0], g.grid_thw[:, 1] * g.grid_thw[:, 2]
                )
            bar.update(hi - lo)
    finally:
        bar.close()
    return per_image.lengths(owner, text)


def _image_rows(
    image_sizes: Any, image_to_sample: Any, num_frames: Any, n: int, progress: bool | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(M, 2)`` image sizes, ``(M,)`` owning sample and ``(M,)`` frames (or None) of either layout, checked."""
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
    if frames is not None:
        if frames.shape[0] != sizes.shape[0]:
            raise ValueError(f"num_frames has {frames.shape[0]} entries for {sizes.shape[0]} images")
        if (frames <= 0).any():
            j = int(np.flatnonzero(frames <= 0)[0])
            raise ValueError(
                f"sample {int(owner[j])}: num_frames[{j}] = {int(frames[j])}, a video needs at least one frame"
            )
    return sizes, owner, frames


class _ImageCounts:
    """Per image row: its ViT load, LLM tokens, and its ViT sequences (``count`` of them, ``length`` each)."""

    def __init__(self, m: int) -> None:
        self.vit, self.llm, self.count, self.length = (np.zeros(m, dtype=np.int64) for _ in range(4))

    def set(self, lo: int, hi: int, vit: np.ndarray, llm: np.ndarray, count: np.ndarray, length: np.ndarray) -> None:
        self.vit[lo:hi], self.llm[lo:hi], self.count[lo:hi], self.length[lo:hi] = vit, llm, count, length

    def lengths(self, owner: np.ndarray, text: np.ndarray) -> Lengths:
        """The per-sample loads of ``text`` plus the images, each image's row ``owner`` saying whose it is."""
        n = text.shape[0]
        # float sums are exact below 2**53, far above any load a Lengths accepts (it names a sample past 2**31)
        vit, llm, counts = (
            np.bincount(owner, weights=x, minlength=n).astype(np.int64) for x in (self.vit, self.llm, self.count)
        )
        # a sample's sequences in the order of its image rows
        order = np.argsort(owner, kind="stable")
        offsets = offsets_from_counts(counts)
        seqlens = np.repeat(self.length[order], self.count[order])
        # made here and handed over read-only, so Lengths keeps them without a copy
        arrays = [vit, text + llm, seqlens, offsets]
        for arr in arrays:
            arr.flags.writeable = False
        return Lengths(arrays[0], arrays[1], vit_seqlens=arrays[2], vit_seqlens_offsets=arrays[3])
