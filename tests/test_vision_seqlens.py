"""compute_loads' ViT sequences: what the vision towers attend, for real samples packed.

Qwen2-VL / Qwen2.5-VL: transformers' own image processor makes each sample's patches and ``image_grid_thw``;
:func:`~omnibal_kernels.vision.pack_vision_fields` packs them, and the tiny vision towers of
:mod:`omnibal_kernels.calibration.models` (random weights) run on the packed patches while a hook records the
``cu_seqlens`` each attention block is given. The length file's sequences must be those, sample by sample.
InternVL: transformers' tiling processor makes the tiles; each is one sequence of one ViT unit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import testing
from omnibal_kernels.vision import compute_loads, pack_vision_fields

SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 40)  # small grids: the tiny towers run in milliseconds


def _rows(loads):
    return [
        loads.vit_seqlens[a:b].tolist() for a, b in zip(loads.vit_seqlens_offsets[:-1], loads.vit_seqlens_offsets[1:])
    ]


size_lists = st.lists(
    st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)), max_size=4), min_size=1, max_size=12
)


@settings(max_examples=40, deadline=None)
@given(sizes=size_lists, seed=st.integers(0, 2**16))
def test_seqlens_equal_the_per_image_rules(sizes, seed):
    rng = np.random.default_rng(seed)
    sizes = [[(w, h) for w, h in s if max(w, h) / min(w, h) <= 200] for s in sizes]
    text = rng.integers(0, 100, len(sizes))
    tiles = compute_loads(sizes, text, model="internvl", max_num=6, progress=False)
    assert _rows(tiles) == [
        [1] * sum(testing.internvl_tiles_reference(w, h, 1, 6, 448, True)[2] for w, h in s) for s in sizes
    ]
    for model in ("qwen2vl", "qwen2.5vl"):
        patches = compute_loads(sizes, text, model=model, progress=False)
        expected = []
        for s in sizes:
            grids = [testing.qwen2vl_counts_reference(h, w)[0] for w, h in s]
            expected.append([hh * ww for t, hh, ww in grids for _ in range(t)])
        assert _rows(patches) == expected
        np.testing.assert_array_equal(patches.vit, [sum(r) for r in expected])
    # the flat layout in any row order: a sample's sequences follow its rows' order, frames in groups
    flat = [(w, h) for s in sizes for w, h in s]
    owner = np.array([i for i, s in enumerate(sizes) for _ in s], dtype=np.int64)
    frames = rng.integers(1, 9, len(flat))
    perm = rng.permutation(len(flat))
    videos = compute_loads(
        np.array(flat, dtype=np.int64).reshape(-1, 2)[perm],
        text,
        model="qwen2vl",
        image_to_sample=owner[perm],
        num_frames=frames[perm],
        progress=False,
    )
    expected = [[] for _ in sizes]
    for j in perm:
        (t, hh, ww), _, _ = testing.qwen2vl_counts_reference(flat[j][1], flat[j][0], int(frames[j]))
        expected[owner[j]] += [hh * ww] * t
    assert _rows(videos) == expected


def _vision_cu_seqlens(tower, pixel_values, grid_thw, full_attention_blocks):
    """The ``cu_seqlens`` the tower's full-attention blocks are given for these patches."""
    import torch

    seen = []
    hooks = [
        tower.blocks[i].register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs["cu_seqlens"].clone()), with_kwargs=True
        )
        for i in full_attention_blocks
    ]
    try:
        with torch.no_grad():
            tower(pixel_values, grid_thw=grid_thw)
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == len(full_attention_blocks) and all(torch.equal(s, seen[0]) for s in seen)
    return seen[0]


