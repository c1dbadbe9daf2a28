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
``interleaved_documents``    web documents: 2-8 mid-size images (Qwen2-VL patches, one sequence each) between
                             paragraphs of long text (median 2,500 tokens, up to 24k)
``long_text_128k``           long-context text: a log-normal body (median 2,000) and 2% documents of 16k-128k
``clustered_mix``            three clusters: OCR pages (InternVL, 7-13 tiles and their text), short chat, long
                             code files
``patch_highres``            Qwen2.5-VL patches of one image at up to 4,096 LLM tokens: high-resolution
                             documents and screenshots beside small photos, OCR-length answers
``video_long``               videos only, 8-512 frames (4-256 frame groups of 360p-class frames), subtitles
===========================  ===================================================================================

The first seven are the classes the planner was developed on; the last five are held out, each unlike them in
what makes planning hard (sample loads much larger than the median, several clusters, a capacity set by a rare
largest sample), to check that nothing was tuned to the first seven.

ViT loads are tiles for the InternVL-style classes and patches for the Qwen2-VL-style ones; LLM loads count
text tokens plus the image tokens (256 per InternVL tile, one per 2x2 merged Qwen2-VL patches).

Every sample carries its ViT sequence lengths (``Lengths.vit_seqlens``; :func:`synthetic_samples` also returns
them apart), the sequences its vision tower attends within, in ViT load units (they sum to the sample's ViT
load), in CSR form: ``vit_seqlens[vit_seqlens_offsets[i]:vit_seqlens_offsets[i + 1]]`` are sample ``i``'s.
InternVL attends within each tile
(sequences of 1 tile); Qwen2-VL within each image and within each frame group of a video (``grid_t``
sequences of ``grid_h * grid_w`` patches, its ``cu_seqlens``); text-only samples have none. They are
derived from what is drawn for the loads, so the loads of a seed do not depend on them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from ._csr import offsets_from_counts
from .lengths import Lengths, default_lengths

__all__ = ["DISTRIBUTIONS", "SyntheticSamples", "synthetic_lengths", "synthetic_samples"]

_TOKENS_PER_TILE = 256  # InternVL: 448 px tiles, 1024 patches pixel-shuffled to 256 tokens
_MERGE = 4  # Qwen2-VL: 2x2 patches merge into one LLM token


class SyntheticSamples(NamedTuple):
    """Loads of ``N`` synthetic samples and the ViT sequences of each (see the module docstring).

    Attributes:
        lengths: the per-sample loads with these ViT sequences (what :func:`synthetic_lengths` returns).
        vit_seqlens: ``(M,)`` int64 ViT sequence lengths of all samples, sample by sample, in ViT load units.
        vit_seqlens_offsets: ``(N + 1,)`` int64, from 0: sample ``i``'s sequences are
            ``vit_seqlens[vit_seqlens_offsets[i]:vit_seqlens_offsets[i + 1]]``; they sum to its ViT load.
    """

    lengths: Lengths
    vit_seqlens: np.ndarray
    vit_seqlens_offsets: np.ndarray


def _samples(vit: np.ndarray, llm: np.ndarray, seqlens: np.ndarray, counts: np.ndarray) -> SyntheticSamples:
    """Loads and ViT sequences, ``counts[i]`` consecutive entries of ``seqlens`` per sample."""
    offsets = offsets_from_counts(counts)
    return SyntheticSamples(Lengths(vit, llm), np.asarray(seqlens, np.int64), offsets)


def _tile_samples(tiles: np.ndarray, llm: np.ndarray) -> SyntheticSamples:
    """InternVL: one ViT sequence of 1 unit per tile."""
    return _samples(tiles, llm, np.ones(int(tiles.sum()), np.int64), tiles)


def _lognormal_tokens(rng: np.random.Generator, n: int, median: float, sigma: float, low: int, high: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), low, high).astype(np.int64)


