"""Plain references shared by tests and benchmarks: slow, simple, obviously correct."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

# ------------------------------------------------------------------------------------------- vision


def ref_internvl_tiles(width: int, height: int, min_num: int = 1, max_num: int = 12, image_size: int = 448,
                       use_thumbnail: bool = True) -> tuple[int, int, int]:
    """``(cols, rows, num_tiles)`` of one image by InternVL's published dynamic-resolution scan."""
    if width <= 0 or height <= 0:
        raise ValueError("image sides must be positive")
    candidates = set()
    for n in range(min_num, max_num + 1):
        for i in range(1, n + 1):
            for j in range(1, n + 1):
                if min_num <= i * j <= max_num:
                    candidates.add((i, j))
    candidates = sorted(candidates, key=lambda c: c[0] * c[1])
    aspect = width / height
    area = width * height
    best_diff = float("inf")
    best = (1, 1)
    for cand in candidates:
        diff = abs(aspect - cand[0] / cand[1])
        if diff < best_diff:
            best_diff = diff
            best = cand
        elif diff == best_diff and area > 0.5 * image_size * image_size * cand[0] * cand[1]:
            best = cand
    tiles = best[0] * best[1]
    if use_thumbnail and tiles != 1:
        tiles += 1
    return best[0], best[1], tiles


def ref_smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                     max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """Qwen2-VL ``smart_resize`` of one image, as transformers publishes it: ``(h, w)``."""
    if height <= 0 or width <= 0:
        raise ValueError("image sides must be positive")
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be at most 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def ref_qwen2vl_counts(height: int, width: int, frames: int = 1, patch_size: int = 14, merge_size: int = 2,
                       temporal_patch_size: int = 2, min_pixels: int = 56 * 56,
                       max_pixels: int = 28 * 28 * 1280) -> tuple[tuple[int, int, int], int, int]:
    """``((t, h, w), num_patches, num_tokens)`` of one image or video for Qwen2-VL."""
    h, w = ref_smart_resize(height, width, patch_size * merge_size, min_pixels, max_pixels)
    t = -(-frames // temporal_patch_size)
    patches = t * (h // patch_size) * (w // patch_size)
    return (t, h // patch_size, w // patch_size), patches, patches // merge_size**2


def ref_bucket_sort(counts: Any, boundaries: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(perm, offsets, bucket_ids)`` of a stable sort of items by bucket (``searchsorted`` + ``argsort``)."""
    counts = np.asarray(counts, dtype=np.int64)
    boundaries = np.asarray(boundaries, dtype=np.int64)
    bucket_ids = np.searchsorted(boundaries, counts, side="right")
    perm = np.argsort(bucket_ids, kind="stable")
    sizes = np.bincount(bucket_ids, minlength=boundaries.shape[0] + 1)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return perm.astype(np.int64), offsets.astype(np.int64), bucket_ids.astype(np.int32)


def ref_mrope_positions(input_ids: Sequence[int], image_grids: Sequence[Sequence[int]],
                        video_grids: Sequence[Sequence[int]] = (), image_token_id: int = -1,
                        video_token_id: int = -2, spatial_merge_size: int = 2,
                        video_seconds: Sequence[float] | None = None,
                        tokens_per_second: float | None = None) -> list[tuple[int, int, int]]:
    """One sample's Qwen2-VL mRoPE positions, token by token: ``[(t, h, w), ...]``."""
    out: list[tuple[int, int, int]] = []
    next_pos = 0
    i = 0
    images, videos = list(image_grids), list(video_grids)
    n_img = n_vid = 0
    while i < len(input_ids):
        tok = input_ids[i]
        if tok == image_token_id or tok == video_token_id:
            if tok == image_token_id:
                t, h, w = images[n_img]
                n_img += 1
                seconds = None
            else:
                t, h, w = videos[n_vid]
                seconds = None if video_seconds is None else video_seconds[n_vid]
                n_vid += 1
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            block = []
            for ti in range(t):
                tv = ti if seconds is None else int(ti * seconds * tokens_per_second)
                for hi in range(gh):
                    for wi in range(gw):
                        block.append((next_pos + tv, next_pos + hi, next_pos + wi))
            out.extend(block)
            next_pos = max(max(p) for p in block) + 1
            i += len(block)
        else:
            out.append((next_pos, next_pos, next_pos))
            next_pos += 1
            i += 1
    return out


def ref_patchify(image: Any, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2):
    """Qwen2-VL patches of one ``(C, H, W)`` or ``(T, C, H, W)`` tensor by the image processor's
    reshape/permute; returns ``(patches (n, C*t*p*p), positions (n, 2) (row, col), (t, h, w))``."""
    import torch

    frames = image.unsqueeze(0) if image.dim() == 3 else image
    if frames.shape[0] % temporal_patch_size:
        pad = temporal_patch_size - frames.shape[0] % temporal_patch_size
        frames = torch.cat([frames, frames[-1:].expand(pad, *frames.shape[1:])], dim=0)
    t_len, c, h, w = frames.shape
    gt, gh, gw = t_len // temporal_patch_size, h // patch_size, w // patch_size
    x = frames.reshape(gt, temporal_patch_size, c, gh // merge_size, merge_size, patch_size,
                       gw // merge_size, merge_size, patch_size)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    patches = x.reshape(gt * gh * gw, c * temporal_patch_size * patch_size * patch_size)
    rows = torch.arange(gh).unsqueeze(1).expand(gh, gw)
    cols = torch.arange(gw).unsqueeze(0).expand(gh, gw)

    def merge_order(a):
        return a.reshape(gh // merge_size, merge_size, gw // merge_size, merge_size).permute(0, 2, 1, 3).flatten()

    positions = torch.stack([merge_order(rows), merge_order(cols)], dim=1).repeat(gt, 1)
    return patches, positions, (gt, gh, gw)