@pytest.mark.parametrize("model", ["qwen2vl", "qwen2.5vl"])
def test_qwen_seqlens_are_what_the_vision_tower_attends(model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from omnibal_kernels.calibration.models import TINY_MODELS

    config = TINY_MODELS["tiny-qwen2-vl" if model == "qwen2vl" else "tiny-qwen2.5-vl"].config()
    visual = (
        transformers.Qwen2VLForConditionalGeneration
        if model == "qwen2vl"
        else transformers.Qwen2_5_VLForConditionalGeneration
    )(config).model.visual.eval()
    blocks = list(range(len(visual.blocks))) if model == "qwen2vl" else config.vision_config.fullatt_block_indexes
    processor = Qwen2VLImageProcessorPil(**SMALL)
    rng = np.random.default_rng(0)
    sizes = [[], [(64, 48)], [(300, 200), (30, 700), (1000, 1000)], [(57, 113)], []]
    samples = []
    for s in sizes:
        if not s:
            samples.append({"input_ids": torch.tensor([1, 2])})
            continue
        images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in s]
        out = processor(images, return_tensors="pt")
        samples.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]})
    loads = compute_loads(sizes, np.zeros(len(sizes), dtype=np.int64), model=model, progress=False, **SMALL)
    packed = pack_vision_fields(samples)
    attended = _vision_cu_seqlens(visual, packed["pixel_values"], packed["image_grid_thw"], blocks)
    assert torch.equal(attended.to(torch.int64), packed["vit_cu_seqlens"].to(torch.int64))
    np.testing.assert_array_equal(np.diff(attended.numpy()), loads.vit_seqlens)
    # videos: t frame groups per video, from frame counts alone
    flat = np.array([[640, 360], [100, 300]], dtype=np.int64)
    frames = np.array([7, 2], dtype=np.int64)
    videos = compute_loads(
        flat,
        np.zeros(2, dtype=np.int64),
        model=model,
        image_to_sample=[1, 0],
        num_frames=frames,
        progress=False,
        **SMALL,
    )
    grid = torch.tensor(
        [testing.qwen2vl_counts_reference(h, w, int(f), **SMALL)[0] for (w, h), f in zip(flat[::-1], frames[::-1])]
    )  # sample 0's video first, as packed
    patches = torch.zeros(int(grid.prod(dim=1).sum()), 3 * 2 * 14 * 14)
    attended = _vision_cu_seqlens(visual, patches, grid, blocks)
    np.testing.assert_array_equal(np.diff(attended.numpy()), videos.vit_seqlens)
    assert [int(x) for x in np.diff(videos.vit_seqlens_offsets)] == [int(grid[0, 0]), int(grid[1, 0])]


def test_internvl_seqlens_are_one_per_tile_of_the_processor():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    tiler = GotOcr2ImageProcessorPil(
        crop_to_patches=True, min_patches=1, max_patches=6, size={"height": 448, "width": 448}
    )
    sizes = [[(800, 600), (448, 448)], [], [(4000, 400)], [(30, 900)]]
    samples = []
    for s in sizes:
        if not s:
            samples.append({"input_ids": torch.tensor([1])})
            continue
        tiles = tiler([Image.new("RGB", wh) for wh in s], return_tensors="pt")["pixel_values"]
        samples.append({"pixel_values": tiles})
    packed = pack_vision_fields(samples)
    loads = compute_loads(sizes, np.zeros(len(sizes), dtype=np.int64), model="internvl", max_num=6, progress=False)
    np.testing.assert_array_equal(np.diff(packed["vit_cu_seqlens"].numpy()), loads.vit_seqlens)
    np.testing.assert_array_equal(packed["num_images"].numpy(), np.diff(loads.vit_seqlens_offsets))


def test_bad_frame_counts_name_the_sample():
    with pytest.raises(ValueError, match=r"sample 2: num_frames\[1\] = 0"):
        compute_loads(
            np.array([[64, 64], [64, 64]]),
            [1, 2, 3],
            model="qwen2vl",
            image_to_sample=[0, 2],
            num_frames=[3, 0],
            progress=False,
        )
    with pytest.raises(ValueError, match="sample 1: llm is too large"):
        compute_loads([None, [(448, 448)] * 9], [1, 2], model="internvl", num_image_token=2**28, progress=False)
