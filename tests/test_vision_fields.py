"""pack_vision_fields round trips and Qwen2-VL mRoPE positions against a token-by-token reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnibal_kernels.testing import mrope_positions_reference
from omnibal_kernels.vision import mrope_position_ids, pack_vision_fields, unpack_vision_fields

IMG, VID, START, END = 151655, 151656, 151652, 151653


def _qwen_sample(rng: np.random.Generator, with_video: bool = False) -> tuple[list[int], list, list, list]:
    """Random text with image/video placeholder runs, some adjacent; returns ids and per-kind grids."""
    ids: list[int] = []
    images, videos, seconds = [], [], []
    for _ in range(int(rng.integers(0, 4))):
        ids += rng.integers(0, 1000, int(rng.integers(0, 6))).tolist()
        kind = "video" if with_video and rng.random() < 0.4 else "image"
        t = 1 if kind == "image" else int(rng.integers(1, 4))
        h, w = 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 9))
        tok = IMG if kind == "image" else VID
        if rng.random() < 0.7:
            ids.append(START)
        ids += [tok] * (t * h * w // 4)
        if rng.random() < 0.7:
            ids.append(END)
        (images if kind == "image" else videos).append((t, h, w))
        if kind == "video":
            seconds.append(float(rng.choice([0.5, 1.0, 2.0, 0.75])))
    ids += rng.integers(0, 1000, int(rng.integers(0, 6))).tolist()
    return ids, images, videos, seconds


@pytest.mark.parametrize("seed", range(6))
def test_mrope_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = [_qwen_sample(rng, with_video=True) for _ in range(int(rng.integers(1, 7)))]
    samples = [s for s in samples if s[0]] or [([1, 2, 3], [], [], [])]
    ids = [torch.tensor(s[0]) for s in samples]
    flat_img = [g for s in samples for g in s[1]]
    flat_vid = [g for s in samples for g in s[2]]
    flat_sec = [x for s in samples for x in s[3]]
    for qwen25 in (False, True):
        kwargs = dict(second_per_grid_ts=flat_sec, tokens_per_second=2) if qwen25 else {}
        out = mrope_position_ids(
            ids,
            torch.tensor(flat_img).reshape(-1, 3),
            torch.tensor(flat_vid).reshape(-1, 3),
            image_token_id=IMG,
            video_token_id=VID,
            **kwargs,
        )
        expected = []
        for s in samples:
            expected += mrope_positions_reference(
                s[0], s[1], s[2], IMG, VID, 2, s[3] if qwen25 else None, 2 if qwen25 else None
            )
        total = sum(len(s[0]) for s in samples)
        assert out.position_ids.shape == (3, 1, total) and out.position_ids.dtype == torch.int64
        assert out.position_ids[:, 0, :].T.tolist() == [list(p) for p in expected]
        # text rows equal; 1-D positions restart per sample
        text = ~torch.isin(torch.cat(ids), torch.tensor([IMG, VID]))
        assert (out.position_ids[0, 0, text] == out.position_ids[1, 0, text]).all()
        assert (out.position_ids[0, 0, text] == out.position_ids[2, 0, text]).all()
        assert out.text_position_ids.tolist() == [[k for s in samples for k in range(len(s[0]))]]
        starts = np.cumsum([0] + [len(s[0]) for s in samples])[:-1]
        assert (out.position_ids[:, 0, torch.from_numpy(starts)] == 0).all()
        for b, s in enumerate(samples):
            seg = out.position_ids[:, 0, starts[b] : starts[b] + len(s[0])]
            assert int(out.rope_deltas[b]) == int(seg.max()) + 1 - len(s[0])


def test_mrope_per_sample_grids_and_errors() -> None:
    ids = [[1, IMG, IMG, 2], [IMG] * 4 + [5]]
    a = mrope_position_ids(ids, [torch.tensor([[1, 2, 4]]), torch.tensor([[1, 4, 4]])], image_token_id=IMG)
    b = mrope_position_ids(ids, torch.tensor([[1, 2, 4], [1, 4, 4]]), image_token_id=IMG)
    assert torch.equal(a.position_ids, b.position_ids)
    assert a.position_ids[:, 0].T.tolist() == [
        [0, 0, 0],
        [1, 1, 1],
        [1, 1, 2],
        [3, 3, 3],
        [0, 0, 0],
        [0, 0, 1],
        [0, 1, 0],
        [0, 1, 1],
        [2, 2, 2],
    ]
    with pytest.raises(ValueError, match="sample 0"):
        mrope_position_ids([[IMG, IMG, IMG]], torch.tensor([[1, 2, 4]]), image_token_id=IMG)
    with pytest.raises(ValueError, match="rows"):
        mrope_position_ids([[IMG, IMG]], torch.tensor([[1, 2, 4], [1, 2, 4]]), image_token_id=IMG)
    with pytest.raises(ValueError, match="sample 1"):
        mrope_position_ids([[1], [IMG, 3, IMG]], torch.tensor([[1, 2, 4]]), image_token_id=IMG)
    with pytest.raises(ValueError, match="sample 0"):
        mrope_position_ids([[1, 2], [3]], [[[1, 2, 2]], None], image_token_id=IMG)


def _tile_sample(rng, n):
    return {"input_ids": [1, 2], "pixel_values": torch.randn(n, 3, 8, 8)} if n else {"input_ids": [3]}


def test_pack_tiles_round_trip() -> None:
    rng = np.random.default_rng(0)
    samples = [_tile_sample(rng, n) for n in (3, 0, 1, 7, 0)]
    f = pack_vision_fields(samples)
    assert f["pixel_values"].shape == (11, 3, 8, 8)
    assert f["num_images"].tolist() == [3, 0, 1, 7, 0] and f["num_images"].dtype == torch.int32
    assert f["image_to_sample"].tolist() == [0, 0, 0, 2, 3, 3, 3, 3, 3, 3, 3]
    assert f["image_to_sample"].dtype == torch.int32 and f["vit_cu_seqlens"].dtype == torch.int32
    assert f["vit_cu_seqlens"].tolist() == list(range(12))
    back = unpack_vision_fields(f)
    for s, u in zip(samples, back):
        if "pixel_values" in s:
            assert torch.equal(u["pixel_values"], s["pixel_values"])
        else:
            assert u == {}


def test_pack_patches_round_trip_with_grids() -> None:
    rng = np.random.default_rng(1)
    samples = []
    for k in (2, 0, 1, 3):
        if k == 0:
            samples.append({"input_ids": [1]})
            continue
        grids = torch.tensor(
            [[int(rng.integers(1, 3)), 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))] for _ in range(k)]
        )
        n = int((grids[:, 0] * grids[:, 1] * grids[:, 2]).sum())
        samples.append({"input_ids": [1], "pixel_values": torch.randn(n, 1176), "image_grid_thw": grids})
    f = pack_vision_fields(samples, spatial_merge_size=2)
    grids = torch.cat([s["image_grid_thw"] for s in samples if "image_grid_thw" in s])
    assert torch.equal(f["image_grid_thw"], grids)
    # Qwen2-VL's vision tower: one segment per frame group of h * w patches
    expected_cu = torch.cat(
        [torch.zeros(1, dtype=torch.int64), torch.repeat_interleave(grids[:, 1] * grids[:, 2], grids[:, 0]).cumsum(0)]
    )
    assert f["vit_cu_seqlens"].tolist() == expected_cu.tolist()
    assert f["vit_max_seqlen"] == int((grids[:, 1] * grids[:, 2]).max())
    assert f["num_images"].tolist() == [2, 0, 1, 3]
    assert f["image_to_sample"].tolist() == [0, 0, 2, 3, 3, 3]
    for s, u in zip(samples, unpack_vision_fields(f)):
        if "pixel_values" in s:
            assert torch.equal(u["pixel_values"], s["pixel_values"])
            assert torch.equal(u["image_grid_thw"], s["image_grid_thw"])
        else:
            assert u == {}


def test_pack_patches_without_grids_and_text_only() -> None:
    samples = [{"pixel_values": torch.randn(5, 4)}, {"input_ids": [1]}, {"pixel_values": torch.randn(2, 4)}]
    f = pack_vision_fields(samples)
    assert f["vit_cu_seqlens"].tolist() == [0, 5, 7] and "image_grid_thw" not in f
    back = unpack_vision_fields(f)
    assert torch.equal(back[0]["pixel_values"], samples[0]["pixel_values"]) and back[1] == {}
    assert pack_vision_fields([{"input_ids": [1]}, {"input_ids": [2]}]) == {}
    assert unpack_vision_fields({}, batch_size=2) == [{}, {}]


def test_pack_errors_name_the_sample() -> None:
    with pytest.raises(ValueError, match="sample 1"):
        pack_vision_fields([{"pixel_values": torch.randn(2, 3, 4, 4)}, {"pixel_values": torch.randn(3, 4)}])
    with pytest.raises(ValueError, match="sample 1"):
        pack_vision_fields([{"pixel_values": torch.randn(2, 4)}, {"pixel_values": torch.randn(3, 5)}])
    with pytest.raises(ValueError, match="sample 0"):
        pack_vision_fields([{"pixel_values": torch.randn(7, 4), "image_grid_thw": torch.tensor([[1, 2, 2]])}])
    with pytest.raises(ValueError, match="sample 1"):
        pack_vision_fields(
            [
                {"pixel_values": torch.randn(4, 4), "image_grid_thw": torch.tensor([[1, 2, 2]])},
                {"pixel_values": torch.randn(4, 4)},
            ]
        )
    with pytest.raises(ValueError, match="sample 0"):
        pack_vision_fields([{"image_grid_thw": torch.tensor([[1, 2, 2]])}])
    with pytest.raises(ValueError, match="dtype"):
        pack_vision_fields([{"pixel_values": torch.randn(2, 4)}, {"pixel_values": torch.randn(2, 4).double()}])
    with pytest.raises(TypeError, match="sample 0"):
        pack_vision_fields([{"pixel_values": np.zeros((2, 4))}])
    with pytest.raises(ValueError, match="empty"):
        pack_vision_fields([])
