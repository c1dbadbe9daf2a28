"""Raw-data counting under bad media and odd files: every bad sample becomes one issue of its own kind for its
own index (``skip`` / ``report``) or an error naming it (``error``); memory stays bounded whatever a record
claims; JSON with a byte order mark, whitespace-only lines and in-memory PIL images are read as what they are.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from PIL import Image

from omnibal_kernels.cli import main
from omnibal_kernels.raw_lengths import CountOptions, SampleError, lengths_from_raw
from omnibal_kernels.raw_lengths.tiny import tiny_model_folder

TEXT = {
    "conversations": [
        {"from": "human", "value": "What is shown in the picture?"},
        {"from": "gpt", "value": "A small cat sits on a red mat."},
    ]
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: tiny_model_folder(root / name, name) for name in ("qwen2vl", "internvl")}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """Image and video files: a fine image, a PNG whose header claims 100000x100000, undecodable files."""
    root = tmp_path_factory.mktemp("media")
    Image.new("RGB", (300, 200), (10, 20, 30)).save(root / "ok.png")
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "PNG")
    png = bytearray(buf.getvalue())
    png[16:24] = struct.pack(">II", 100000, 100000)  # IHDR width and height, then its CRC
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    (root / "bomb.png").write_bytes(bytes(png))
    (root / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    (root / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF")
    (root / "garbage.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(256))
    return root


def _image(ref, text="<image>\nWhat is it?"):
    return {"image": ref, "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "A cat."}]}


def _video(ref):
    return {
        "video": ref,
        "conversations": [{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "A cat."}],
    }


def _frames(n, **extra):
    return {"path": "v.mp4", "num_frames": n, "width": 320, "height": 240, **extra}


def _records_with(bad: dict, at: int, n: int) -> list:
    records = [_image("ok.png") if i % 2 else _video(_frames(4 + i)) if i % 3 == 0 else dict(TEXT) for i in range(n)]
    records[at] = bad
    return records


# (record, expected kind); each is one bad sample among good ones
BAD = {
    "png header 100000x100000": (_image("bomb.png"), "over_max_image_pixels"),
    "given size over PIL's limit": (
        _image({"path": "x.png", "width": 20000, "height": 10000}),
        "over_max_image_pixels",
    ),
    "undecodable png": (_image("garbage.png"), "unreadable_media"),
    "truncated jpeg": (_image("cut.jpg"), "unreadable_media"),
    "undecodable video": (_video("garbage.mp4"), "unreadable_media"),
    "num_frames 10**9": (_video(_frames(10**9)), "over_max_frames"),
    "width Infinity": (_image({"path": "x.png", "width": float("inf"), "height": 100}), "bad_media_size"),
    "width NaN": (_image({"path": "x.png", "width": float("nan"), "height": 100}), "bad_media_size"),
    "video width Infinity": (_video(_frames(8, width=float("inf"))), "bad_media_size"),
    "video frames NaN": (_video(_frames(float("nan"))), "bad_media_size"),
    "video fps NaN": (_video(_frames(8, fps=float("nan"))), "bad_media_size"),
    "video fps Infinity": (_video(_frames(8, fps=float("inf"))), "bad_media_size"),
}


@pytest.mark.parametrize("model", ["qwen2vl", "internvl"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_one_bad_sample_is_one_issue_of_its_kind_for_its_index(case, model, folders, media):
    if "video" in case and "undecodable" in case:
        pytest.importorskip("av")
    bad, kind = BAD[case]
    # in the second chunk: the index must be the data's, not the chunk's
    records = _records_with(bad, 13, 20)
    kw = dict(num_workers=0, chunk_size=8)
    count = dict(image_root=media)
    ref = lengths_from_raw(records[:13] + records[14:], folders[model], CountOptions(model=model, **count), **kw)
    for on_error in ("skip", "report"):
        got = lengths_from_raw(records, folders[model], CountOptions(model=model, **count, on_error=on_error), **kw)
        assert [(d["index"], d["kind"], d["kept"]) for d in got.issues] == [(13, kind, False)]
        assert got.skipped.tolist() == [13]
        assert np.array_equal(got.vit, ref.vit) and np.array_equal(got.llm, ref.llm)
    with pytest.raises(SampleError, match=f"sample 13: {kind}"):
        lengths_from_raw(records, folders[model], CountOptions(model=model, **count), **kw)


def test_json_infinity_and_nan_from_a_file_through_the_command_line(folders, media, tmp_path, capsys):
    lines = [
        json.dumps(TEXT),
        '{"image": {"path": "x.png", "width": Infinity, "height": 10}, "conversations": '
        '[{"from": "human", "value": "<image>hi"}]}',
        json.dumps(TEXT),
        '{"video": {"path": "v.mp4", "num_frames": NaN, "width": 32, "height": 32}, "conversations": '
        '[{"from": "human", "value": "<video>hi"}]}',
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "lengths.json"
    common = [
        "lengths",
        str(data),
        "--tokenizer",
        str(folders["qwen2vl"]),
        "--model",
        "qwen2vl",
        "--workers",
        "0",
        "-o",
        str(out),
    ]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and "sample 1: bad_media_size" in err
    assert main([*common, "--on-error", "skip"]) == 0
    report = json.loads((tmp_path / "lengths.report.json").read_text())
    assert report["skipped"] == [1, 3] and report["counts"]["bad_media_size"] == 2


def test_the_pixel_bound_is_an_option_and_can_pass_pils_limit(folders, media, tmp_path, capsys, monkeypatch):
    records = [_image("ok.png"), _image("bomb.png"), dict(TEXT)]
    small = lengths_from_raw(
        records,
        folders["qwen2vl"],
        CountOptions(model="qwen2vl", image_root=media, on_error="skip", max_image_pixels=300 * 200 - 1),
        num_workers=0,
    )
    assert [(d["index"], d["kind"]) for d in small.issues] == [
        (0, "over_max_image_pixels"),
        (1, "over_max_image_pixels"),
    ]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the command line
    data = tmp_path / "data.json"
    data.write_text(json.dumps(records))
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "lengths",
                str(data),
                "--tokenizer",
                str(folders["qwen2vl"]),
                "--model",
                "qwen2vl",
                "--image-root",
                str(media),
                "--workers",
                "0",
                "--max-image-pixels",
                str(10**10),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["kept"] == 3 and report["settings"]["options"]["max_image_pixels"] == 10**10


def test_absurd_frame_counts_do_not_grow_memory(folders):
    # InternVL writes one "FrameN: <img></img>" line per frame the model sees: without a bound, 10**6 frames
    # are a 27 MB text built from a million strings (and 10**9 a MemoryError).
    records = [dict(TEXT), _video(_frames(10**6)), dict(TEXT)]
    tracemalloc.start()
    try:
        got = lengths_from_raw(
            records, folders["internvl"], CountOptions(model="internvl", on_error="skip"), num_workers=0
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(d["index"], d["kind"]) for d in got.issues] == [(1, "over_max_frames")]
    assert peak < 16 * 2**20, peak


@pytest.mark.slow
def test_a_load_out_of_range_names_its_own_sample_when_frames_are_unbounded(folders):
    # Without the frame bound, Qwen2-VL's ViT load of 10**9 frames passes 2**31: that one sample is reported.
    records = [dict(TEXT)] * 13 + [_video(_frames(10**9))] + [dict(TEXT)] * 6
    got = lengths_from_raw(
        records,
        folders["qwen2vl"],
        CountOptions(model="qwen2vl", on_error="skip", max_frames=None),
        num_workers=0,
        chunk_size=8,
    )
    assert [(d["index"], d["kind"]) for d in got.issues] == [(13, "bad_media_size")]
    assert "too large" in got.issues[0]["message"] and got.index.shape[0] == 19


# ------------------------------------------------------------------------------------------ formats


def test_a_json_list_with_a_byte_order_mark_is_a_list(folders, media, tmp_path):
    records = [_image("ok.png"), dict(TEXT), _image("ok.png")]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(records))
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps(records, indent=1).encode())
    lines = tmp_path / "marked.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\n" for r in records))
    ref = lengths_from_raw(plain, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=media), num_workers=0)
    for path in (marked, lines):
        got = lengths_from_raw(
            path, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=media, on_error="skip"), num_workers=0
        )
        assert got.issues == [] and got.index.tolist() == [0, 1, 2]
        assert np.array_equal(got.vit, ref.vit) and np.array_equal(got.llm, ref.llm)


def test_whitespace_only_lines_are_not_samples(folders, media, tmp_path):
    records = [dict(TEXT), _image("missing.png"), dict(TEXT), _image("ok.png")]
    blank = ["", "    ", "        \t   ", " \r", "\t\t\t\t\t\t", "                    "]
    text = ""
    for i, rec in enumerate(records):
        text += blank[i % len(blank)] + "\n" + blank[(i + 3) % len(blank)] + "\n" + json.dumps(rec) + "\n"
    text += "     \n \t \n"
    data = tmp_path / "data.jsonl"
    data.write_text(text)
    got = lengths_from_raw(
        data, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=media, on_error="skip"), num_workers=0
    )
    assert got.num_samples == 4
    assert [(d["index"], d["kind"]) for d in got.issues] == [(1, "missing_media")]
    ref = lengths_from_raw(
        records, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=media, on_error="skip"), num_workers=0
    )
    assert np.array_equal(got.index, ref.index) and np.array_equal(got.llm, ref.llm)


def test_records_holding_pil_images_resume(folders, tmp_path):
    def records():  # new image objects at new addresses on every call, the same images
        return [
            {
                "images": [Image.new("RGB", (320 + 10 * i, 240))],
                "messages": [
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"picture {i}"}]}
                ],
            }
            for i in range(6)
        ]

    work = tmp_path / "work"
    first = lengths_from_raw(
        records(), folders["qwen2vl"], CountOptions(model="qwen2vl"), num_workers=0, chunk_size=2, work_dir=work
    )
    saved = {p.name: p.stat().st_mtime_ns for p in work.glob("chunk-*.npz")}
    again = lengths_from_raw(
        records(), folders["qwen2vl"], CountOptions(model="qwen2vl"), num_workers=0, chunk_size=2, work_dir=work
    )
    assert np.array_equal(first.vit, again.vit) and len(saved) == 3
    assert {p.name: p.stat().st_mtime_ns for p in work.glob("chunk-*.npz")} == saved  # resumed, not recounted
    other = records()
    other[3]["images"] = [Image.new("RGB", (640, 480))]
    with pytest.raises(ValueError, match="another run"):
        lengths_from_raw(
            other, folders["qwen2vl"], CountOptions(model="qwen2vl"), num_workers=0, chunk_size=2, work_dir=work
        )
