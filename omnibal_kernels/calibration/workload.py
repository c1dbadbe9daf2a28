"""What a model is timed on: loads drawn from real data, and varied packs of them planned with ``plan_packs``.

A fit can only tell the six terms apart on packs that differ in each: few and many samples, short and long
ones, few and many images of small and large size. ``calibration_lengths`` draws the loads:

- text: the text tokens of the bundled InternVL-Chat samples (``omnibal_kernels.data``, their 256 image
  tokens per tile taken out): real lengths from 33 to 1,258 tokens;
- Qwen2-VL / Qwen2.5-VL patches: the same text, and 0 to 3 images per sample (15%, 60%, 15%, 10%, as the
  ``patch_multires`` class of :mod:`omnibal_kernels.synthetic`) of log-uniform width (64 to 4,096 pixels) and
  aspect ratio (1:3 to 3:1), counted by the model's own ``smart_resize`` (:func:`omnibal_kernels.vision.qwen2vl_grid`)
  at the processor's default bounds, optionally at a lower resolution (``image_scale``); one ViT sequence per
  image, its placeholders and a vision-start token added to the LLM load;
- InternVL tiles: the bundled samples' tiles with their text, the model's placeholders per tile, one ViT
  sequence per tile.

``calibration_packs`` plans them with ``plan_packs`` with ``method="random"`` under capacities of 1 to 4 mean samples
and takes packs from every plan in turn, so the packs range from one sample to several.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import check_positive_int
from .._csr import row_sums
from ..balance import plan_packs
from ..balance.options import PlanOptions
from ..lengths import Lengths, default_lengths
from .samples import SampleMaker

__all__ = ["CAPACITY_SCALES", "calibration_lengths", "calibration_packs", "check_image_scale"]

# Capacities of the plans the packs are taken from, in mean sample loads. Not above 4: larger packs of the tiny
# models outgrow a CPU core's L2 cache, and their time per token rises with the pack, which no per-sample
# term describes (seen in the residuals of calibrate("tiny-llama") with capacities up to 8).
CAPACITY_SCALES = (1.0, 2.0, 3.0, 4.0)
# Images per sample and their shares (the patch_multires class of omnibal_kernels.synthetic).
_IMAGES = (0, 1, 2, 3)
_IMAGE_SHARES = (0.15, 0.6, 0.15, 0.1)
_TOKENS_PER_TILE = 256  # the bundled loads' image tokens per InternVL tile
# The Qwen2-VL processor's default pixel bounds per image (smart_resize's min_pixels and max_pixels).
_MIN_PIXELS, _MAX_PIXELS = 56 * 56, 28 * 28 * 1280


def _bundled(num_samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tiles and text tokens of ``num_samples`` bundled samples drawn at random (with replacement)."""
    real = default_lengths()
    pick = rng.integers(0, len(real), num_samples)
    tiles = real.vit[pick]
    return tiles, real.llm[pick] - _TOKENS_PER_TILE * tiles


def _image_patches(rng: np.random.Generator, count: int, vision: Any, image_scale: float) -> np.ndarray:
    """ViT patches of ``count`` random images at ``image_scale`` of their resolution, as the model's processor
    (``smart_resize`` at its default pixel bounds, scaled alike) counts them."""
    from ..vision import qwen2vl_grid

    width = np.exp(rng.uniform(np.log(64), np.log(4096), count))
    aspect = np.exp(rng.uniform(np.log(1 / 3), np.log(3.0), count))
    height = np.clip(width * aspect, 28, 8192)
    side = lambda x: np.maximum(np.round(x * image_scale), 1).astype(np.int64)  # noqa: E731
    grid = qwen2vl_grid(
        side(width),
        side(height),
        patch_size=int(vision.patch_size),
        merge_size=int(vision.spatial_merge_size),
        temporal_patch_size=int(vision.temporal_patch_size),
        min_pixels=max(1, int(round(_MIN_PIXELS * image_scale**2))),
        max_pixels=max(1, int(round(_MAX_PIXELS * image_scale**2))),
    )
    return np.asarray(grid.num_patches, dtype=np.int64)


