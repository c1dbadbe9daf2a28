"""Vision counts (InternVL tiles, Qwen2-VL smart_resize/patches/tokens) against the published per-image formulas."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton twins run in the interpreter on CPU; must be set before the kernel module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

from omnibal_kernels import testing
from omnibal_kernels.vision import (
    MAX_IMAGE_SIDE,
    internvl_num_tiles,
    internvl_target_ratios,
    internvl_tile_grid,
    qwen2vl_grid,
    qwen2vl_smart_resize,
)


def _random_sizes(rng: np.random.Generator, n: int, max_ratio: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Log-uniform sides (tiny to huge), exact multiples of candidate grids (ties), and extreme aspect ratios."""
    k = n // 4
    w1 = np.exp(rng.uniform(0, np.log(20000), k)).astype(np.int64) + 1
    h1 = np.exp(rng.uniform(0, np.log(20000), k)).astype(np.int64) + 1
    # exact aspect ratios of small grids at areas around InternVL's tie threshold
    c = rng.integers(1, 13, k)
    r = rng.integers(1, 13, k)
    m = rng.integers(1, 1400, k)
    w2, h2 = c * m, r * m
    # midpoints between two grids' aspect ratios, e.g. 3:2 between 1:1 and 2:1
    a = rng.integers(1, 7, k)
    b = rng.integers(1, 7, k)
    s = rng.integers(1, 300, k)
    w3, h3 = (2 * a + 1) * s, 2 * b * s
    # extreme: one side tiny, the other large; plus huge images
    rest = n - 3 * k
    w4 = np.where(rng.random(rest) < 0.5, rng.integers(1, 40, rest), rng.integers(1, MAX_IMAGE_SIDE // 64, rest))
    h4 = np.where(rng.random(rest) < 0.5, rng.integers(1, 40, rest), rng.integers(1, MAX_IMAGE_SIDE // 64, rest))
    w = np.concatenate([w1, w2, w3, w4])
    h = np.concatenate([h1, h2, h3, h4])
    if max_ratio is not None:
        keep = np.maximum(w, h) / np.minimum(w, h) <= max_ratio
        w, h = w[keep], h[keep]
    return w.astype(np.int64), h.astype(np.int64)


@pytest.mark.parametrize(
    "min_num,max_num,use_thumbnail",
    [(1, 12, True), (1, 6, True), (1, 2, False), (2, 4, True), (4, 4, False), (1, 1, True), (3, 9, True)],
)
def test_internvl_matches_published_scan(min_num: int, max_num: int, use_thumbnail: bool) -> None:
    rng = np.random.default_rng(100 + 13 * min_num + max_num)
    w, h = _random_sizes(rng, 3000)
    grid = internvl_tile_grid(w, h, min_num=min_num, max_num=max_num, use_thumbnail=use_thumbnail)
    expected = np.array(
        [testing.internvl_tiles_reference(int(a), int(b), min_num, max_num, 448, use_thumbnail) for a, b in zip(w, h)]
    )
    np.testing.assert_array_equal(grid.cols, expected[:, 0])
    np.testing.assert_array_equal(grid.rows, expected[:, 1])
    np.testing.assert_array_equal(grid.num_tiles, expected[:, 2])
    assert grid.num_tiles.dtype == np.int64


def test_internvl_ties_are_exercised() -> None:
    # (1,1) vs (2,2): same aspect; the area test picks (2,2) only above half of four tiles' area
    assert testing.internvl_tiles_reference(448, 448)[:2] == (1, 1)
    assert tuple(int(x[0]) for x in internvl_tile_grid([896], [896]))[:2] == (2, 2)
    assert tuple(int(x[0]) for x in internvl_tile_grid([448], [448]))[:2] == (1, 1)
    # 3:2 is equally far from 1:1 and 2:1 when only those exist: the later one wins on a large image
    small = internvl_tile_grid([3], [2], max_num=2)
    large = internvl_tile_grid([3 * 448], [2 * 448], max_num=2)
    assert (int(small.cols[0]), int(small.rows[0])) == (1, 1)
    assert (int(large.cols[0]), int(large.rows[0])) == (2, 1)
    assert int(large.num_tiles[0]) == 3


def test_internvl_candidates_and_thumbnail() -> None:
    ratios = internvl_target_ratios(1, 12)
    assert len(ratios) == 35 and ratios[0] == (1, 1)
    assert [a * b for a, b in ratios] == sorted(a * b for a, b in ratios)
    tiles = internvl_num_tiles([448, 4000], [448, 400], use_thumbnail=True)
    assert tiles[0] == 1 and tiles[1] > 2
    no_thumb = internvl_num_tiles([4000], [400], use_thumbnail=False)
    assert no_thumb[0] == tiles[1] - 1


@pytest.mark.parametrize("bad", [0, -5])
def test_invalid_sizes_raise(bad: int) -> None:
    with pytest.raises(ValueError, match="image 1"):
        internvl_num_tiles([10, bad, 30], [10, 20, 30])
    with pytest.raises(ValueError, match="image 2"):
        qwen2vl_grid([10, 20, 30], [10, 20, bad])
    with pytest.raises(ValueError, match="image 0"):
        qwen2vl_smart_resize([MAX_IMAGE_SIDE + 1], [10])


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="max_num"):
        internvl_num_tiles([10], [10], min_num=5, max_num=4)
    with pytest.raises(TypeError, match="widths"):
        internvl_num_tiles([10.5], [10])
    with pytest.raises(ValueError, match="differ"):
        internvl_num_tiles([10, 11], [10])
    with pytest.raises(ValueError, match="max_pixels"):
        qwen2vl_smart_resize([100], [100], min_pixels=10, max_pixels=5)
    with pytest.raises(ValueError, match="aspect ratio"):
        qwen2vl_smart_resize([201 * 30, 10], [30, 10])


@pytest.mark.parametrize(
    "min_pixels,max_pixels", [(56 * 56, 28 * 28 * 1280), (4 * 28 * 28, 16384 * 28 * 28), (256 * 28 * 28, 512 * 28 * 28)]
)
def test_smart_resize_matches_published(min_pixels: int, max_pixels: int) -> None:
    rng = np.random.default_rng(min_pixels + max_pixels)
    w, h = _random_sizes(rng, 4000, max_ratio=200)
    assert w.size > 3000
    rh, rw = qwen2vl_smart_resize(w, h, min_pixels=min_pixels, max_pixels=max_pixels)
    expected = np.array(
        [testing.smart_resize_reference(int(b), int(a), 28, min_pixels, max_pixels) for a, b in zip(w, h)]
    )
    np.testing.assert_array_equal(rh, expected[:, 0])
    np.testing.assert_array_equal(rw, expected[:, 1])
    # all three branches (round, scale down, scale up) occur
    rounded_area = (np.round(h / 28) * 28) * (np.round(w / 28) * 28)
    assert (rounded_area > max_pixels).any() and (rounded_area < min_pixels).any()


def test_qwen2vl_grid_patches_tokens_video() -> None:
    rng = np.random.default_rng(7)
    w, h = _random_sizes(rng, 2000, max_ratio=200)
    frames = rng.integers(1, 9, w.size)
    g = qwen2vl_grid(w, h, frames)
    expected = [testing.qwen2vl_counts_reference(int(b), int(a), int(f)) for a, b, f in zip(w, h, frames)]
    np.testing.assert_array_equal(g.grid_thw, np.array([e[0] for e in expected]))
    np.testing.assert_array_equal(g.num_patches, np.array([e[1] for e in expected]))
    np.testing.assert_array_equal(g.num_tokens, np.array([e[2] for e in expected]))
    assert (g.height % 28 == 0).all() and (g.width % 28 == 0).all()
    img = qwen2vl_grid(w, h)
    assert (img.grid_thw[:, 0] == 1).all()
    with pytest.raises(ValueError, match="num_frames"):
        qwen2vl_grid([100], [100], [0])


def test_torch_input_gives_torch_output() -> None:
    grid = internvl_tile_grid(torch.tensor([800, 448]), torch.tensor([600, 448]))
    assert isinstance(grid.num_tiles, torch.Tensor) and grid.num_tiles.dtype == torch.int64
    g = qwen2vl_grid(torch.tensor([800]), torch.tensor([600]))
    assert isinstance(g.grid_thw, torch.Tensor) and g.grid_thw.shape == (1, 3)


def test_triton_twins_match_numpy() -> None:
    from omnibal_kernels.ops.vision_counts import internvl_tile_grid as internvl_tile_grid_triton
    from omnibal_kernels.ops.vision_counts import smart_resize as smart_resize_triton

    rng = np.random.default_rng(3)
    w, h = _random_sizes(rng, 600)
    for min_num, max_num in ((1, 12), (1, 2)):
        ratios = internvl_target_ratios(min_num, max_num)
        cols, rows, tiles = internvl_tile_grid_triton(torch.from_numpy(w), torch.from_numpy(h), ratios, 448, True)
        ref = internvl_tile_grid(w, h, min_num=min_num, max_num=max_num)
        np.testing.assert_array_equal(cols.numpy(), ref.cols)
        np.testing.assert_array_equal(rows.numpy(), ref.rows)
        np.testing.assert_array_equal(tiles.numpy(), ref.num_tiles)
    keep = np.maximum(w, h) / np.minimum(w, h) <= 200
    rh, rw = smart_resize_triton(torch.from_numpy(w[keep]), torch.from_numpy(h[keep]), 28, 3136, 1003520)
    eh, ew = qwen2vl_smart_resize(w[keep], h[keep])
    np.testing.assert_array_equal(rh.numpy(), eh)
    np.testing.assert_array_equal(rw.numpy(), ew)
    with pytest.raises(ValueError, match="image 1"):
        smart_resize_triton(torch.tensor([10, 0]), torch.tensor([10, 10]), 28, 3136, 1003520)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize_triton(torch.tensor([10, 3000]), torch.tensor([10, 10]), 28, 3136, 1003520)


@pytest.mark.gpu
def test_cuda_counts_match_numpy() -> None:
    rng = np.random.default_rng(11)
    w, h = _random_sizes(rng, 20000)
    grid = internvl_tile_grid(torch.from_numpy(w).cuda(), torch.from_numpy(h).cuda())
    ref = internvl_tile_grid(w, h)
    np.testing.assert_array_equal(grid.num_tiles.cpu().numpy(), ref.num_tiles)
    np.testing.assert_array_equal(grid.cols.cpu().numpy(), ref.cols)
    keep = np.maximum(w, h) / np.minimum(w, h) <= 200
    g = qwen2vl_grid(torch.from_numpy(w[keep]).cuda(), torch.from_numpy(h[keep]).cuda())
    r = qwen2vl_grid(w[keep], h[keep])
    np.testing.assert_array_equal(g.grid_thw.cpu().numpy(), r.grid_thw)
