"""Numpy twins of :mod:`omnibal_kernels.ops.vision_counts`: InternVL tile grids and Qwen2-VL ``smart_resize``.

Same names, arguments and outputs as the Triton ops (numpy in, numpy out; torch tensors in, CPU tensors out);
the integers match the published Python formulas exactly (tests/test_vision_counts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import QWEN2VL_MAX_RATIO
from .._contracts.vision_counts import ResizedSize, TileGrid, host_sizes, like_input

__all__ = ["internvl_tile_grid", "smart_resize"]

# Images per chunk: bounds the (chunk, candidates) float64 matrix of the InternVL search to ~20 MB.
_CHUNK = 1 << 16


def _round_half_even_div(x: np.ndarray, d: int) -> np.ndarray:
    q, r = np.divmod(x, d)
    return q + ((2 * r > d) | ((2 * r == d) & (q % 2 == 1)))


def internvl_tile_grid(
    widths: Any, heights: Any, ratios: Sequence[tuple[int, int]], image_size: int, use_thumbnail: bool
) -> TileGrid:
    """:class:`TileGrid` of ``(N,)`` int64 arrays; ``ratios`` in InternVL's scan order."""
    w, h = host_sizes(widths, heights)
    return TileGrid(*like_input(widths, *_internvl_grid(w, h, list(ratios), image_size, use_thumbnail)))


def smart_resize(widths: Any, heights: Any, factor: int, min_pixels: int, max_pixels: int) -> ResizedSize:
    """Qwen2-VL ``smart_resize``: :class:`ResizedSize` of ``(N,)`` int64 arrays."""
    w, h = host_sizes(widths, heights, max_ratio=QWEN2VL_MAX_RATIO)
    return ResizedSize(*like_input(widths, *_smart_resize(h, w, factor, min_pixels, max_pixels)))


def _internvl_grid(
    widths: np.ndarray, heights: np.ndarray, ratios: list[tuple[int, int]], image_size: int, use_thumbnail: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        w = widths[lo : lo + _CHUNK]
        h = heights[lo : lo + _CHUNK]
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
        cols[lo : lo + _CHUNK] = cand_cols[last]
        rows[lo : lo + _CHUNK] = cand_rows[last]
    tiles = cols * rows
    if use_thumbnail:
        tiles = tiles + (tiles != 1)
    return cols, rows, tiles


def _smart_resize(
    heights: np.ndarray, widths: np.ndarray, factor: int, min_pixels: int, max_pixels: int
) -> tuple[np.ndarray, np.ndarray]:
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
