"""The ``cp`` part's vision-language rows: a pack's images divided among the CP ranks, their embeddings routed.

Vision-language mixes (seeded draws of Qwen2-VL samples, ``qwen2vl_grid`` at 14-pixel patches, packed in draw
order up to the mix's capacity):

==========================  ==================================================================================
``long_video_128k``         40% long videos (128-1024 frames of 360p-720p) among samples of 1-3 images and
                            text, packs of 128k tokens
``video_mix_64k``           30% videos of 8-64 frames, 70% samples of 1-3 images, packs of 64k
``image_docs_64k``          interleaved documents of 8-32 images with text between them, packs of 64k
==========================  ==================================================================================

Each pack's tokens are laid out by ``auto`` (:func:`~omnibal_kernels.context_parallel.plan_layout`), its
images (frame groups) divided among the ranks and their embedding rows routed by
:func:`~omnibal_kernels.context_parallel.vision.plan_vision`, all priced by
``ContextParallelCost.llama3_8b`` (its ViT terms: a 675M ViT of 32 layers of width 1280). Per row, over the
packs: per-rank ViT time max / mean (mean and worst pack, and the worst among packs where no image costs more
than a rank's share), embedding rows exchanged per pack against an all-gather of every image's rows (each rank
receiving every other rank's), their bytes at an LLM width of 3584 in bfloat16, and the predicted step (the
slowest rank's text and ViT time) with the ViT split over the ranks against the ViT whole on each rank (every
rank encoding every image, as without this division). Target: ViT max / mean <= 1.05 on every pack where no
image exceeds a rank's share. Misses are listed, never dropped.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..context_parallel import ContextParallelOptions, plan_layout
from ..context_parallel.tokens import rank_plans
from ..context_parallel.vision import VisionWork, patch_units, plan_vision
from ..vision import qwen2vl_grid

# Bytes of one embedding row: an LLM of width 3584 (Qwen2-VL-7B's) in bfloat16.
ROW_BYTES = 3584 * 2
TEXT, IMAGE, VIDEO = 0, 1, 2
VIT_TARGET = 1.05
# A sample: its token kinds in order (TEXT / IMAGE / VIDEO per token) and its grids (kind, t, h, w) in order.
Sample = tuple[np.ndarray, list[tuple[int, int, int, int]]]


def _grids(rng: np.random.Generator, n: int, frames: Any = None, max_pixels: int = 28 * 28 * 1280) -> np.ndarray:
    width = rng.integers(224, 1920, n)
    height = (width * rng.uniform(0.5, 1.5, n)).astype(np.int64)
    return np.asarray(qwen2vl_grid(width, height, frames, max_pixels=max_pixels).grid_thw, dtype=np.int64)


def _sample(rng: np.random.Generator, visuals: list[tuple[int, np.ndarray]], interleaved: bool = False) -> Sample:
    """Text around each visual (``<vision_start>``, its placeholders, ``<vision_end>``), text at the end."""
    parts = [np.zeros(int(rng.integers(8, 64)), np.int64)]
    grids = []
    for kind, (t, h, w) in visuals:
        parts.append(np.r_[TEXT, np.full(t * h * w // 4, kind), TEXT])
        parts.append(np.zeros(int(rng.integers(64, 512) if interleaved else rng.integers(0, 8)), np.int64))
        grids.append((kind, int(t), int(h), int(w)))
    parts.append(np.zeros(int(rng.integers(16, 400)), np.int64))
    return np.concatenate(parts), grids


def _images(rng: np.random.Generator) -> Sample:
    grids = _grids(rng, int(rng.integers(1, 4)))
    return _sample(rng, [(IMAGE, g) for g in grids])


def _long_video(rng: np.random.Generator) -> Sample:
    if rng.random() >= 0.4:
        return _images(rng)
    frames = rng.integers(128, 1025, 1)
    return _sample(rng, [(VIDEO, _grids(rng, 1, frames, max_pixels=360 * 420)[0])])


def _video_mix(rng: np.random.Generator) -> Sample:
    if rng.random() >= 0.3:
        return _images(rng)
    return _sample(rng, [(VIDEO, _grids(rng, 1, rng.integers(8, 65, 1), max_pixels=360 * 420)[0])])


def _document(rng: np.random.Generator) -> Sample:
    grids = _grids(rng, int(rng.integers(8, 33)), max_pixels=448 * 448)
    return _sample(rng, [(IMAGE, g) for g in grids], interleaved=True)


VISION_MIXES: dict[str, tuple[Callable[[np.random.Generator], Sample], int]] = {
    "long_video_128k": (_long_video, 131_072),
    "video_mix_64k": (_video_mix, 65_536),
    "image_docs_64k": (_document, 65_536),
}


def vision_packs(mix: str, packs: int, seed: int = 0) -> list[list[Sample]]:
    """``packs`` packs of ``mix``: samples drawn in order, each into the current pack while it fits (a sample
    over the capacity is drawn again)."""
    draw, capacity = VISION_MIXES[mix]
    rng = np.random.default_rng([seed, sorted(VISION_MIXES).index(mix)])
    out: list[list[Sample]] = []
    current: list[Sample] = []
    used = 0
    while len(out) < packs:
        sample = draw(rng)
        n = sample[0].size
        if n > capacity:
            continue
        if used + n > capacity:
            out.append(current)
            current, used = [], 0
        current.append(sample)
        used += n
    return out


def pack_work(samples: list[Sample], options: ContextParallelOptions) -> tuple[np.ndarray, VisionWork]:
    """``(text time of every rank, the pack's VisionWork)`` of one pack under ``options``."""
    kinds = np.concatenate([s[0] for s in samples])
    grids = [g for s in samples for g in s[1]]
    image = np.array([g[1:] for g in grids if g[0] == IMAGE], np.int64).reshape(-1, 3)
    video = np.array([g[1:] for g in grids if g[0] == VIDEO], np.int64).reshape(-1, 3)
    layout, times = plan_layout(np.array([s[0].size for s in samples]), options)
    cu = np.r_[0, np.cumsum(layout.seqlens)]
    indices = [np.where(p.pos < layout.seqlens[p.seq], cu[p.seq] + p.pos, -1) for p in rank_plans(layout)]
    units = patch_units(image, video, 2, options.cost)
    work = plan_vision(kinds, indices, units, (IMAGE, VIDEO))[0].work
    return times.times, work


def cp_vision_rows(mix: str, packs: list[list[Sample]], context_parallel_size: int) -> dict[str, Any]:
    """The row of ``mix`` at ``context_parallel_size``, with its misses."""
    options = ContextParallelOptions(size=context_parallel_size)
    imbalance, fair, exchanged, gathered, split, whole = [], [], 0, 0, 0.0, 0.0
    for samples in packs:
        text, work = pack_work(samples, options)
        imbalance.append(work.imbalance)
        if not work.oversize:
            fair.append(work.imbalance)
        exchanged += work.rows_exchanged
        gathered += work.rows_all_gather
        split += float((text + work.times).max())
        whole += float(text.max() + work.times.sum())
    worst_fair = max(fair, default=1.0)
    row: dict[str, Any] = dict(
        mix=mix,
        context_parallel_size=context_parallel_size,
        packs=len(packs),
        vit_imbalance=float(np.mean(imbalance)),
        worst_vit_imbalance=float(max(imbalance)),
        worst_vit_imbalance_fair=worst_fair,
        oversize_packs=len(packs) - len(fair),
        rows_per_pack=exchanged / len(packs),
        rows_vs_all_gather=exchanged / max(gathered, 1),
        mb_per_pack=exchanged * ROW_BYTES / len(packs) / 1e6,
        all_gather_mb_per_pack=gathered * ROW_BYTES / len(packs) / 1e6,
        step_split_vs_whole=split / whole,
    )
    row["misses"] = [f"ViT max/mean {worst_fair:.4f} > {VIT_TARGET}"] if worst_fair > VIT_TARGET else []
    return row