def check_image_scale(image_scale: object) -> float:
    """``image_scale`` as a float in ``(0, 1]``; TypeError for anything but a real number, else ValueError."""
    if isinstance(image_scale, bool) or not isinstance(image_scale, (int, float)):
        raise TypeError(f"image_scale must be a number in (0, 1], got {type(image_scale).__name__}")
    if not 0 < image_scale <= 1:
        raise ValueError(f"image_scale must be in (0, 1], got {image_scale!r}")
    return float(image_scale)


def calibration_lengths(config: Any, num_samples: int = 2000, *, seed: int = 0, image_scale: float = 1.0) -> Lengths:
    """Loads to time ``config``'s model on (see the module docstring), with their ViT sequences.

    Args:
        config: the model's transformers config (text model, Qwen2-VL, Qwen2.5-VL or InternVL).
        num_samples: how many samples to draw.
        seed: the seed of the draw.
        image_scale: Qwen-VL images are drawn at this share of their resolution (sides and the processor's
            pixel bounds scaled alike, so the patch counts keep the distribution's shape at ``image_scale**2``
            of its size); 1 is the processor at its defaults, smaller values keep a tiny model on a CPU fast.

    Returns:
        ``Lengths`` with ``vit_seqlens`` (text models: text-only samples).
    """
    num_samples = check_positive_int("num_samples", num_samples)
    check_image_scale(image_scale)
    maker = SampleMaker.for_config(config)
    rng = np.random.default_rng([seed, 17])
    tiles, text = _bundled(num_samples, rng)
    if maker.kind == "text":
        return Lengths(
            np.zeros(num_samples, np.int64),
            text,
            sources=("calibration:text",),
            vit_seqlens=np.zeros(0, np.int64),
            vit_seqlens_offsets=np.zeros(num_samples + 1, np.int64),
        )
    if maker.kind == "tiles":
        offsets = np.concatenate([[0], np.cumsum(tiles)])
        return Lengths(
            tiles,
            text + tiles * maker.tokens_per_tile,
            sources=("calibration:tiles",),
            vit_seqlens=np.ones(int(tiles.sum()), np.int64),
            vit_seqlens_offsets=offsets,
        )
    images = rng.choice(np.asarray(_IMAGES), size=num_samples, p=np.asarray(_IMAGE_SHARES))
    patches = _image_patches(rng, int(images.sum()), config.vision_config, float(image_scale))
    offsets = np.concatenate([[0], np.cumsum(images)])
    vit = row_sums(offsets, patches)
    image_tokens = vit // (maker.merge * maker.merge) + images  # placeholders and a vision-start token each
    return Lengths(
        vit, text + image_tokens, sources=("calibration:patches",), vit_seqlens=patches, vit_seqlens_offsets=offsets
    )


def calibration_packs(
    lengths: Lengths, num_packs: int, *, seed: int = 0, capacity_scales: Sequence[float] = CAPACITY_SCALES
) -> list[np.ndarray]:
    """``num_packs`` packs of ``lengths``: random next-fit plans (``plan_packs`` with ``method="random"``) whose
    capacities are ``scale`` times the mean sample's loads, for every scale, their packs taken in turn (each plan's
    in its own order). Samples above a plan's capacities get a pack of their own (``oversize="single"``), so the packs
    range from one short sample to many.

    Raises:
        ValueError: the plans hold fewer than ``num_packs`` packs (draw more samples).
    """
    num_packs = check_positive_int("num_packs", num_packs)
    mean_vit, mean_llm = float(lengths.vit.mean()), float(lengths.llm.mean())
    plans = []
    for k, scale in enumerate(capacity_scales):
        plan = plan_packs(
            lengths,
            PlanOptions(
                method="random",
                vit_capacity=int(np.ceil(scale * mean_vit)),
                llm_capacity=max(1, int(np.ceil(scale * mean_llm))),
                oversize="single",
                seed=seed + k,
            ),
            world_size=1,
        )
        plans.append([plan.pack_samples[a:b] for a, b in zip(plan.pack_offsets[:-1], plan.pack_offsets[1:])])
    packs: list[np.ndarray] = []
    for i in range(max(len(p) for p in plans)):
        for plan_packs_ in plans:
            if i < len(plan_packs_) and len(packs) < num_packs:
                packs.append(np.asarray(plan_packs_[i], dtype=np.int64))
    if len(packs) < num_packs:
        raise ValueError(
            f"the plans of {len(lengths)} samples hold {len(packs)} packs, fewer than num_packs="
            f"{num_packs}; draw more samples"
        )
    return packs
