"""compute_loads / write_lengths / the ``lengths`` subcommand."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from omnibal_kernels import testing
from omnibal_kernels.cli import add_lengths_parser, main
from omnibal_kernels.lengths import load_lengths, write_lengths
from omnibal_kernels.vision import compute_loads


def _dataset(rng: np.random.Generator, n: int) -> tuple[list, np.ndarray]:
    sizes: list = []
    for i in range(n):
        k = int(rng.integers(0, 4))
        if k == 0:
            sizes.append(None if i % 2 else [])
        elif k == 1 and i % 3 == 0:
            sizes.append((int(rng.integers(28, 3000)), int(rng.integers(28, 3000))))
        else:
            sizes.append([(int(rng.integers(28, 3000)), int(rng.integers(28, 3000))) for _ in range(k)])
    return sizes, rng.integers(0, 2000, n)


def _pairs(entry):
    if entry is None or len(entry) == 0:
        return []
    if isinstance(entry, tuple):
        return [entry]
    return entry


def test_internvl_loads_match_per_sample_reference() -> None:
    rng = np.random.default_rng(0)
    sizes, text = _dataset(rng, 400)
    loads = compute_loads(sizes, text, model="internvl", max_num=6, progress=False)
    for i, entry in enumerate(sizes):
        tiles = sum(testing.internvl_tiles_reference(w, h, 1, 6, 448, True)[2] for w, h in _pairs(entry))
        assert loads.vit[i] == tiles
        assert loads.llm[i] == text[i] + 256 * tiles
    assert loads.vit.dtype == np.int64 and loads.vit.shape == (400,)


def test_qwen2vl_loads_match_per_sample_reference() -> None:
    rng = np.random.default_rng(1)
    sizes, text = _dataset(rng, 300)
    loads = compute_loads(sizes, text, model="qwen2vl", progress=False)
    for i, entry in enumerate(sizes):
        counts = [testing.qwen2vl_counts_reference(h, w) for w, h in _pairs(entry)]
        assert loads.vit[i] == sum(c[1] for c in counts)
        assert loads.llm[i] == text[i] + sum(c[2] for c in counts)


def test_flat_layout_with_videos_equals_nested() -> None:
    rng = np.random.default_rng(2)
    sizes, text = _dataset(rng, 200)
    flat = [(w, h) for entry in sizes for (w, h) in _pairs(entry)]
    owner = [i for i, entry in enumerate(sizes) for _ in _pairs(entry)]
    perm = rng.permutation(len(flat))  # image rows in any order
    a = compute_loads(sizes, text, model="qwen2vl", progress=False)
    b = compute_loads(
        np.array(flat)[perm], text, model="qwen2vl", image_to_sample=np.array(owner)[perm], progress=False
    )
    np.testing.assert_array_equal(a.vit, b.vit)
    np.testing.assert_array_equal(a.llm, b.llm)
    frames = rng.integers(1, 7, len(flat))
    v = compute_loads(np.array(flat), text, model="qwen2vl", image_to_sample=owner, num_frames=frames, progress=False)
    expected = np.zeros(len(sizes), dtype=np.int64)
    for (w, h), o, f in zip(flat, owner, frames):
        expected[o] += testing.qwen2vl_counts_reference(h, w, int(f))[1]
    np.testing.assert_array_equal(v.vit, expected)


def test_bad_inputs_name_the_sample() -> None:
    with pytest.raises(ValueError, match="sample 2"):
        compute_loads([None, [(10, 10)], [(10, 0)]], [1, 2, 3], progress=False)
    with pytest.raises(ValueError, match="sample 1"):
        compute_loads([None, [(10, 10), (5000, 10)]], [1, 2], model="qwen2vl", progress=False)
    with pytest.raises(ValueError, match="sample 1"):
        compute_loads([None, None], [1, -2], progress=False)
    with pytest.raises(ValueError, match="3 samples"):
        compute_loads([None, None, None], [1, 2], progress=False)
    with pytest.raises(ValueError, match="model"):
        compute_loads([None], [1], model="llava", progress=False)
    with pytest.raises(ValueError, match="sample 0"):
        compute_loads([[(1, 2, 3)]], [1], progress=False)


def test_write_json_and_npz(tmp_path) -> None:
    rng = np.random.default_rng(3)
    sizes, text = _dataset(rng, 50)
    loads = compute_loads(sizes, text, progress=False)
    js = write_lengths(tmp_path / "l.json", loads)
    records = json.loads(js.read_text())
    assert records[0].keys() == {"vit_num", "token_num", "vit_seqlens"}
    assert [r["vit_num"] for r in records] == loads.vit.tolist()
    assert [r["token_num"] for r in records] == loads.llm.tolist()
    assert [r["vit_seqlens"] for r in records] == [[1] * v for v in loads.vit.tolist()]  # one per tile
    nz = write_lengths(tmp_path / "l.npz", loads)
    with np.load(nz) as f:
        np.testing.assert_array_equal(f["vit"], loads.vit)
        np.testing.assert_array_equal(f["llm"], loads.llm)
        assert f["vit"].dtype == np.int32
        np.testing.assert_array_equal(f["vit_seqlens"], loads.vit_seqlens)
        np.testing.assert_array_equal(f["vit_seqlens_offsets"], loads.vit_seqlens_offsets)
    back = load_lengths(js, nz)
    np.testing.assert_array_equal(back.vit_seqlens, np.concatenate([loads.vit_seqlens] * 2))
    with pytest.raises(ValueError, match="suffix"):
        write_lengths(tmp_path / "l.txt", loads)


def test_cli_lengths(tmp_path, capsys) -> None:
    records = [
        {"image_sizes": [[800, 600], [448, 448]], "text_tokens": 100},
        {"text_tokens": [1, 2, 3]},
        {"width": 4000, "height": 400, "text_tokens": 7},
    ]
    src = tmp_path / "data.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in records))
    out = tmp_path / "lengths.json"
    assert main(["lengths", str(src), "-o", str(out), "--max-num", "6", "--no-progress"]) == 0
    got = json.loads(out.read_text())
    t0 = testing.internvl_tiles_reference(800, 600, 1, 6)[2] + testing.internvl_tiles_reference(448, 448, 1, 6)[2]
    t2 = testing.internvl_tiles_reference(4000, 400, 1, 6)[2]
    assert got == [
        {"vit_num": t0, "token_num": 100 + 256 * t0, "vit_seqlens": [1] * t0},
        {"vit_num": 0, "token_num": 3, "vit_seqlens": []},
        {"vit_num": t2, "token_num": 7 + 256 * t2, "vit_seqlens": [1] * t2},
    ]
    assert "wrote 3 samples" in capsys.readouterr().out
    # the subcommand wires into another parser in one line
    parser = argparse.ArgumentParser()
    add_lengths_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["lengths", str(src), "-o", str(tmp_path / "q.npz"), "--model", "qwen2vl", "--no-progress"]
    )
    assert args.func(args) == 0
    patches = [testing.qwen2vl_counts_reference(h, w)[1] for w, h in [(800, 600), (448, 448)]]
    with np.load(tmp_path / "q.npz") as f:
        assert f["vit"][0] == sum(patches)
        assert f["vit_seqlens"][:2].tolist() == patches and f["vit_seqlens_offsets"][:3].tolist() == [0, 2, 2]
    # Qwen2.5-VL counts as Qwen2-VL
    assert main(["lengths", str(src), "-o", str(tmp_path / "q25.npz"), "--model", "qwen2.5vl", "--no-progress"]) == 0
    with np.load(tmp_path / "q.npz") as a, np.load(tmp_path / "q25.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    # one video per record with frames
    vids = tmp_path / "videos.json"
    vids.write_text(json.dumps([{"width": 640, "height": 360, "frames": 5, "text_tokens": 3}]))
    assert (
        main(
            [
                "lengths",
                str(vids),
                "-o",
                str(tmp_path / "v.npz"),
                "--model",
                "qwen2vl",
                "--frames-key",
                "frames",
                "--no-progress",
            ]
        )
        == 0
    )
    (t, h, w), patches, _ = testing.qwen2vl_counts_reference(360, 640, 5)
    with np.load(tmp_path / "v.npz") as f:
        assert f["vit"][0] == patches and f["vit_seqlens"].tolist() == [h * w] * t  # one per frame group
