"""``patchify``: images of different sizes -> one varlen sequence of Qwen2-VL ViT patches, on the GPU.

Input: a list of ``(C, H, W)`` images / ``(T, C, H, W)`` clips (any strides, one device and dtype), or one
padded ``(N, C, Hmax, Wmax)`` / ``(N, T, C, Hmax, Wmax)`` tensor plus ``(N, 2)`` ``(height, width)`` sizes; sides
multiples of ``patch_size * merge_size``. Output row ``r`` of ``patches`` ``(P, C * tp * p * p)`` is the patch
the Qwen2-VL image processor puts there: images in order; inside an image, frame groups, then 2x2 merge
windows row-major, then the patches of a window row-major; features ordered (channel, frame in the group,
patch row, patch col), with clips padded to a multiple of ``tp`` frames by repeating the last frame (a still
image fills all ``tp`` frames). ``patch_positions`` ``(P, 2)`` are each patch's (row, col) in its image, in
that order (Qwen2-VL's ``rot_pos_emb``), ``vit_cu_seqlens`` int32 one segment per frame group.

``_patchify_kernel`` is one program per patch: it looks up the patch's image in a small per-image table
(base address, grid, strides), then moves the ``C * tp`` rows of ``p * p`` pixels with one masked 2-D load
and one contiguous store. The copy runs on integer views of the element size, so every dtype is moved bit
for bit. Matches ``omnibal_kernels.testing.references.patchify_reference`` (reshape/permute) exactly; CPU
tensors go to the numba twin :mod:`omnibal_kernels.cpu.patchify`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from .._checks import use_cpu_twin
from .._contracts.patchify import ELEMENT_VIEW, PackedPatches, patch_segments, plan_patches
from . import _launch

# Per-image table columns (int64): first patch, grid_t, grid_h, grid_w, frames, stride_t, stride_c, stride_h,
# stride_w (strides in elements, so channels-last and padded views need no copy).
_META = 9
_TL_INT = {1: tl.uint8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


@triton.jit
def _patchify_kernel(
    # pointers: per-image addresses and table, per-patch image index, outputs
    base_ptr,
    meta_ptr,
    patch_image_ptr,
    out_ptr,
    pos_ptr,
    # sizes and layout
    C: tl.constexpr,
    TP: tl.constexpr,
    PS: tl.constexpr,
    MS: tl.constexpr,
    # block shapes: C * TP rows by PS * PS pixels, rounded up to powers of two
    BLOCK_CT: tl.constexpr,
    BLOCK_PP: tl.constexpr,
    # element type of the integer view being copied
    ELEM: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    img = tl.load(patch_image_ptr + pid).to(tl.int64)
    meta = meta_ptr + img * 9  # _META columns
    first = tl.load(meta + 0)
    grid_h = tl.load(meta + 2)
    grid_w = tl.load(meta + 3)
    frames = tl.load(meta + 4)
    stride_t = tl.load(meta + 5)
    stride_c = tl.load(meta + 6)
    stride_h = tl.load(meta + 7)
    stride_w = tl.load(meta + 8)
    src = tl.load(base_ptr + img).to(tl.pointer_type(ELEM))
    # local index -> (frame group, window row, window col, row in window, col in window)
    local = pid - first
    mw = local % MS
    q = local // MS
    mh = q % MS
    q = q // MS
    windows_w = grid_w // MS
    bw = q % windows_w
    q = q // windows_w
    windows_h = grid_h // MS
    bh = q % windows_h
    gt = q // windows_h
    row = bh * MS + mh
    col = bw * MS + mw
    ct = tl.arange(0, BLOCK_CT)
    c = ct // TP
    frame = tl.minimum(gt * TP + ct % TP, frames - 1)  # short clips repeat their last frame
    pp = tl.arange(0, BLOCK_PP)
    y = row * PS + pp // PS
    x = col * PS + pp % PS
    mask = (ct < C * TP)[:, None] & (pp < PS * PS)[None, :]
    offs = (frame * stride_t + c * stride_c)[:, None] + (y * stride_h + x * stride_w)[None, :]
    vals = tl.load(src + offs, mask=mask)
    dim = C * TP * PS * PS
    tl.store(out_ptr + pid * dim + (ct * (PS * PS))[:, None] + pp[None, :], vals, mask=mask)
    tl.store(pos_ptr + pid * 2, row)
    tl.store(pos_ptr + pid * 2 + 1, col)


def launch_patchify(
    images: Any, sizes: Any = None, *, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2
) -> PackedPatches:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``)."""
    plan = plan_patches(images, sizes, patch_size, merge_size, temporal_patch_size)
    _launch.check_launchable(plan.views[0], "patchify")
    device = plan.device
    n = len(plan.views)
    total = int(plan.first_patch[-1])
    dim = plan.channels * temporal_patch_size * patch_size * patch_size
    meta = np.empty((n, _META), dtype=np.int64)
    meta[:, 0] = plan.first_patch[:-1]
    meta[:, 1:4] = plan.grid
    meta[:, 4] = [v.shape[0] for v in plan.views]
    meta[:, 5:9] = [v.stride() for v in plan.views]
    base = torch.tensor([v.data_ptr() for v in plan.views], dtype=torch.int64)
    patch_image = np.repeat(np.arange(n, dtype=np.int32), np.diff(plan.first_patch))
    base = base.to(device)
    meta_t = torch.from_numpy(meta).to(device)
    patch_image_t = torch.from_numpy(patch_image).to(device)
    out = _launch.alloc((total, dim), plan.dtype, device)
    pos = _launch.alloc((total, 2), torch.int64, device)
    elem = out.element_size()
    if total:
        _patchify_kernel[(total,)](
            base_ptr=base,
            meta_ptr=meta_t,
            patch_image_ptr=patch_image_t,
            out_ptr=out.view(getattr(torch, ELEMENT_VIEW[elem])),
            pos_ptr=pos,
            C=plan.channels,
            TP=temporal_patch_size,
            PS=patch_size,
            MS=merge_size,
            BLOCK_CT=triton.next_power_of_2(plan.channels * temporal_patch_size),
            BLOCK_PP=triton.next_power_of_2(patch_size * patch_size),
            ELEM=_TL_INT[elem],
        )
    cu, max_seqlen = patch_segments(plan.grid)
    return PackedPatches(
        out, torch.from_numpy(cu).to(device), max_seqlen, pos, torch.from_numpy(plan.grid.copy()).to(device)
    )


