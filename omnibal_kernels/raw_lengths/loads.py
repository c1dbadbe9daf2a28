"""The media side of the loads: image and video sizes -> ViT load and image tokens, by the model's rules.

Images go through :func:`~omnibal_kernels.vision.compute_loads` (``internvl_num_tiles`` / ``qwen2vl_grid``).
Videos: InternVL counts each kept frame as one tile with its image tokens; Qwen2-VL counts a video as a grid of
``num_frames`` frames with the video processor's own patch settings and pixel bounds.
"""
from __future__ import annotations

import numpy as np

from ..vision.loads import compute_loads
from .media import VideoInfo
from .spec import ModelSpec

__all__ = ["media_loads", "video_frames"]


def video_frames(spec: ModelSpec, info: VideoInfo) -> int:
    """Frames of the video the model sees after the video processor's sampling.

    Raises:
        ValueError: the processor's sampling is undefined for the video (no frame rate, too few frames).
    """
    if spec.family == "internvl":
        return spec.sampling.uniform_frames(info.num_frames, info.fps)
    return spec.sampling.frames(info.num_frames, info.fps, spec.video_temporal_patch_size)


def media_loads(spec: ModelSpec, sizes: list[list[tuple[int, int]]], videos: list[list[tuple[VideoInfo, int]]],
                text_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(vit, llm)`` of ``N`` samples, each ``(N,)`` int64.

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
        loads = compute_loads(sizes, text_tokens, model="internvl", num_image_token=spec.num_image_token,
                              image_size=spec.image_size, use_thumbnail=spec.use_thumbnail, progress=False,
                              **tiling)
        # Video frames are single tiles (no dynamic tiling), each with its image tokens.
        frames = np.array([sum(f for _, f in v) for v in videos], dtype=np.int64)
        return loads.vit + frames, loads.llm + frames * spec.num_image_token
    loads = compute_loads(sizes, text_tokens, model="qwen2vl", patch_size=spec.patch_size,
                          merge_size=spec.merge_size, temporal_patch_size=spec.temporal_patch_size,
                          min_pixels=spec.min_pixels, max_pixels=spec.max_pixels, progress=False)
    vit, llm = loads.vit.copy(), loads.llm.copy()
    flat = [(s, info, f) for s, vs in enumerate(videos) for info, f in vs]
    # Videos whose frame cap differs are counted in separate calls (the cap is one scalar per call).
    groups: dict[int, list[int]] = {}
    for k, (_, _, f) in enumerate(flat):
        groups.setdefault(_video_max_pixels(spec, f), []).append(k)
    for max_pixels, ks in groups.items():
        v = compute_loads(np.array([[flat[k][1].width, flat[k][1].height] for k in ks], dtype=np.int64),
                          np.zeros(len(sizes), dtype=np.int64), model="qwen2vl",
                          image_to_sample=np.array([flat[k][0] for k in ks], dtype=np.int64),
                          num_frames=np.array([flat[k][2] for k in ks], dtype=np.int64),
                          patch_size=spec.video_patch_size, merge_size=spec.video_merge_size,
                          temporal_patch_size=spec.video_temporal_patch_size,
                          min_pixels=spec.video_min_pixels, max_pixels=max_pixels, progress=False)
        vit += v.vit
        llm += v.llm
    return vit, llm


def _video_max_pixels(spec: ModelSpec, frames: int) -> int:
    if not spec.cap_pixels_per_frame:
        return spec.video_max_pixels
    # Qwen2VLVideoProcessor.resize with cap_pixels_per_frame: an even share of a total pixel budget.
    factor = spec.video_patch_size * spec.video_merge_size
    total = int(spec.max_video_tokens * factor * factor * 0.9)
    return max(min(spec.video_max_pixels, total * spec.video_temporal_patch_size // frames),
               int(spec.video_min_pixels * 1.05))
