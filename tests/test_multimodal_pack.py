"""pack_batch on image/video-text samples: vision fields, Qwen2-VL mRoPE positions, unpack_batch round trips."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from omnibal_kernels import PackCollator, PackedBatch, pack_batch
from omnibal_kernels.packing import PackOptions, unpack_batch
from omnibal_kernels.testing import mrope_positions_reference, pack_batch_reference

IMG, VID, START, END = 151655, 151656, 151652, 151653
PATCH_DIM = 12  # small stand-in for Qwen2-VL's 3 * 2 * 14 * 14
VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def _qwen_sample(rng: np.random.Generator, videos: bool = True) -> dict[str, Any]:
    """Text with image/video placeholder runs (some adjacent) and the matching pixels and grids; may be
    text only."""
    ids: list[int] = []
    grids: dict[str, list] = {"image": [], "video": []}
    for _ in range(int(rng.integers(0, 4))):
        ids += rng.integers(0, 1000, int(rng.integers(0, 5))).tolist()
        kind = "video" if videos and rng.random() < 0.3 else "image"
        t = 1 if kind == "image" else int(rng.integers(1, 4))
        h, w = 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 6))
        if rng.random() < 0.7:
            ids.append(START)
        ids += [IMG if kind == "image" else VID] * (t * h * w // 4)
        if rng.random() < 0.7:
            ids.append(END)
        grids[kind].append((t, h, w))
    ids += rng.integers(0, 1000, int(rng.integers(1, 6))).tolist()
    sample: dict[str, Any] = {"input_ids": torch.tensor(ids), "labels": torch.tensor(ids) + 7}
    for kind, pixel_key, grid_key in (
        ("image", "pixel_values", "image_grid_thw"),
        ("video", "pixel_values_videos", "video_grid_thw"),
    ):
        if grids[kind]:
            g = torch.tensor(grids[kind])
            sample[grid_key] = g
            sample[pixel_key] = torch.randn(int((g[:, 0] * g[:, 1] * g[:, 2]).sum()), PATCH_DIM)
    if grids["video"]:
        sample["second_per_grid_ts"] = torch.tensor(
            rng.choice([0.5, 1.0, 2.0], len(grids["video"])), dtype=torch.float32
        )
    return sample


def _batch(seed: int, n: int | None = None, videos: bool = True) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [_qwen_sample(rng, videos) for _ in range(n or int(rng.integers(1, 7)))]


def _text_only(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k in ("input_ids", "labels")} for s in samples]


def _ref_positions(sample: dict[str, Any], tokens_per_second: float | None = None) -> torch.Tensor:
    """(3, 1, n) positions of one sample by the token-by-token reference."""
    images = sample.get("image_grid_thw", torch.zeros(0, 3)).tolist()
    videos = sample.get("video_grid_thw", torch.zeros(0, 3)).tolist()
    seconds = None
    if tokens_per_second is not None:
        seconds = sample.get("second_per_grid_ts", torch.ones(len(videos))).tolist()
    pos = mrope_positions_reference(
        sample["input_ids"].tolist(), images, videos, IMG, VID, 2, seconds, tokens_per_second
    )
    return torch.tensor(pos, dtype=torch.int64).T.reshape(3, 1, -1)


def _assert_equal(got: Any, want: Any, what: str) -> None:
    assert isinstance(got, torch.Tensor), what
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.equal(got, want), what


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("pad", [None, 16])
def test_unpack_gives_back_every_sample(seed: int, pad: int | None) -> None:
    samples = _batch(seed)
    opts = PackOptions(image_token_id=IMG, video_token_id=VID, mask_first_label=False, pad_to_multiple_of=pad)
    batch = pack_batch(samples, opts)
    back = unpack_batch(batch, num_samples=len(samples))
    assert len(back) == len(samples)
    for i, (sample, got) in enumerate(zip(samples, back)):
        for key, value in sample.items():
            _assert_equal(got[key], value, f"sample {i} {key}")
        assert set(got) - set(sample) == {"position_ids", "text_position_ids"}, i
        # packed positions are what the sample gets when packed alone, and the reference's
        alone = pack_batch([sample], opts.replace(pad_to_multiple_of=None))
        _assert_equal(got["position_ids"], alone["position_ids"], f"sample {i} positions")
        _assert_equal(got["position_ids"], _ref_positions(sample), f"sample {i} reference")
        _assert_equal(got["text_position_ids"], torch.arange(len(sample["input_ids"]))[None], f"sample {i}")
    # the text fields are those of plain text packing; text_position_ids is its 1-D position_ids
    text = pack_batch_reference(_text_only(samples), mask_first_label=False, pad_to_multiple_of=pad)
    for key, value in text.items():
        if key == "position_ids":
            _assert_equal(batch["text_position_ids"], value, key)
        elif isinstance(value, torch.Tensor):
            _assert_equal(batch[key], value, key)
        else:
            assert batch[key] == value, key
    total = batch["input_ids"].shape[1]
    assert batch["position_ids"].shape == (3, 1, total)
    # text tokens (padding included) have three equal rows
    is_text = ~torch.isin(batch["input_ids"][0], torch.tensor([IMG, VID]))
    for row in (1, 2):
        assert torch.equal(batch["position_ids"][0, 0, is_text], batch["position_ids"][row, 0, is_text])
    real = int(batch["seq_lens"][: len(samples)].sum())
    assert batch["position_ids"][:, 0, real:].tolist() == [list(range(total - real))] * 3


def test_vision_fields_of_a_mixed_batch() -> None:
    samples = _batch(3, n=6, videos=True)
    samples[2] = {"input_ids": torch.arange(9), "labels": torch.arange(9)}
    batch = pack_batch(samples, PackOptions(image_token_id=IMG, video_token_id=VID))
    has_img = [int(s["image_grid_thw"].shape[0]) if "image_grid_thw" in s else 0 for s in samples]
    assert batch["num_images"].dtype == torch.int32 and batch["num_images"].tolist() == has_img
    assert batch["image_to_sample"].dtype == torch.int32
    assert batch["image_to_sample"].tolist() == [i for i, k in enumerate(has_img) for _ in range(k)]
    grids = torch.cat([s["image_grid_thw"] for s in samples if "image_grid_thw" in s])
    _assert_equal(batch["image_grid_thw"], grids, "image_grid_thw")
    # one ViT segment per frame group of each image, as Qwen2-VL's vision tower cuts them
    seg = torch.repeat_interleave(grids[:, 1] * grids[:, 2], grids[:, 0])
    assert batch["vit_cu_seqlens"].dtype == torch.int32
    assert batch["vit_cu_seqlens"].tolist() == [0] + seg.cumsum(0).tolist()
    assert batch["vit_max_seqlen"] == int(seg.max())
    _assert_equal(
        batch["pixel_values"], torch.cat([s["pixel_values"] for s in samples if "pixel_values" in s]), "pixel_values"
    )
    if "num_videos" in batch:
        has_vid = [int(s["video_grid_thw"].shape[0]) if "video_grid_thw" in s else 0 for s in samples]
        assert batch["num_videos"].tolist() == has_vid
        assert batch["video_vit_cu_seqlens"].dtype == torch.int32
        assert batch["second_per_grid_ts"].shape == (sum(has_vid),)


def test_text_only_batch_with_mrope_keeps_the_shape() -> None:
    gen = torch.Generator().manual_seed(5)
    samples = [{"input_ids": torch.randint(0, 1000, (n,), generator=gen)} for n in (5, 1, 12)]
    batch = pack_batch(samples, PackOptions(image_token_id=IMG, pad_to_multiple_of=8))
    total = batch["input_ids"].shape[1]
    assert batch["position_ids"].shape == (3, 1, total)
    text = pack_batch_reference(samples, pad_to_multiple_of=8)["position_ids"]
    assert torch.equal(batch["position_ids"], text[None].expand(3, 1, total))
    _assert_equal(batch["text_position_ids"], text, "text_position_ids")
    assert "num_images" not in batch and "pixel_values" not in batch
    back = unpack_batch(batch, num_samples=3)
    assert [b["input_ids"].tolist() for b in back] == [s["input_ids"].tolist() for s in samples]


def test_text_row_layout() -> None:
    samples = _batch(7, n=4, videos=False)
    three = pack_batch(samples, PackOptions(image_token_id=IMG, pad_to_multiple_of=32))
    four = pack_batch(samples, PackOptions(image_token_id=IMG, pad_to_multiple_of=32, mrope_text_row=True))
    assert four["position_ids"].shape[0] == 4
    assert torch.equal(four["position_ids"][0], four["text_position_ids"])
    assert torch.equal(four["position_ids"][1:], three["position_ids"])


def test_qwen25_video_seconds() -> None:
    samples = [s for seed in range(40) for s in _batch(seed, n=1) if "video_grid_thw" in s][:3]
    assert len(samples) == 3
    del samples[1]["second_per_grid_ts"]  # counts as 1.0 per video
    batch = pack_batch(samples, PackOptions(image_token_id=IMG, video_token_id=VID, tokens_per_second=2))
    for sample, got in zip(samples, unpack_batch(batch)):
        _assert_equal(got["position_ids"], _ref_positions(sample, tokens_per_second=2), "positions")
    # Qwen2-VL (no tokens_per_second) numbers frames 0..t-1 whatever the seconds say
    plain = pack_batch(samples, PackOptions(image_token_id=IMG, video_token_id=VID))
    for sample, got in zip(samples, unpack_batch(plain)):
        _assert_equal(got["position_ids"], _ref_positions(sample), "positions")
    assert (
        batch["second_per_grid_ts"].tolist()[-len(samples[2]["second_per_grid_ts"]) :]
        == samples[2]["second_per_grid_ts"].tolist()
    )


def test_internvl_tiles() -> None:
    gen = torch.Generator().manual_seed(0)
    samples = []
    for n_tiles, n_text in ((3, 5), (0, 4), (7, 9), (1, 2)):
        sample: dict[str, Any] = {"input_ids": torch.randint(0, 100, (n_text + 4 * n_tiles,), generator=gen)}
        if n_tiles:
            sample["pixel_values"] = torch.randn(n_tiles, 3, 8, 8, generator=gen).bfloat16()
        samples.append(sample)
    batch = pack_batch(samples)
    assert batch["position_ids"].shape == batch["input_ids"].shape  # no mRoPE for InternVL
    assert batch["pixel_values"].shape == (11, 3, 8, 8) and batch["pixel_values"].dtype == torch.bfloat16
    assert batch["vit_cu_seqlens"].tolist() == list(range(12))
    assert batch["num_images"].tolist() == [3, 0, 7, 1]
    assert batch["image_to_sample"].tolist() == [0] * 3 + [2] * 7 + [3]
    _assert_same_text(batch, pack_batch_reference(samples))
    for sample, got in zip(samples, unpack_batch(batch)):
        _assert_equal(got["input_ids"], sample["input_ids"], "input_ids")
        if "pixel_values" in sample:
            _assert_equal(got["pixel_values"], sample["pixel_values"], "pixel_values")
        else:
            assert "pixel_values" not in got


def _assert_same_text(batch: Any, ref: dict[str, Any]) -> None:
    for key, value in ref.items():
        if isinstance(value, torch.Tensor):
            _assert_equal(batch[key], value, key)
        else:
            assert batch[key] == value, key


def _sample(ids: list[int], grids: list | None = None, **extra: Any) -> dict[str, Any]:
    sample: dict[str, Any] = {"input_ids": torch.tensor(ids)}
    if grids is not None:
        g = torch.tensor(grids)
        sample["image_grid_thw"] = g
        sample["pixel_values"] = torch.randn(int((g[:, 0] * g[:, 1] * g[:, 2]).sum()), PATCH_DIM)
    sample.update(extra)
    return sample


def test_errors_name_the_sample() -> None:
    good = _sample([1, IMG, IMG, 2], [[1, 2, 4]])
    # placeholder count does not match the grid
    with pytest.raises(ValueError, match="sample 1: image at token 1 needs 2 consecutive"):
        pack_batch([good, _sample([1, IMG, 2], [[1, 2, 4]])], PackOptions(image_token_id=IMG))
    with pytest.raises(ValueError, match="sample 2: 2 image_grid_thw rows but 1 image"):
        pack_batch([good, good, _sample([IMG, IMG, 5], [[1, 2, 4], [1, 2, 2]])], PackOptions(image_token_id=IMG))
    with pytest.raises(ValueError, match="sample 1: more image placeholders"):
        pack_batch([good, _sample([3, IMG, 4])], PackOptions(image_token_id=IMG))
    # pixels that the grid does not cover
    bad = _sample([1, IMG, IMG, 2], [[1, 2, 4]])
    bad["pixel_values"] = bad["pixel_values"][:-1]
    with pytest.raises(ValueError, match="sample 1: image_grid_thw covers 8 patches but pixel_values has 7"):
        pack_batch([good, bad], PackOptions(image_token_id=IMG))
    with pytest.raises(ValueError, match="sample 0: image_grid_thw h/w must be multiples of 2"):
        pack_batch([_sample([1, 2], [[1, 3, 4]])], PackOptions(image_token_id=IMG))
    with pytest.raises(ValueError, match="sample 1: image_grid_thw must be"):
        pack_batch([good, {"input_ids": torch.tensor([IMG]), "pixel_values": torch.randn(4, PATCH_DIM)}])
    with pytest.raises(ValueError, match="sample 1: pixel_values shape"):
        pack_batch([good, {"input_ids": torch.tensor([1]), "pixel_values": torch.randn(2, 3, 4, 4)}])
    with pytest.raises(ValueError, match="sample 0: image_grid_thw without pixel_values"):
        pack_batch([{"input_ids": torch.tensor([1]), "image_grid_thw": torch.tensor([[1, 2, 2]])}])
    # videos
    video = _sample([VID, 1], video_grid_thw=torch.tensor([[1, 2, 2]]), pixel_values_videos=torch.randn(4, PATCH_DIM))
    with pytest.raises(ValueError, match="sample 1: has video_grid_thw but video_token_id is not set"):
        pack_batch([good, video], PackOptions(image_token_id=IMG))
    video["second_per_grid_ts"] = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="sample 0: second_per_grid_ts has 2 entries for 1 videos"):
        pack_batch([video], PackOptions(image_token_id=IMG, video_token_id=VID, tokens_per_second=2))
    # a field pack_batch produces
    with pytest.raises(ValueError, match="sample 1 has a 'vit_cu_seqlens' field"):
        pack_batch([good, {**good, "vit_cu_seqlens": torch.zeros(2)}], PackOptions(image_token_id=IMG))
    # grids without image_token_id: packed, but the positions are only 1-D text positions
    with pytest.warns(UserWarning, match="image_token_id is not set"):
        batch = pack_batch([good])
    assert batch["position_ids"].shape == (1, 4)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="video_token_id needs image_token_id"):
        PackOptions(video_token_id=VID)
    with pytest.raises(TypeError, match="image_token_id"):
        PackOptions(image_token_id=1.5)
    with pytest.raises(ValueError, match="spatial_merge_size"):
        PackOptions(spatial_merge_size=0)
    with pytest.raises(ValueError, match="tokens_per_second"):
        PackOptions(tokens_per_second=-1)
    with pytest.raises(ValueError, match="num_samples is needed"):
        unpack_batch(pack_batch([{"input_ids": [1, 2]}]))
    with pytest.raises(ValueError, match="num_samples=2 but the batch has 1 segments"):
        unpack_batch(pack_batch([{"input_ids": [1, 2]}]), num_samples=2)


def test_pickle_and_to() -> None:
    samples = _batch(11, n=5)
    batch = pack_batch(samples, PackOptions(image_token_id=IMG, video_token_id=VID))
    data = pickle.dumps(batch)
    back = pickle.loads(data)
    assert isinstance(back, PackedBatch) and list(back) == list(batch)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            _assert_equal(back[key], value, key)
        else:
            assert back[key] == value, key
    pixel_bytes = batch["pixel_values"].nbytes + batch.get("pixel_values_videos", torch.zeros(0)).nbytes
    assert len(data) < pixel_bytes + 8 * 40 * batch["input_ids"].shape[1] + 8000
    moved = batch.to("meta", non_blocking=True)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert moved[key].device.type == "meta" and moved[key].shape == value.shape, key
        else:
            assert moved[key] == value, key
    assert moved["text_position_ids"].shape == batch["text_position_ids"].shape


class _Dataset(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.samples = [s for seed in range(3) for s in _batch(100 + seed, n=4)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.samples[index]


def test_dataloader_workers() -> None:
    data = _Dataset()
    collate = PackCollator(PackOptions(image_token_id=IMG, video_token_id=VID, pad_to_multiple_of=8), warmup=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator only warns
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, pin_memory=True, collate_fn=collate)
        batches = list(loader)
    assert len(batches) == 3
    for i, batch in enumerate(batches):
        assert isinstance(batch, PackedBatch)
        want = collate(data.samples[4 * i : 4 * i + 4])
        assert list(batch) == list(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                _assert_equal(batch[key], value, key)
            else:
                assert batch[key] == value, key


@pytest.mark.gpu
def test_to_cuda() -> None:
    batch = pack_batch(_batch(12, n=4), PackOptions(image_token_id=IMG, video_token_id=VID)).pin_memory()
    moved = batch.to("cuda", non_blocking=True)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert moved[key].is_cuda, key
            _assert_equal(moved[key].cpu(), value, key)
        else:
            assert moved[key] == value, key
