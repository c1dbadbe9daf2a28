"""Numba twin of :mod:`omnibal_kernels.ops.patchify`: images -> packed Qwen2-VL patches on the CPU.

Same name, arguments and outputs as the Triton op. The copy works on integer views of the pixels (same
element size), so every dtype torch has, bfloat16 included, is moved bit for bit. Matches
``omnibal_kernels.testing.references.patchify_reference`` exactly.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from .._checks import check_cpu_tensor
from .._contracts.patchify import ELEMENT_VIEW, PackedPatches, patch_segments, plan_patches


@numba.njit(nogil=True)
def _patchify_image(
    src: np.ndarray,
    out: np.ndarray,
    pos: np.ndarray,
    first: int,
    grid_t: int,
    grid_h: int,
    grid_w: int,
    tp: int,
    ps: int,
    ms: int,
) -> None:
    frames = src.shape[0]
    channels = src.shape[1]
    r = first
    for gt in range(grid_t):
        for bh in range(grid_h // ms):
            for bw in range(grid_w // ms):
                for mh in range(ms):
                    for mw in range(ms):
                        row = bh * ms + mh
                        col = bw * ms + mw
                        pos[r, 0] = row
                        pos[r, 1] = col
                        k = 0
                        # feature order (channel, temporal, patch row, patch col)
                        for c in range(channels):
                            for ti in range(tp):
                                f = min(gt * tp + ti, frames - 1)  # short clips repeat their last frame
                                for ph in range(ps):
                                    y = row * ps + ph
                                    for pw in range(ps):
                                        out[r, k] = src[f, c, y, col * ps + pw]
                                        k += 1
                        r += 1


def patchify(
    images: Any, sizes: Any = None, *, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2
) -> PackedPatches:
    """CPU version of :func:`omnibal_kernels.ops.patchify.patchify` (same arguments and outputs)."""
    plan = plan_patches(images, sizes, patch_size, merge_size, temporal_patch_size)
    check_cpu_tensor("patchify", plan.views[0])
    total = int(plan.first_patch[-1])
    dim = plan.channels * temporal_patch_size * patch_size * patch_size
    out = torch.empty((total, dim), dtype=plan.dtype)
    pos = np.empty((total, 2), dtype=np.int64)
    as_int = getattr(torch, ELEMENT_VIEW[out.element_size()])
    out_np = out.view(as_int).numpy()
    for i, v in enumerate(plan.views):
        src = v.detach().view(as_int).numpy()  # pixels are data: no gradient flows through patchify
        t, h, w = (int(x) for x in plan.grid[i])
        _patchify_image(
            src, out_np, pos, int(plan.first_patch[i]), t, h, w, temporal_patch_size, patch_size, merge_size
        )
    cu, max_seqlen = patch_segments(plan.grid)
    return PackedPatches(
        out, torch.from_numpy(cu), max_seqlen, torch.from_numpy(pos), torch.from_numpy(plan.grid.copy())
    )