def _internvl_tiles(rng: np.random.Generator, n: int, max_tiles: int = 12) -> np.ndarray:
    """Tiles of ``n`` images: a dynamic-resolution grid of 1..max_tiles tiles plus the thumbnail when > 1."""
    # Small grids are most common (documents and charts are the large ones).
    weights = 1.0 / np.arange(1, max_tiles + 1) ** 0.8
    grid = rng.choice(np.arange(1, max_tiles + 1), size=n, p=weights / weights.sum())
    return (grid + (grid > 1)).astype(np.int64)


def _qwen2vl_grids(
    rng: np.random.Generator,
    n: int,
    num_frames: Optional[np.ndarray] = None,
    sides: tuple[int, int] = (64, 4096),
    max_pixels: int = 28 * 28 * 1280,
) -> np.ndarray:
    """``(n, 3)`` patch grids ``(t, h, w)`` of ``n`` images (or videos) of random resolution, as Qwen2-VL's
    processor resizes them (images: widths log-uniform in ``sides``, at most ``max_pixels``)."""
    from .vision import qwen2vl_grid

    # Image sides from 64 px to 4k, log-uniform; videos at typical 360p-720p frame sizes with fewer pixels each.
    if num_frames is None:
        width = np.exp(rng.uniform(np.log(sides[0]), np.log(sides[1]), n)).astype(np.int64)
        aspect = np.exp(rng.uniform(np.log(0.33), np.log(3.0), n))
        height = np.clip(np.round(width * aspect), 28, 8192).astype(np.int64)
        return np.asarray(qwen2vl_grid(width, height, max_pixels=max_pixels).grid_thw, dtype=np.int64)
    width = rng.choice(np.array([480, 640, 854, 1280]), size=n)
    height = (width * 9) // 16
    grid = qwen2vl_grid(width, height, num_frames, max_pixels=360 * 420)
    return np.asarray(grid.grid_thw, dtype=np.int64)


