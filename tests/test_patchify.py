"""patchify: Triton kernel (TRITON_INTERPRET on CPU) and numba twin against the reshape/permute reference."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

from omnibal_kernels.testing import patchify_reference
from omnibal_kernels.vision import qwen2vl_grid


def _images(
    rng: np.random.Generator, n: int, dtype: torch.dtype, video: bool = False, factor: int = 28, channels: int = 3
) -> list[torch.Tensor]:
    out = []
    for _ in range(n):
        h, w = factor * int(rng.integers(1, 4)), factor * int(rng.integers(1, 4))
        shape = (int(rng.integers(1, 6)), channels, h, w) if video else (channels, h, w)
        x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 50)
        out.append(x.to(dtype))
    return out


def _expected(images, p=14, m=2, tp=2):
    parts = [patchify_reference(x, p, m, tp) for x in images]
    patches = torch.cat([a for a, _, _ in parts])
    pos = torch.cat([b for _, b, _ in parts])
    grid = torch.tensor([g for _, _, g in parts], dtype=torch.int64)
    seg = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), seg.cumsum(0)])
    return patches, pos, grid, cu


def _check(out, images, **kw) -> None:
    patches, pos, grid, cu = _expected(images, **kw)
    assert out.patches.dtype == images[0].dtype
    assert torch.equal(out.patches, patches)  # a copy: bit-exact
    assert torch.equal(out.patch_positions, pos)
    assert torch.equal(out.image_grid_thw, grid)
    assert out.vit_cu_seqlens.dtype == torch.int32 and out.vit_cu_seqlens.tolist() == cu.tolist()
    assert out.vit_max_seqlen == int((grid[:, 1] * grid[:, 2]).max())


def _impls():
    from omnibal_kernels.cpu.patchify import patchify as cpu_pack
    from omnibal_kernels.ops.patchify import launch_patchify as pack_patches_triton

    return [("numba", cpu_pack), ("triton", pack_patches_triton)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
@pytest.mark.parametrize("impl", ["numba", "triton"])
def test_images_list(dtype: torch.dtype, impl: str) -> None:
    fn = dict(_impls())[impl]
    rng = np.random.default_rng(0)
    images = _images(rng, 3, dtype)
    _check(fn(images), images)


@pytest.mark.parametrize("impl", ["numba", "triton"])
def test_videos_odd_frames_and_layout_options(impl: str) -> None:
    fn = dict(_impls())[impl]
    rng = np.random.default_rng(1)
    clips = _images(rng, 3, torch.float32, video=True)
    _check(fn(clips), clips)
    # another patch/merge/temporal layout and channel count
    imgs = _images(rng, 2, torch.float32, factor=12, channels=1, video=True)
    _check(fn(imgs, patch_size=4, merge_size=3, temporal_patch_size=3), imgs, p=4, m=3, tp=3)


@pytest.mark.parametrize("impl", ["numba", "triton"])
def test_padded_and_strided_inputs(impl: str) -> None:
    fn = dict(_impls())[impl]
    rng = np.random.default_rng(2)
    images = _images(rng, 3, torch.float32)
    hmax = max(x.shape[1] for x in images)
    wmax = max(x.shape[2] for x in images)
    padded = torch.full((3, 3, hmax, wmax), float("nan"))  # padding must never be read
    for i, x in enumerate(images):
        padded[i, :, : x.shape[1], : x.shape[2]] = x
    sizes = torch.tensor([[x.shape[1], x.shape[2]] for x in images])
    _check(fn(padded, sizes), images)
    # channels-last storage: strides, not a copy
    cl = [x.unsqueeze(0).contiguous(memory_format=torch.channels_last)[0] for x in images]
    assert not cl[0].is_contiguous()
    _check(fn(cl), images)


def test_public_dispatch_and_grid_agree_with_counts() -> None:
    from omnibal_kernels import patchify as pack_patches

    rng = np.random.default_rng(3)
    images = _images(rng, 4, torch.float32)
    out = pack_patches(images)
    _check(out, images)
    # sides that are multiples of 28 and inside [min_pixels, max_pixels] stay as they are
    g = qwen2vl_grid([x.shape[2] for x in images], [x.shape[1] for x in images], min_pixels=28 * 28)
    np.testing.assert_array_equal(out.image_grid_thw.numpy(), g.grid_thw)


def test_errors_name_the_image() -> None:
    from omnibal_kernels import patchify as pack_patches

    good = torch.zeros(3, 28, 28)
    with pytest.raises(ValueError, match="image 1"):
        pack_patches([good, torch.zeros(3, 30, 28)])
    with pytest.raises(ValueError, match="image 1"):
        pack_patches([good, torch.zeros(1, 28, 28)])
    with pytest.raises(ValueError, match="image 1"):
        pack_patches([good, good.double()])
    with pytest.raises(ValueError, match="image 0"):
        pack_patches(torch.zeros(2, 3, 56, 56), torch.tensor([[84, 28], [28, 28]]))
    with pytest.raises(ValueError, match="sizes"):
        pack_patches(torch.zeros(2, 3, 56, 56))
    with pytest.raises(TypeError, match="image 0"):
        pack_patches([np.zeros((3, 28, 28))])
    with pytest.raises(ValueError, match="no images"):
        pack_patches([])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_matches_reference(dtype: torch.dtype) -> None:
    from omnibal_kernels import patchify as pack_patches

    rng = np.random.default_rng(4)
    images = [x.cuda() for x in _images(rng, 9, dtype)] + [x.cuda() for x in _images(rng, 2, dtype, video=True)]
    out = pack_patches(images)
    patches, pos, grid, cu = _expected([x.cpu() for x in images])
    assert torch.equal(out.patches.cpu(), patches)
    assert torch.equal(out.patch_positions.cpu(), pos)
    assert out.vit_cu_seqlens.cpu().tolist() == cu.tolist()
