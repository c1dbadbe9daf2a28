"""Synthetic per-sample loads shaped like the data people train on, for benchmarks and robustness tests.

The bundled InternVL-Chat data is one distribution; a planner tuned on it alone is not shown to work. Each
class here draws ``n`` samples with a fixed seed, from shapes seen in public training mixtures:

===========================  ===================================================================================
``text_long_tail``           text only; log-normal token counts (median about 900) with a tail up to 32k
``single_image_short_text``  one image per sample, InternVL tiles (1-12 + thumbnail), short answers
``many_images_long_text``    2-8 images of 1-6 tiles each, long text: both loads bind
``patch_multires``           Qwen2-VL patches of 0-3 images of any resolution (``smart_resize``), short text
``video_mix``                30% videos (8-64 frames) and 70% images, Qwen2-VL patches
``half_text_half_image``     half long text-only samples, half 1-12 tile images with short text
``bundled``                  the bundled real InternVL-Chat loads resampled to ``n`` (``n=None``: as they are)
===========================  ===================================================================================

ViT loads are tiles for the InternVL-style classes and patches for the Qwen2-VL-style ones; LLM loads count
text tokens plus the image tokens (256 per InternVL tile, one per 2x2 merged Qwen2-VL patches). The Qwen2-VL
classes carry ``vit_seqlens``: one per image and one per video frame group (what the ViT attends over).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .lengths import Lengths, default_lengths

__all__ = ["DISTRIBUTIONS", "synthetic_lengths"]

_TOKENS_PER_TILE = 256  # InternVL: 448 px tiles, 1024 patches pixel-shuffled to 256 tokens
_MERGE = 4              # Qwen2-VL: 2x2 patches merge into one LLM token


def _lognormal_tokens(rng: np.random.Generator, n: int, median: float, sigma: float, low: int, high: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), low, high).astype(np.int64)


def _internvl_tiles(rng: np.random.Generator, n: int, max_tiles: int = 12) -> np.ndarray:
    """Tiles of ``n`` images: a dynamic-resolution grid of 1..max_tiles tiles plus the thumbnail when > 1."""
    # Small grids are most common (documents and charts are the large ones).
    weights = 1.0 / np.arange(1, max_tiles + 1) ** 0.8
    grid = rng.choice(np.arange(1, max_tiles + 1), size=n, p=weights / weights.sum())
    return (grid + (grid > 1)).astype(np.int64)


def _qwen2vl_patches(rng: np.random.Generator, n: int, num_frames: Optional[np.ndarray] = None) -> np.ndarray:
    """``(n, 2)`` ViT patches of ``n`` images (or videos) of random resolution, counted as Qwen2-VL's processor
    would, and their frame groups (1 for an image), each of which the ViT attends over on its own."""
    from .vision import qwen2vl_grid

    # Image sides from 64 px to 4k, log-uniform; videos at typical 360p-720p frame sizes with fewer pixels each.
    if num_frames is None:
        width = np.exp(rng.uniform(np.log(64), np.log(4096), n)).astype(np.int64)
        aspect = np.exp(rng.uniform(np.log(0.33), np.log(3.0), n))
        height = np.clip(np.round(width * aspect), 28, 8192).astype(np.int64)
        grid = qwen2vl_grid(width, height)
    else:
        width = rng.choice(np.array([480, 640, 854, 1280]), size=n)
        height = (width * 9) // 16
        grid = qwen2vl_grid(width, height, num_frames, max_pixels=360 * 420)
    thw = np.asarray(grid.grid_thw, dtype=np.int64).reshape(-1, 3)
    return np.stack([np.asarray(grid.num_patches, dtype=np.int64), thw[:, 0]], axis=1)


def _with_sequences(vit: np.ndarray, llm: np.ndarray, items: np.ndarray, counts: np.ndarray) -> Lengths:
    """Loads whose ViT sequences are the frame groups of each sample's ``counts`` consecutive ``items`` (rows of
    :func:`_qwen2vl_patches`)."""
    groups = items[:, 1]
    seqlens = np.repeat(items[:, 0] // groups, groups)
    per_sample = _per_sample(counts, groups)
    offsets = np.concatenate([[0], np.cumsum(per_sample)]).astype(np.int64)
    return Lengths(vit, llm, vit_seqlens=seqlens, vit_seqlens_offsets=offsets)


def _per_sample(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values`` over consecutive runs of ``counts`` items (one run per sample)."""
    ends = np.cumsum(counts)
    totals = np.concatenate([[0], np.cumsum(values)])
    return (totals[ends] - totals[ends - counts]).astype(np.int64)


