"""Triton twins of the vision counts in :mod:`omnibal_kernels.vision`, for sizes already on the GPU.

* ``_internvl_tiles_kernel``: per image ``(width, height)`` int64 -> InternVL grid ``(cols, rows)`` and tile count,
  scanning the candidate grids in InternVL's order with its tie rule.
* ``_smart_resize_kernel``: per image -> Qwen2-VL ``smart_resize`` ``(height, width)`` (int64 rounding,
  float64 ``sqrt``/division rounded to nearest as Python's ``math`` does).

All float math is float64: there ``/`` and ``sqrt`` lower to the IEEE round-to-nearest instructions
(``div.rn.f64``, ``sqrt.rn.f64``; only float32 has approximate forms), so results match Python's and numpy's.
Both give exactly the integers of the numpy path (``omnibal_kernels.testing.references.internvl_tiles_reference`` and
``smart_resize_reference`` are the per-image references). Inputs are int64 tensors of one device; outputs int64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .._checks import QWEN2VL_MAX_RATIO
from .._contracts.vision_counts import ResizedSize, TileGrid, device_sizes
from . import _launch

# Images per program: the kernels are tiny and memory bound; 256 keeps enough programs for 10^5 images.
BLOCK = 256


# Integer scalars are never specialized: a value of 1 would otherwise turn into a constexpr without `.to`.
@triton.jit(do_not_specialize=["n", "num_cands", "image_size"])
def _internvl_tiles_kernel(
    # pointers: sizes in, candidate grids, outputs
    w_ptr,
    h_ptr,
    cand_cols_ptr,
    cand_rows_ptr,
    cols_ptr,
    rows_ptr,
    tiles_ptr,
    # sizes
    n,
    num_cands,
    image_size,
    # constexprs
    USE_THUMBNAIL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask, other=1).to(tl.float64)
    h = tl.load(h_ptr + offs, mask=mask, other=1).to(tl.float64)
    aspect = w / h
    area = w * h  # exact: sides are at most 2**26
    size_f = image_size.to(tl.float64)
    best_diff = tl.full([BLOCK], float("inf"), tl.float64)
    best_cols = tl.full([BLOCK], 1, tl.int64)
    best_rows = tl.full([BLOCK], 1, tl.int64)
    for k in range(num_cands):
        c = tl.load(cand_cols_ptr + k)
        r = tl.load(cand_rows_ptr + k)
        cand_aspect = c.to(tl.float64) / r.to(tl.float64)
        diff = tl.abs(aspect - cand_aspect)
        # same association order as InternVL's 0.5 * image_size * image_size * cols * rows
        half_area = 0.5 * size_f * size_f * c.to(tl.float64) * r.to(tl.float64)
        less = diff < best_diff
        take = less | ((diff == best_diff) & (area > half_area))
        best_diff = tl.where(less, diff, best_diff)
        best_cols = tl.where(take, c, best_cols)
        best_rows = tl.where(take, r, best_rows)
    tiles = best_cols * best_rows
    if USE_THUMBNAIL:
        tiles = tl.where(tiles != 1, tiles + 1, tiles)
    tl.store(cols_ptr + offs, best_cols, mask=mask)
    tl.store(rows_ptr + offs, best_rows, mask=mask)
    tl.store(tiles_ptr + offs, tiles, mask=mask)


@triton.jit
def _round_half_even_div(x, d):
    q = x // d
    r = x - q * d
    up = (2 * r > d) | ((2 * r == d) & ((q % 2) == 1))
    return q + up.to(tl.int64)


@triton.jit(do_not_specialize=["n", "factor", "min_pixels", "max_pixels"])
def _smart_resize_kernel(
    # pointers
    w_ptr,
    h_ptr,
    h_out_ptr,
    w_out_ptr,
    # sizes and the resize parameters (ints)
    n,
    factor,
    min_pixels,
    max_pixels,
    # constexprs
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask, other=1)
    h = tl.load(h_ptr + offs, mask=mask, other=1)
    f = factor.to(tl.int64)
    h_bar = _round_half_even_div(h, f) * f
    w_bar = _round_half_even_div(w, f) * f
    bar_area = h_bar * w_bar
    down = bar_area > max_pixels
    up = (bar_area < min_pixels) & (~down)
    hf = h.to(tl.float64)
    wf = w.to(tl.float64)
    ff = f.to(tl.float64)
    area = hf * wf  # exact: sides are at most 2**26
    beta_down = tl.sqrt(area / max_pixels.to(tl.float64))
    h_down = tl.floor(hf / beta_down / ff).to(tl.int64) * f
    w_down = tl.floor(wf / beta_down / ff).to(tl.int64) * f
    h_down = tl.maximum(h_down, f)
    w_down = tl.maximum(w_down, f)
    beta_up = tl.sqrt(min_pixels.to(tl.float64) / area)
    h_up = tl.ceil(hf * beta_up / ff).to(tl.int64) * f
    w_up = tl.ceil(wf * beta_up / ff).to(tl.int64) * f
    h_res = tl.where(down, h_down, tl.where(up, h_up, h_bar))
    w_res = tl.where(down, w_down, tl.where(up, w_up, w_bar))
    tl.store(h_out_ptr + offs, h_res, mask=mask)
    tl.store(w_out_ptr + offs, w_res, mask=mask)


def internvl_tile_grid(
    widths: torch.Tensor, heights: torch.Tensor, ratios: Sequence[tuple[int, int]], image_size: int, use_thumbnail: bool
) -> TileGrid:
    """:class:`TileGrid` of ``(N,)`` int64 tensors on the input's device; ``ratios`` in InternVL's scan order."""
    w, h = device_sizes(widths, heights)
    _launch.check_launchable(w, "internvl_tile_grid")
    n = w.numel()
    cand_cols = torch.tensor([r[0] for r in ratios], dtype=torch.int64, device=w.device)
    cand_rows = torch.tensor([r[1] for r in ratios], dtype=torch.int64, device=w.device)
    cols = _launch.alloc((n,), torch.int64, w.device)
    rows = _launch.alloc((n,), torch.int64, w.device)
    tiles = _launch.alloc((n,), torch.int64, w.device)
    if n:
        _internvl_tiles_kernel[(triton.cdiv(n, BLOCK),)](
            w_ptr=w,
            h_ptr=h,
            cand_cols_ptr=cand_cols,
            cand_rows_ptr=cand_rows,
            cols_ptr=cols,
            rows_ptr=rows,
            tiles_ptr=tiles,
            n=n,
            num_cands=len(ratios),
            image_size=image_size,
            USE_THUMBNAIL=use_thumbnail,
            BLOCK=BLOCK,
        )
    return TileGrid(cols, rows, tiles)


def smart_resize(
    widths: torch.Tensor, heights: torch.Tensor, factor: int, min_pixels: int, max_pixels: int
) -> ResizedSize:
    """Qwen2-VL ``smart_resize``: :class:`ResizedSize` of ``(N,)`` int64 tensors on the input's device."""
    w, h = device_sizes(widths, heights, max_ratio=QWEN2VL_MAX_RATIO)
    _launch.check_launchable(w, "smart_resize")
    n = w.numel()
    h_out = _launch.alloc((n,), torch.int64, w.device)
    w_out = _launch.alloc((n,), torch.int64, w.device)
    if n:
        _smart_resize_kernel[(triton.cdiv(n, BLOCK),)](
            w_ptr=w,
            h_ptr=h,
            h_out_ptr=h_out,
            w_out_ptr=w_out,
            n=n,
            factor=factor,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            BLOCK=BLOCK,
        )
    return ResizedSize(h_out, w_out)