def _per_sample(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values`` over consecutive runs of ``counts`` items (one run per sample)."""
    ends = np.cumsum(counts)
    totals = np.concatenate([[0], np.cumsum(values)])
    return (totals[ends] - totals[ends - counts]).astype(np.int64)


def _grid_samples(grids: np.ndarray, text: np.ndarray) -> SyntheticSamples:
    """Qwen2-VL, one image or video per sample: ``t`` ViT sequences of ``h * w`` patches (frame groups)."""
    frames, per_frame = grids[:, 0], grids[:, 1] * grids[:, 2]
    patches = frames * per_frame
    return _samples(patches, patches // _MERGE + text, np.repeat(per_frame, frames), frames)


def _text_long_tail(rng: np.random.Generator, n: int) -> SyntheticSamples:
    tokens = _lognormal_tokens(rng, n, 900, 1.1, 16, 32_768)
    return _samples(np.zeros(n, np.int64), tokens, np.zeros(0, np.int64), np.zeros(n, np.int64))


def _single_image_short_text(rng: np.random.Generator, n: int) -> SyntheticSamples:
    tiles = _internvl_tiles(rng, n)
    return _tile_samples(tiles, tiles * _TOKENS_PER_TILE + _lognormal_tokens(rng, n, 60, 0.9, 4, 2_048))


def _many_images_long_text(rng: np.random.Generator, n: int) -> SyntheticSamples:
    images = rng.integers(2, 9, n)
    tiles = _per_sample(images, _internvl_tiles(rng, int(images.sum()), max_tiles=6))
    return _tile_samples(tiles, tiles * _TOKENS_PER_TILE + _lognormal_tokens(rng, n, 1_500, 0.7, 100, 12_000))


def _patch_multires(rng: np.random.Generator, n: int) -> SyntheticSamples:
    images = rng.choice(np.array([0, 1, 2, 3]), size=n, p=[0.15, 0.6, 0.15, 0.1])
    grids = _qwen2vl_grids(rng, int(images.sum()))
    per_image = grids[:, 0] * grids[:, 1] * grids[:, 2]  # t = 1: one sequence per image
    patches = _per_sample(images, per_image)
    return _samples(patches, patches // _MERGE + _lognormal_tokens(rng, n, 120, 1.0, 4, 4_096), per_image, images)


def _video_mix(rng: np.random.Generator, n: int) -> SyntheticSamples:
    is_video = rng.random(n) < 0.3
    grids = np.zeros((n, 3), np.int64)
    num_videos = int(is_video.sum())
    frames = rng.integers(8, 65, num_videos)
    grids[is_video] = _qwen2vl_grids(rng, num_videos, frames)
    grids[~is_video] = _qwen2vl_grids(rng, n - num_videos)
    return _grid_samples(grids, _lognormal_tokens(rng, n, 150, 0.9, 4, 4_096))


def _half_text_half_image(rng: np.random.Generator, n: int) -> SyntheticSamples:
    is_text = rng.random(n) < 0.5
    tiles = np.where(is_text, 0, _internvl_tiles(rng, n))
    text = np.where(
        is_text, _lognormal_tokens(rng, n, 1_200, 0.9, 32, 16_384), _lognormal_tokens(rng, n, 80, 0.9, 4, 2_048)
    )
    return _tile_samples(tiles, tiles * _TOKENS_PER_TILE + text)


def _interleaved_documents(rng: np.random.Generator, n: int) -> SyntheticSamples:
    images = rng.integers(2, 9, n)
    grids = _qwen2vl_grids(rng, int(images.sum()), sides=(300, 1200))
    per_image = grids[:, 1] * grids[:, 2]
    patches = _per_sample(images, per_image)
    text = _lognormal_tokens(rng, n, 2_500, 0.8, 200, 24_000)
    return _samples(patches, patches // _MERGE + text, per_image, images)


def _long_text_128k(rng: np.random.Generator, n: int) -> SyntheticSamples:
    tokens = _lognormal_tokens(rng, n, 2_000, 1.2, 32, 131_072)
    is_document = rng.random(n) < 0.02
    documents = np.exp(rng.uniform(np.log(16_384), np.log(131_072), n)).astype(np.int64)
    tokens = np.where(is_document, documents, tokens)
    return _samples(np.zeros(n, np.int64), tokens, np.zeros(0, np.int64), np.zeros(n, np.int64))


def _clustered_mix(rng: np.random.Generator, n: int) -> SyntheticSamples:
    cluster = rng.choice(np.array([0, 1, 2]), size=n, p=[0.3, 0.5, 0.2])  # OCR pages, short chat, long code
    tiles = np.where(cluster == 0, rng.integers(6, 13, n) + 1, 0)  # a page grid of 6-12 tiles and its thumbnail
    text = np.select(
        [cluster == 0, cluster == 1],
        [_lognormal_tokens(rng, n, 1_000, 0.6, 100, 4_096), _lognormal_tokens(rng, n, 120, 0.8, 8, 1_536)],
        _lognormal_tokens(rng, n, 5_000, 0.5, 512, 16_384),
    )
    return _tile_samples(tiles.astype(np.int64), tiles * _TOKENS_PER_TILE + text)


def _patch_highres(rng: np.random.Generator, n: int) -> SyntheticSamples:
    is_document = rng.random(n) < 0.6
    # documents and screenshots at 1-4k px, photos at 200-1500 px; up to 4,096 LLM tokens an image
    high = _qwen2vl_grids(rng, n, sides=(1_000, 4_000), max_pixels=28 * 28 * 4096)
    low = _qwen2vl_grids(rng, n, sides=(200, 1_500), max_pixels=28 * 28 * 4096)
    grids = np.where(is_document[:, None], high, low)
    text = np.where(
        is_document, _lognormal_tokens(rng, n, 600, 0.8, 16, 8_192), _lognormal_tokens(rng, n, 60, 0.8, 4, 1_024)
    )
    return _grid_samples(grids, text)


def _video_long(rng: np.random.Generator, n: int) -> SyntheticSamples:
    frames = np.exp(rng.uniform(np.log(8), np.log(512), n)).astype(np.int64)
    grids = _qwen2vl_grids(rng, n, frames)
    return _grid_samples(grids, _lognormal_tokens(rng, n, 300, 1.0, 16, 8_192))


def _bundled(rng: np.random.Generator, n: Optional[int]) -> SyntheticSamples:
    real = default_lengths()
    picked = real if n is None else real[rng.integers(0, len(real), n)]
    return _tile_samples(np.asarray(picked.vit), np.asarray(picked.llm))  # InternVL-Chat: ViT loads are tiles


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, int], SyntheticSamples]] = {
    "text_long_tail": _text_long_tail,
    "single_image_short_text": _single_image_short_text,
    "many_images_long_text": _many_images_long_text,
    "patch_multires": _patch_multires,
    "video_mix": _video_mix,
    "half_text_half_image": _half_text_half_image,
    "bundled": _bundled,
    "interleaved_documents": _interleaved_documents,
    "long_text_128k": _long_text_128k,
    "clustered_mix": _clustered_mix,
    "patch_highres": _patch_highres,
    "video_long": _video_long,
}
# Each class draws from its own random stream; a new class takes the next number, so the draws of the others
# never change.
_STREAMS = {
    kind: stream
    for stream, kind in enumerate(
        (
            "bundled",
            "half_text_half_image",
            "many_images_long_text",
            "patch_multires",
            "single_image_short_text",
            "text_long_tail",
            "video_mix",
            "interleaved_documents",
            "long_text_128k",
            "clustered_mix",
            "patch_highres",
            "video_long",
        )
    )
}


def synthetic_samples(kind: str, n: Optional[int] = 100_000, seed: int = 0) -> SyntheticSamples:
    """``n`` samples of the distribution class ``kind`` with their ViT sequences (see the module docstring).

    The loads are those of :func:`synthetic_lengths` for the same arguments.

    Args:
        kind: one of :data:`DISTRIBUTIONS`.
        n: number of samples; ``None`` only for ``"bundled"`` (the 70,706 real samples as they are).
        seed: seed of the draw.

    Returns:
        :class:`SyntheticSamples`: ``lengths``, ``vit_seqlens`` ``(M,)`` and ``vit_seqlens_offsets`` ``(n + 1,)``.

    Raises:
        ValueError: an unknown ``kind`` or a non-positive ``n``.
    """
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"kind must be one of {sorted(DISTRIBUTIONS)}, got {kind!r}")
    if n is None and kind != "bundled":
        raise ValueError(f"n=None is only for kind='bundled'; {kind!r} needs a sample count")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0):
        raise ValueError(f"n must be a positive integer, got {n!r}")
    rng = np.random.default_rng([seed, _STREAMS[kind]])
    drawn = DISTRIBUTIONS[kind](rng, n)  # type: ignore[arg-type]  # n is None only for bundled, which takes it
    lengths = Lengths(
        drawn.lengths.vit,
        drawn.lengths.llm,
        sources=(f"synthetic:{kind}",),
        vit_seqlens=drawn.vit_seqlens,
        vit_seqlens_offsets=drawn.vit_seqlens_offsets,
    )
    return drawn._replace(lengths=lengths)


def synthetic_lengths(kind: str, n: Optional[int] = 100_000, seed: int = 0) -> Lengths:
    """``n`` samples of the distribution class ``kind`` (see the module docstring), the same for a seed.

    Args:
        kind: one of :data:`DISTRIBUTIONS`.
        n: number of samples; ``None`` only for ``"bundled"`` (the 70,706 real samples as they are).
        seed: seed of the draw.

    Raises:
        ValueError: an unknown ``kind`` or a non-positive ``n``.
    """
    return synthetic_samples(kind, n, seed).lengths