def patchify(
    images: Any,
    sizes: Any = None,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    backend: str = "auto",
) -> PackedPatches:
    """Cut images into Qwen2-VL ViT patches and pack them into one varlen sequence.

    Args:
        images: a list of ``(C, H, W)`` images or ``(T, C, H, W)`` clips, or one padded tensor
            ``(N, C, Hmax, Wmax)`` / ``(N, T, C, Hmax, Wmax)`` with ``sizes``; sides already resized to
            multiples of ``patch_size * merge_size`` (:func:`omnibal_kernels.vision.qwen2vl_smart_resize`).
        sizes: ``(N, 2)`` ``(height, width)`` of each padded image (top-left aligned).
        patch_size, merge_size, temporal_patch_size: the vision tower's (14, 2, 2 for Qwen2-VL/2.5-VL).
        backend: ``"auto"`` (CUDA -> Triton kernel, CPU -> the numba twin in ``omnibal_kernels.cpu.patchify``),
            ``"triton"`` or ``"cpu"``.

    Returns:
        :class:`~omnibal_kernels.PackedPatches`: ``patches`` ``(P, C * tp * p * p)`` in the input dtype,
        ``vit_cu_seqlens`` int32 ``(S + 1,)``, ``vit_max_seqlen``, ``patch_positions`` int64 ``(P, 2)``,
        ``image_grid_thw`` int64 ``(N, 3)``; on the input's device. CUDA runs the Triton kernel, CPU the
        numba twin.

    Raises:
        ValueError/TypeError: sides not multiples of ``patch_size * merge_size``, mixed channels, dtypes or
            devices, bad ``sizes``, naming the image.
    """
    first = images[0] if isinstance(images, (list, tuple)) and images else images
    if use_cpu_twin("patchify", backend, first):
        from ..cpu.patchify import patchify as patchify_cpu

        return patchify_cpu(
            images, sizes, patch_size=patch_size, merge_size=merge_size, temporal_patch_size=temporal_patch_size
        )
    return launch_patchify(
        images, sizes, patch_size=patch_size, merge_size=merge_size, temporal_patch_size=temporal_patch_size
    )