def _text_long_tail(rng: np.random.Generator, n: int) -> Lengths:
    return Lengths(np.zeros(n, np.int64), _lognormal_tokens(rng, n, 900, 1.1, 16, 32_768))


def _single_image_short_text(rng: np.random.Generator, n: int) -> Lengths:
    tiles = _internvl_tiles(rng, n)
    return Lengths(tiles, tiles * _TOKENS_PER_TILE + _lognormal_tokens(rng, n, 60, 0.9, 4, 2_048))


def _many_images_long_text(rng: np.random.Generator, n: int) -> Lengths:
    images = rng.integers(2, 9, n)
    tiles = _per_sample(images, _internvl_tiles(rng, int(images.sum()), max_tiles=6))
    return Lengths(tiles, tiles * _TOKENS_PER_TILE + _lognormal_tokens(rng, n, 1_500, 0.7, 100, 12_000))


def _patch_multires(rng: np.random.Generator, n: int) -> Lengths:
    images = rng.choice(np.array([0, 1, 2, 3]), size=n, p=[0.15, 0.6, 0.15, 0.1])
    items = _qwen2vl_patches(rng, int(images.sum()))
    patches = _per_sample(images, items[:, 0])
    return _with_sequences(patches, patches // _MERGE + _lognormal_tokens(rng, n, 120, 1.0, 4, 4_096), items, images)


def _video_mix(rng: np.random.Generator, n: int) -> Lengths:
    is_video = rng.random(n) < 0.3
    items = np.zeros((n, 2), np.int64)
    num_videos = int(is_video.sum())
    frames = rng.integers(8, 65, num_videos)
    items[is_video] = _qwen2vl_patches(rng, num_videos, frames)
    items[~is_video] = _qwen2vl_patches(rng, n - num_videos)
    patches = items[:, 0]
    return _with_sequences(patches, patches // _MERGE + _lognormal_tokens(rng, n, 150, 0.9, 4, 4_096), items,
                           np.ones(n, np.int64))


def _half_text_half_image(rng: np.random.Generator, n: int) -> Lengths:
    is_text = rng.random(n) < 0.5
    tiles = np.where(is_text, 0, _internvl_tiles(rng, n))
    text = np.where(is_text, _lognormal_tokens(rng, n, 1_200, 0.9, 32, 16_384),
                    _lognormal_tokens(rng, n, 80, 0.9, 4, 2_048))
    return Lengths(tiles, tiles * _TOKENS_PER_TILE + text)


def _bundled(rng: np.random.Generator, n: Optional[int]) -> Lengths:
    real = default_lengths()
    if n is None:
        return real
    return real[rng.integers(0, len(real), n)]


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, int], Lengths]] = {
    "text_long_tail": _text_long_tail,
    "single_image_short_text": _single_image_short_text,
    "many_images_long_text": _many_images_long_text,
    "patch_multires": _patch_multires,
    "video_mix": _video_mix,
    "half_text_half_image": _half_text_half_image,
    "bundled": _bundled,
}


def synthetic_lengths(kind: str, n: Optional[int] = 100_000, seed: int = 0) -> Lengths:
    """``n`` samples of the distribution class ``kind`` (see the module docstring), the same for a seed.

    Args:
        kind: one of :data:`DISTRIBUTIONS`.
        n: number of samples; ``None`` only for ``"bundled"`` (the 70,706 real samples as they are).
        seed: seed of the draw.

    Raises:
        ValueError: an unknown ``kind`` or a non-positive ``n``.
    """
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"kind must be one of {sorted(DISTRIBUTIONS)}, got {kind!r}")
    if n is None and kind != "bundled":
        raise ValueError(f"n=None is only for kind='bundled'; {kind!r} needs a sample count")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0):
        raise ValueError(f"n must be a positive integer, got {n!r}")
    rng = np.random.default_rng([seed, sorted(DISTRIBUTIONS).index(kind)])
    lengths = DISTRIBUTIONS[kind](rng, n)  # type: ignore[arg-type]  # n is None only for bundled, which takes it
    return Lengths(lengths.vit, lengths.llm, sources=(f"synthetic:{kind}",), vit_seqlens=lengths.vit_seqlens,
                   vit_seqlens_offsets=lengths.vit_seqlens_offsets)
