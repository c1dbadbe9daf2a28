"""The media side of the loads: image and video sizes -> ViT load, ViT sequences and image tokens, by the
model's rules.

Images go through :func:`~omnibal_kernels.vision.compute_loads` (``internvl_num_tiles`` / ``qwen2vl_grid``).
Videos: InternVL counts each kept frame as one tile with its image tokens; Qwen2-VL counts a video as a grid of
``num_frames`` frames with the video processor's own patch settings and pixel bounds. A sample's ViT sequences
are its images' then its videos', each in its order: the images and the videos pass the vision tower in two
calls, each attending its inputs as :func:`~omnibal_kernels.vision.compute_loads` says.
"""

from __future__ import annotations

import numpy as np

from .._csr import offsets_from_counts, take_rows
from ..lengths import Lengths
from ..vision.loads import compute_loads
from .media import VideoInfo
from .spec import ModelSpec

__all__ = ["media_item_tokens", "media_loads", "sequence_rows", "video_frames"]


def video_frames(spec: ModelSpec, info: VideoInfo) -> int:
    """Frames of the video the model sees after the video processor's sampling.

    Raises:
        ValueError: the processor's sampling is undefined for the video (no frame rate, too few frames).
    """
    if spec.family == "internvl":
        return spec.sampling.uniform_frames(info.num_frames, info.fps)
    return spec.sampling.frames(info.num_frames, info.fps, spec.video_temporal_patch_size)


def media_loads(
    spec: ModelSpec,
    sizes: list[list[tuple[int, int]]],
    videos: list[list[tuple[VideoInfo, int]]],
    text_tokens: np.ndarray,
) -> Lengths:
    """The loads of ``N`` samples: ``vit``, ``llm`` (text and image tokens) and the ViT sequences.

    Args:
        spec: the model's settings.
        sizes: per sample, its images' ``(width, height)``.
        videos: per sample, its videos with the frames each gives the model (:func:`video_frames`).
        text_tokens: ``(N,)`` tokens of each sample's text with no image tokens.

    Raises:
        ValueError: a load out of range (naming the sample by its position in these lists).
    """
    if spec.family == "internvl":
        tiling = dict(min_num=spec.min_num, max_num=spec.max_num) if spec.dynamic else dict(min_num=1, max_num=1)
        loads = compute_loads(
            sizes,
            text_tokens,
            model="internvl",
            num_image_token=spec.num_image_token,
            image_size=spec.image_size,
            use_thumbnail=spec.use_thumbnail,
            progress=False,
            **tiling,
        )
        # Video frames are single tiles (no dynamic tiling), each with its image tokens: every ViT sequence
        # is one tile, so the sequences follow from the ViT loads.
        frames = np.array([sum(f for _, f in v) for v in videos], dtype=np.int64)
        vit = loads.vit + frames
        offsets = offsets_from_counts(vit)
        return Lengths(
            vit,
            loads.llm + frames * spec.num_image_token,
            vit_seqlens=np.ones(int(offsets[-1]), np.int64),
            vit_seqlens_offsets=offsets,
        )
    images = compute_loads(
        sizes,
        text_tokens,
        model=spec.model,
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        temporal_patch_size=spec.temporal_patch_size,
        min_pixels=spec.min_pixels,
        max_pixels=spec.max_pixels,
        progress=False,
    )
    flat = [(s, info, f) for s, vs in enumerate(videos) for info, f in vs]
    if not flat:
        return images
    # Videos whose frame cap differs are counted in separate calls (the cap is one scalar per call), each
    # video as its own row; rows then go back to the order of ``flat`` (sample by sample).
    groups: dict[int, list[int]] = {}
    for k, (_, _, f) in enumerate(flat):
        groups.setdefault(_video_max_pixels(spec, f), []).append(k)
    per_video = Lengths.concat(
        compute_loads(
            np.array([[flat[k][1].width, flat[k][1].height] for k in ks], dtype=np.int64),
            np.zeros(len(ks), dtype=np.int64),
            model=spec.model,
            image_to_sample=np.arange(len(ks), dtype=np.int64),
            num_frames=np.array([flat[k][2] for k in ks], dtype=np.int64),
            patch_size=spec.video_patch_size,
            merge_size=spec.video_merge_size,
            temporal_patch_size=spec.video_temporal_patch_size,
            min_pixels=spec.video_min_pixels,
            max_pixels=max_pixels,
            progress=False,
        )
        for max_pixels, ks in groups.items()
    )
    per_video = per_video[np.argsort(np.concatenate([ks for ks in groups.values()]))]
    return _images_then_videos(images, per_video, np.array([s for s, _, _ in flat], dtype=np.int64))


def _images_then_videos(images: Lengths, per_video: Lengths, owner: np.ndarray) -> Lengths:
    """Per sample: its images' loads plus its videos' (rows of ``per_video``, ``owner`` increasing), the
    images' ViT sequences first."""
    n = len(images)
    image_offsets, image_seqlens = sequence_rows(images)
    video_offsets, video_seqlens = sequence_rows(per_video)
    vit, llm, seqs = (
        np.bincount(owner, weights=x, minlength=n).astype(np.int64)
        for x in (per_video.vit, per_video.llm, np.diff(video_offsets))
    )
    # both kinds as 2N rows of one table (images 0..N-1, videos N..2N-1), taken sample by sample
    offsets = np.concatenate([image_offsets, image_offsets[-1] + np.cumsum(seqs)])
    values = np.concatenate([image_seqlens, video_seqlens])
    rows = np.stack([np.arange(n), np.arange(n, 2 * n)], axis=1).ravel()
    joined, seqlens = take_rows(offsets, values, rows)
    return Lengths(images.vit + vit, images.llm + llm, vit_seqlens=seqlens, vit_seqlens_offsets=joined[::2])


def sequence_rows(loads: Lengths) -> tuple[np.ndarray, np.ndarray]:
    """``(vit_seqlens_offsets, vit_seqlens)`` of loads that :func:`compute_loads` made (it always gives them)."""
    if loads.vit_seqlens is None or loads.vit_seqlens_offsets is None:
        raise ValueError("loads without ViT sequences")
    return loads.vit_seqlens_offsets, loads.vit_seqlens


def media_item_tokens(spec: ModelSpec, sizes: list[tuple[int, int]], videos: list[tuple[VideoInfo, int]]) -> np.ndarray:
    """``(len(sizes) + len(videos),)`` int64 LLM image tokens of each image, then each video, of one sample."""
    k = len(sizes) + len(videos)
    items = media_loads(
        spec,
        [[s] for s in sizes] + [[] for _ in videos],
        [[] for _ in sizes] + [[v] for v in videos],
        np.zeros(k, dtype=np.int64),
    )
    return items.llm


def _video_max_pixels(spec: ModelSpec, frames: int) -> int:
    if not spec.cap_pixels_per_frame:
        return spec.video_max_pixels
    # Qwen2VLVideoProcessor.resize with cap_pixels_per_frame: an even share of a total pixel budget.
    factor = spec.video_patch_size * spec.video_merge_size
    total = int(spec.max_video_tokens * factor * factor * 0.9)
    return max(
        min(spec.video_max_pixels, total * spec.video_temporal_patch_size // frames), int(spec.video_min_pixels * 1.05)
    )
