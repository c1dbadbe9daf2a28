"""Length files from raw data: loads equal what transformers' processors and tokenizers produce for the samples.

The references are transformers' own classes on decoded pixels: ``Qwen2VLProcessor`` with
``Qwen2VLImageProcessorPil`` and ``InternVLProcessor`` with ``GotOcr2ImageProcessorPil``, run on the PIL images
generated here, with the tiny tokenizers of :mod:`omnibal_kernels.raw_lengths.tiny` loaded through
``AutoTokenizer``. Both processor classes check their video processor's class on construction, and every video
processor class imports torchvision, which this CPU torch cannot load; the processors are therefore built
without a video processor (that one class check is skipped, nothing else changes), and videos are checked
against transformers' ``smart_resize`` and the video processors' published frame and token rules instead.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from PIL import Image  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize  # noqa: E402

from omnibal_kernels.cli import main  # noqa: E402
from omnibal_kernels.lengths import load_lengths  # noqa: E402
from omnibal_kernels.raw_lengths import CountOptions, SampleError, lengths_from_raw, load_model_spec, merge_length_parts  # noqa: E402
from omnibal_kernels.raw_lengths.media import MediaError, image_size, video_info  # noqa: E402
from omnibal_kernels.raw_lengths.tiny import tiny_model_folder  # noqa: E402

WORDS = [
    "What",
    "is",
    "shown",
    "in",
    "the",
    "picture",
    "?",
    "A",
    "cat",
    "sits",
    "on",
    "a",
    "mat",
    ".",
    "Describe",
    "chart",
    "2021",
    "über",
    "日本",
    "\n",
    "  ",
]
SETTINGS = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def _without_video_processor(cls):
    class NoVideoProcessor(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return NoVideoProcessor


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: tiny_model_folder(root / name, name) for name in ("qwen2vl", "internvl", "internvl-chat")}


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("images")


def _image(image_dir, w, h, fmt="png"):
    path = image_dir / f"{w}x{h}.{fmt}"
    if not path.exists():
        rng = np.random.default_rng(w * 10007 + h)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
    return path.name


# ------------------------------------------------------------------------------------------ generated samples


@st.composite
def conversations(draw, assistant_images=False):
    """A conversation as turns of parts (("text", s) / ("image", (w, h))) and the layout to write it in;
    ``assistant_images``: assistant turns may show images too."""
    turns = []
    n_turns = draw(st.integers(1, 3))
    if draw(st.booleans()):
        turns.append(("system", [("text", " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))))]))
    for t in range(n_turns):
        parts = []
        for _ in range(draw(st.integers(0, 2 if t == 0 else 1))):
            parts.append(("image", (draw(st.integers(10, 1000)), draw(st.integers(10, 1000)))))
        parts.append(("text", " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12)))))
        order = draw(st.permutations(range(len(parts))))
        turns.append(("user", [parts[i] for i in order]))
        reply = [("text", " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))))]
        if assistant_images and draw(st.booleans()):
            reply.insert(draw(st.integers(0, 1)), ("image", (draw(st.integers(10, 1000)), draw(st.integers(10, 1000)))))
        turns.append(("assistant", reply))
    return turns, draw(st.sampled_from(["llava", "parts", "string"]))


def _record(turns, layout, image_dir):
    """The conversation written in one of the raw layouts."""
    images = [_image(image_dir, *p[1]) for _, parts in turns for p in parts if p[0] == "image"]
    if layout == "parts":
        messages = []
        for role, parts in turns:
            content = [
                {"type": "text", "text": v} if k == "text" else {"type": "image", "image": _image(image_dir, *v)}
                for k, v in parts
            ]
            messages.append({"role": role, "content": content})
        return {"messages": messages}
    text = [(role, "".join(v if k == "text" else "<image>" for k, v in parts)) for role, parts in turns]
    if layout == "llava":
        names = {"user": "human", "assistant": "gpt", "system": "system"}
        return {"image": images, "conversations": [{"from": names[r], "value": v} for r, v in text]}
    return {"images": images, "messages": [{"role": r, "content": v} for r, v in text]}


def _hf_messages(turns):
    out = []
    for role, parts in turns:
        if all(k == "text" for k, _ in parts):
            out.append({"role": role, "content": "".join(v for _, v in parts)})
        else:
            out.append(
                {
                    "role": role,
                    "content": [
                        {"type": "text", "text": v} if k == "text" else {"type": "image"}
                        for k, v in parts
                        if k != "text" or v
                    ],
                }
            )
    return out


def _pil_images(turns, image_dir):
    return [Image.open(image_dir / _image(image_dir, *v)) for _, parts in turns for k, v in parts if k == "image"]


# ------------------------------------------------------------------------------------------ against processors


@SETTINGS
@given(samples=st.lists(conversations(), min_size=1, max_size=4))
def test_qwen2vl_loads_equal_the_processor(samples, folders, image_dir):
    folder = folders["qwen2vl"]
    tok = AutoTokenizer.from_pretrained(folder)
    processor = _without_video_processor(transformers.Qwen2VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
    )
    records = [_record(turns, layout, image_dir) for turns, layout in samples]
    for model in ("qwen2vl", "qwen2.5vl"):
        got = lengths_from_raw(records, folder, CountOptions(model=model, image_root=image_dir), num_workers=0)
        assert got.index.tolist() == list(range(len(samples))) and got.issues == []
        for s, (turns, _) in enumerate(samples):
            images = _pil_images(turns, image_dir)
            text = processor.apply_chat_template(_hf_messages(turns), tokenize=False)
            out = processor(text=[text], images=images or None)
            vit = int(np.prod(np.asarray(out["image_grid_thw"]), axis=1).sum()) if images else 0
            assert (int(got.vit[s]), int(got.llm[s])) == (vit, len(out["input_ids"][0]))


@SETTINGS
@given(samples=st.lists(conversations(), min_size=1, max_size=4))
def test_internvl_loads_equal_the_processor(samples, folders, image_dir):
    folder = folders["internvl"]
    tok = AutoTokenizer.from_pretrained(folder)
    seq = json.loads((folder / "processor_config.json").read_text())["image_seq_length"]
    processor = _without_video_processor(transformers.InternVLProcessor)(
        image_processor=GotOcr2ImageProcessorPil.from_pretrained(folder),
        tokenizer=tok,
        video_processor=None,
        image_seq_length=seq,
        chat_template=tok.chat_template,
    )
    records = [_record(turns, layout, image_dir) for turns, layout in samples]
    got = lengths_from_raw(records, folder, CountOptions(model="internvl", image_root=image_dir), num_workers=0)
    assert got.index.tolist() == list(range(len(samples))) and got.issues == []
    for s, (turns, _) in enumerate(samples):
        images = _pil_images(turns, image_dir)
        text = processor.apply_chat_template(_hf_messages(turns), tokenize=False)
        out = processor(text=[text], images=images or None)
        tiles = len(out["pixel_values"]) if images else 0
        assert (int(got.vit[s]), int(got.llm[s])) == (tiles, len(out["input_ids"][0]))


@SETTINGS
@given(samples=st.lists(conversations(), min_size=1, max_size=4))
def test_internvl_chat_loads_equal_its_expansion(samples, folders, image_dir):
    # Remote-code InternVL-Chat: the template renders text only and the model's chat code replaces each
    # <image> with <img> + <IMG_CONTEXT> * num_image_token * tiles + </img>; tiles from the real tiling processor.
    folder = folders["internvl-chat"]
    tok = AutoTokenizer.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    tiler = GotOcr2ImageProcessorPil(
        crop_to_patches=True, min_patches=1, max_patches=config["max_dynamic_patch"], size={"height": 448, "width": 448}
    )
    num_image_token = int((448 // 14) ** 2 * config["downsample_ratio"] ** 2)
    records = [_record(turns, layout, image_dir) for turns, layout in samples]
    got = lengths_from_raw(records, folder, CountOptions(model="internvl", image_root=image_dir), num_workers=0)
    for s, (turns, _) in enumerate(samples):
        images = _pil_images(turns, image_dir)
        tiles = [int(n) for n in tiler(images)["num_patches"]] if images else []
        messages = [
            {"role": r, "content": "".join(v if k == "text" else "<image>" for k, v in parts)} for r, parts in turns
        ]
        pieces = tok.apply_chat_template(messages, tokenize=False).split("<image>")
        text = pieces[0] + "".join(
            f"<img>{'<IMG_CONTEXT>' * num_image_token * n}</img>{p}" for n, p in zip(tiles, pieces[1:])
        )
        assert (int(got.vit[s]), int(got.llm[s])) == (sum(tiles), len(tok(text)["input_ids"]))


def test_settings_are_read_as_transformers_reads_them(folders, tmp_path):
    folder = tiny_model_folder(tmp_path / "q", "qwen2vl", min_pixels=1000, max_pixels=90000)
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config.update(max_pixels=50000, merge_size=2, patch_size=14)  # an explicit max_pixels wins over "size"
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    spec = load_model_spec(folder, "qwen2vl")
    ip = Qwen2VLImageProcessorPil.from_pretrained(folder)
    assert (spec.min_pixels, spec.max_pixels) == (ip.size["shortest_edge"], ip.size["longest_edge"]) == (1000, 50000)
    assert (spec.video_min_pixels, spec.video_max_pixels) == (28 * 28 * 4, 28 * 28 * 16)
    ivl = load_model_spec(folders["internvl"], "internvl", AutoTokenizer.from_pretrained(folders["internvl"]))
    got = GotOcr2ImageProcessorPil.from_pretrained(folders["internvl"])
    assert (ivl.max_num, ivl.min_num, ivl.image_size, ivl.num_image_token) == (
        got.max_patches,
        got.min_patches,
        got.size["height"],
        64,
    )
    chat = load_model_spec(folders["internvl-chat"], "internvl")
    assert (chat.max_num, chat.num_image_token, chat.image_marker) == (6, 64, "<image>")
    assert chat.with_overrides(max_num=2).max_num == 2
    with pytest.raises(ValueError, match="unknown model settings"):
        chat.with_overrides(max_tiles=2)
    with pytest.raises(ValueError, match="no preprocessor_config.json"):
        load_model_spec(folders["internvl-chat"], "qwen2vl")
    with pytest.raises(ValueError, match="model must be one of"):
        load_model_spec(folder, "llava")


def test_a_smaller_max_pixels_in_the_folder_changes_the_loads(folders, tmp_path, image_dir):
    small = tiny_model_folder(tmp_path / "small", "qwen2vl", max_pixels=28 * 28 * 8)
    rec = [{"image": _image(image_dir, 1000, 700), "conversations": [{"from": "human", "value": "<image>hi"}]}]
    big_run = lengths_from_raw(
        rec, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=image_dir), num_workers=0
    )
    small_run = lengths_from_raw(rec, small, CountOptions(model="qwen2vl", image_root=image_dir), num_workers=0)
    h, w = smart_resize(700, 1000, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 8)
    assert int(small_run.vit[0]) == (h // 14) * (w // 14) < int(big_run.vit[0])


# ------------------------------------------------------------------------------------------ headers, videos


def test_image_sizes_come_from_headers_only(folders, image_dir, monkeypatch):
    from PIL import ImageFile

    names = [_image(image_dir, 640, 480, "jpg"), _image(image_dir, 333, 222, "png")]

    def no_decode(self, *args, **kwargs):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    monkeypatch.setattr(Image.Image, "load", no_decode)
    assert [image_size(n, image_dir) for n in names] == [(640, 480), (333, 222)]
    data = (image_dir / names[0]).read_bytes()
    assert image_size({"bytes": data, "path": None}) == (640, 480)
    assert image_size({"path": names[1]}, image_dir) == (333, 222)
    rec = [{"image": names, "conversations": [{"from": "human", "value": "<image><image>x"}]}]
    assert (
        lengths_from_raw(
            rec, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=image_dir), num_workers=0
        ).vit[0]
        > 0
    )


def test_exif_rotation_is_applied_only_when_asked(tmp_path):
    path = tmp_path / "rot.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: transformers' load_image swaps the sides
    Image.new("RGB", (300, 100)).save(path, exif=exif)
    assert image_size(str(path)) == (300, 100)
    assert image_size(str(path), exif_transpose=True) == (100, 300)


def _write_video(path, frames, w, h, rate):
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((h, w, 3), 20 * i, dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _qwen_video_reference(tok, turns_text, frames, w, h, lo, hi, temporal=2):
    rh, rw = smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
    grid = math.ceil(frames / temporal) * (rh // 14) * (rw // 14)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": turns_text}]}]
    text = tok.apply_chat_template(messages, tokenize=False).replace("<|video_pad|>", "<|video_pad|>" * (grid // 4))
    return grid, len(tok(text)["input_ids"])


def test_qwen2vl_videos_from_pyav_metadata_and_frame_lists(folders, image_dir, tmp_path):
    folder = folders["qwen2vl"]
    tok = AutoTokenizer.from_pretrained(folder)
    _write_video(tmp_path / "clip.mp4", 7, 96, 64, 10)
    assert video_info("clip.mp4", tmp_path) == (7, 96, 64, 10.0)
    frames = [str(image_dir / _image(image_dir, 200, 150))] * 3
    records = [
        {"video": "clip.mp4", "conversations": [{"from": "human", "value": "<video>What is shown?"}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": "x.mp4", "num_frames": 16, "width": 640, "height": 360},
                        {"type": "text", "text": "What is shown?"},
                    ],
                }
            ]
        },
        {"videos": [frames], "messages": [{"role": "user", "content": "<video>What is shown?"}]},
    ]
    got = lengths_from_raw(records, folder, CountOptions(model="qwen2vl", image_root=tmp_path), num_workers=0)
    lo, hi = 28 * 28 * 4, 28 * 28 * 16
    expected = [
        _qwen_video_reference(tok, "What is shown?", f, w, h, lo, hi)
        for f, w, h in ((7, 96, 64), (16, 640, 360), (3, 200, 150))
    ]
    assert list(zip(got.vit.tolist(), got.llm.tolist())) == expected


def test_qwen2vl_video_frame_sampling_follows_the_video_processor(folders, tmp_path):
    folder = tiny_model_folder(tmp_path / "fps", "qwen2vl")
    config = json.loads((folder / "video_preprocessor_config.json").read_text())
    config.update(do_sample_frames=True, fps=2.0, min_frames=4, max_frames=768)
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(folder)
    rec = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": "v.mp4", "num_frames": 250, "fps": 25, "width": 320, "height": 240},
                        {"type": "text", "text": "hi"},
                    ],
                }
            ]
        }
    ]
    got = lengths_from_raw(rec, folder, CountOptions(model="qwen2vl"), num_workers=0)
    # 250 frames at 25 fps sampled at 2 fps: 20 frames (floor to a multiple of temporal_patch_size)
    assert (int(got.vit[0]), int(got.llm[0])) == _qwen_video_reference(
        tok, "hi", 20, 320, 240, 28 * 28 * 4, 28 * 28 * 16
    )
    no_fps = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "video", "video": "v.mp4", "num_frames": 250, "width": 320, "height": 240}],
                }
            ]
        }
    ]
    with pytest.raises(SampleError, match="frame rate is unknown"):
        lengths_from_raw(no_fps, folder, CountOptions(model="qwen2vl"), num_workers=0)


def test_internvl_video_frames_are_single_tiles_with_frame_labels(folders):
    folder = folders["internvl"]
    tok = AutoTokenizer.from_pretrained(folder)
    rec = [
        {
            "video": {"path": "v.mp4", "num_frames": 3, "width": 640, "height": 480},
            "conversations": [{"from": "human", "value": "<video>What happens?"}, {"from": "gpt", "value": "A cat."}],
        }
    ]
    got = lengths_from_raw(rec, folder, CountOptions(model="internvl"), num_workers=0)
    frames = "\n".join(f"Frame{i + 1}: <img>{'<IMG_CONTEXT>' * 64}</img>" for i in range(3))
    messages = [
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]},
        {"role": "assistant", "content": "A cat."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False).replace("<video>", frames)
    assert (int(got.vit[0]), int(got.llm[0])) == (3, len(tok(text)["input_ids"]))


def test_video_without_pyav_or_metadata_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_av(name, *args, **kwargs):
        if name == "av":
            raise ImportError("no av")
        return real_import(name, *args, **kwargs)

    (tmp_path / "v.mp4").write_bytes(b"\0" * 16)
    monkeypatch.setattr(builtins, "__import__", no_av)
    with pytest.raises(MediaError, match="needs PyAV"):
        video_info("v.mp4", tmp_path)


# ------------------------------------------------------------------------------------------ nothing silent


def _problem_records(image_dir):
    (image_dir / "broken.png").write_bytes(b"not an image at all")
    ok = _image(image_dir, 300, 200)
    long_text = " ".join(["Describe the chart in detail"] * 60)
    return [
        {"image": ok, "conversations": [{"from": "human", "value": "<image>\nWhat is shown?"}]},  # 0 fine
        {"image": "nowhere.png", "conversations": [{"from": "human", "value": "<image>x"}]},  # 1 missing
        {"image": "broken.png", "conversations": [{"from": "human", "value": "<image>x"}]},  # 2 unreadable
        {"image": [ok, ok], "conversations": [{"from": "human", "value": "<image> only one"}]},  # 3 placeholders
        {"conversations": [{"from": "human", "value": long_text}]},  # 4 too long
        {"text": "no conversation"},  # 5 bad record
        {"image": _image(image_dir, 2010, 10), "conversations": [{"from": "human", "value": "<image>"}]},  # 6 ratio
        {"conversations": [{"from": "human", "value": "Fine too."}]},  # 7 fine
        {
            "image": {"path": ok, "width": "wide", "height": 3},
            "conversations": [{"from": "human", "value": "<image>"}],
        },  # 8 bad field
    ]


def test_every_problem_is_counted_per_kind_and_listed_by_index(folders, image_dir):
    records = _problem_records(image_dir)
    kinds = {
        1: "missing_media",
        2: "unreadable_media",
        3: "placeholder_mismatch",
        4: "over_max_length",
        5: "bad_record",
        6: "bad_media_size",
        8: "bad_record",
    }
    skip = lengths_from_raw(
        records,
        folders["qwen2vl"],
        CountOptions(model="qwen2vl", image_root=image_dir, max_length=200, on_error="skip"),
        num_workers=0,
    )
    assert skip.index.tolist() == [0, 7] and skip.skipped.tolist() == [1, 2, 3, 4, 5, 6, 8]
    assert {d["index"]: d["kind"] for d in skip.issues} == kinds
    assert all(not d["kept"] for d in skip.issues)
    counts = skip.counts()
    assert counts["bad_record"] == 2 and counts["template_error"] == 0
    assert all(counts[k] == 1 for k in kinds.values() if k != "bad_record")
    report = lengths_from_raw(
        records,
        folders["qwen2vl"],
        CountOptions(model="qwen2vl", image_root=image_dir, max_length=200, on_error="report"),
        num_workers=0,
    )
    # loads stay defined for a placeholder mismatch and a sample over the maximum: kept and listed
    assert report.index.tolist() == [0, 3, 4, 7] and report.skipped.tolist() == [1, 2, 5, 6, 8]
    assert report.llm[2] > 200 and {d["index"] for d in report.issues if d["kept"]} == {3, 4}
    assert np.array_equal(report.vit[[0, 1]], skip.vit[[0, 0]] * np.array([1, 2]))  # samples 0 and 3
    nothing = lengths_from_raw(
        records[1:3],
        folders["qwen2vl"],
        CountOptions(model="qwen2vl", image_root=image_dir, on_error="skip"),
        num_workers=0,
    )
    assert nothing.index.size == 0 and nothing.skipped.tolist() == [0, 1]
    for bad, kind in kinds.items():
        with pytest.raises(SampleError, match=f"sample 1: {kind}"):
            lengths_from_raw(
                [records[0], records[bad]],
                folders["qwen2vl"],
                CountOptions(model="qwen2vl", image_root=image_dir, max_length=200),
                num_workers=0,
            )


def test_bad_arguments_name_themselves(folders, tmp_path):
    rec = [{"conversations": [{"from": "human", "value": "hi"}]}]
    with pytest.raises(ValueError, match="on_error"):
        lengths_from_raw(rec, folders["qwen2vl"], CountOptions(model="qwen2vl", on_error="ignore"))
    with pytest.raises(ValueError, match="chunk_size"):
        lengths_from_raw(rec, folders["qwen2vl"], CountOptions(model="qwen2vl"), chunk_size=0)
    with pytest.raises(ValueError, match="max_length"):
        lengths_from_raw(rec, folders["qwen2vl"], CountOptions(model="qwen2vl", max_length=-1))
    with pytest.raises(ValueError, match="tokenizer"):
        lengths_from_raw(rec, tmp_path / "nothing", CountOptions(model="qwen2vl"))
    with pytest.raises(ValueError, match="shard"):
        lengths_from_raw(rec, folders["qwen2vl"], CountOptions(model="qwen2vl"), shard=(2, 2))
    with pytest.raises(TypeError, match="data must be"):
        lengths_from_raw(42, folders["qwen2vl"], CountOptions(model="qwen2vl"))


# ------------------------------------------------------------------------------------------ scale: workers, shards


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" + ("\n" if i % 5 == 0 else "") for i, r in enumerate(records)))
    return path


def _many(image_dir, n):
    rng = np.random.default_rng(0)
    sizes = [(int(w), int(h)) for w, h in rng.integers(20, 900, (6, 2))]
    out = []
    for i in range(n):
        k = i % 3
        imgs = [_image(image_dir, *sizes[(i + j) % 6]) for j in range(k)]
        out.append(
            {
                "image": imgs,
                "conversations": [
                    {"from": "human", "value": "<image>" * k + " ".join(WORDS[: 3 + i % 11])},
                    {"from": "gpt", "value": " ".join(WORDS[i % 7 :])},
                ],
            }
        )
    if n > 13:
        out[13]["image"] = ["missing.png"]
        out[13]["conversations"][0]["value"] = "<image>"
    return out


def test_workers_shards_merge_and_resume(folders, image_dir, tmp_path):
    records = _many(image_dir, 41)
    data = _jsonl(tmp_path / "data.jsonl", records)
    kw = dict(chunk_size=4)
    count = dict(image_root=image_dir, on_error="skip")
    ref = lengths_from_raw(records, folders["internvl"], CountOptions(model="internvl", **count), num_workers=0, **kw)
    assert ref.skipped.tolist() == [13]
    pooled = lengths_from_raw(data, folders["internvl"], CountOptions(model="internvl", **count), num_workers=2, **kw)
    for name in ("index", "vit", "llm"):
        assert np.array_equal(getattr(pooled, name), getattr(ref, name))
    assert pooled.issues == ref.issues
    with pytest.raises(SampleError, match="sample 13: missing_media"):  # raised in a worker, named here
        lengths_from_raw(
            data, folders["internvl"], CountOptions(model="internvl", image_root=image_dir), chunk_size=4, num_workers=2
        )

    parts = []
    for i in (2, 0, 1):
        part = lengths_from_raw(
            data, folders["internvl"], CountOptions(model="internvl", **count), num_workers=0, shard=(i, 3), **kw
        )
        parts.append(part.save_part(tmp_path / f"part{i}.npz"))
    merged = merge_length_parts(parts)
    assert np.array_equal(merged.index, ref.index) and np.array_equal(merged.llm, ref.llm)
    assert merged.skipped.tolist() == [13] and merged.num_samples == 41
    with pytest.raises(ValueError, match="3 shards but 2 parts"):
        merge_length_parts(parts[:2])
    with pytest.raises(ValueError, match="expected"):
        merge_length_parts([parts[0], parts[1], parts[1]])

    work = tmp_path / "work"
    first = lengths_from_raw(
        data, folders["internvl"], CountOptions(model="internvl", **count), num_workers=0, work_dir=work, **kw
    )
    chunks = sorted(work.glob("chunk-*.npz"))
    assert len(chunks) == 11
    # A finished chunk is reused as saved (marked here), a lost one is counted again.
    with np.load(chunks[1]) as z:
        saved = {k: z[k] for k in z.files}
    saved["llm"] = saved["llm"] + 1000
    with open(chunks[1], "wb") as f:
        np.savez(f, **saved)
    chunks[2].unlink()
    resumed = lengths_from_raw(
        data, folders["internvl"], CountOptions(model="internvl", **count), num_workers=0, work_dir=work, **kw
    )
    marked = np.isin(resumed.index, saved["index"])
    assert np.array_equal(resumed.llm[marked], first.llm[marked] + 1000)
    assert np.array_equal(resumed.llm[~marked], first.llm[~marked]) and chunks[2].exists()
    with pytest.raises(ValueError, match="another run"):
        lengths_from_raw(
            data,
            folders["internvl"],
            CountOptions(model="internvl", **count, max_length=99),
            num_workers=0,
            work_dir=work,
            **kw,
        )


def test_a_hugging_face_dataset(folders, image_dir):
    datasets = pytest.importorskip("datasets")
    rows = []
    for i in range(5):
        imgs = [str(image_dir / _image(image_dir, 100 + 50 * i, 300))] * (i % 3)
        content = [{"type": "image", "text": None}] * len(imgs) + [{"type": "text", "text": f"question {i}"}]
        rows.append(
            {
                "images": imgs,
                "messages": [
                    {"role": "user", "content": content},
                    {"role": "assistant", "content": [{"type": "text", "text": "answer"}]},
                ],
            }
        )
    ds = datasets.Dataset.from_list(rows)
    ds = ds.cast_column("images", datasets.Sequence(datasets.Image(decode=False)))
    got = lengths_from_raw(ds, folders["qwen2vl"], CountOptions(model="qwen2vl"), num_workers=0)
    plain = [
        {
            "images": r["images"],
            "messages": [
                {
                    "role": m["role"],
                    "content": [{k: v for k, v in part.items() if v is not None} for part in m["content"]],
                }
                for m in r["messages"]
            ],
        }
        for r in rows
    ]
    ref = lengths_from_raw(plain, folders["qwen2vl"], CountOptions(model="qwen2vl"), num_workers=0)
    assert got.issues == [] and np.array_equal(got.vit, ref.vit) and np.array_equal(got.llm, ref.llm)
    assert got.vit.tolist().count(0) == 2


# ------------------------------------------------------------------------------------------ command line


def test_cli_raw_mode_shards_and_merge(folders, image_dir, tmp_path, capsys):
    records = _many(image_dir, 12)
    data = _jsonl(tmp_path / "data.jsonl", records)
    common = [
        str(data),
        "--tokenizer",
        str(folders["qwen2vl"]),
        "--model",
        "qwen2vl",
        "--image-root",
        str(image_dir),
        "--workers",
        "0",
        "--chunk-size",
        "5",
    ]
    out = tmp_path / "lengths.json"
    assert main(["lengths", *common, "-o", str(out)]) == 0
    assert "problem" not in capsys.readouterr().err
    records[5]["image"] = ["missing.png"]
    records[5]["conversations"][0]["value"] = "<image>"
    data = _jsonl(tmp_path / "data.jsonl", records)
    assert main(["lengths", *common, "-o", str(out)]) == 2
    assert "sample 5: missing_media" in capsys.readouterr().err
    assert main(["lengths", *common, "-o", str(out), "--on-error", "skip"]) == 0
    captured = capsys.readouterr()
    assert "missing_media 1" in captured.err and "wrote 11 of 12 samples" in captured.out
    lengths = load_lengths(str(out))
    report = json.loads((tmp_path / "lengths.report.json").read_text())
    assert len(lengths.vit) == 11 and report["skipped"] == [5] and not (tmp_path / "lengths.json.chunks").exists()
    api = lengths_from_raw(
        data, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=image_dir, on_error="skip"), num_workers=0
    )
    assert np.array_equal(lengths.vit, api.vit) and np.array_equal(lengths.llm, api.llm)

    for i in range(2):
        assert (
            main(["lengths", *common, "--on-error", "skip", "--shard", f"{i}/2", "-o", str(tmp_path / f"p{i}.npz")])
            == 0
        )
    merged = tmp_path / "merged.npz"
    assert main(["lengths", "--merge", str(tmp_path / "p1.npz"), str(tmp_path / "p0.npz"), "-o", str(merged)]) == 0
    again = load_lengths(str(merged))
    assert np.array_equal(again.vit, lengths.vit) and np.array_equal(again.llm, lengths.llm)
    # today's options become overrides only when given: --max-pixels smaller than the folder's
    assert (
        main(
            [
                "lengths",
                *common,
                "--on-error",
                "skip",
                "--max-pixels",
                str(28 * 28 * 4),
                "-o",
                str(tmp_path / "small.json"),
            ]
        )
        == 0
    )
    small = load_lengths(str(tmp_path / "small.json"))
    assert (small.vit <= lengths.vit).all() and (small.vit < lengths.vit).any()
    assert main(["lengths", *common, "--shard", "0/2", "-o", str(tmp_path / "p.json")]) == 2
    assert main(["lengths", "-o", str(out)]) == 2


def test_special_tokens_follow_the_processors_chat_template_call(folders, tmp_path):
    # A tokenizer that adds a BOS token: the processor's apply_chat_template(tokenize=True) lets it add one
    # unless the rendered chat already starts with it (a template that writes {{ bos_token }} itself).
    from tokenizers.processors import TemplateProcessing

    folder = tiny_model_folder(tmp_path / "bos", "qwen2vl")
    tok = AutoTokenizer.from_pretrained(folder)
    bos = "<|endoftext|>"
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]
    )
    tok.bos_token = bos
    rec = [{"conversations": [{"from": "human", "value": "What is shown?"}, {"from": "gpt", "value": "A cat."}]}]
    messages = [{"role": "user", "content": "What is shown?"}, {"role": "assistant", "content": "A cat."}]
    for template in (tok.chat_template, "{{ bos_token }}" + tok.chat_template):
        tok.chat_template = template
        tok.save_pretrained(folder)
        processor = _without_video_processor(transformers.Qwen2VLProcessor)(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
            tokenizer=tok,
            video_processor=None,
            chat_template=template,
        )
        expected = len(processor.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"][0])
        assert int(lengths_from_raw(rec, folder, CountOptions(model="qwen2vl"), num_workers=0).llm[0]) == expected
        forced = lengths_from_raw(
            rec, folder, CountOptions(model="qwen2vl", add_special_tokens=False), num_workers=0
        ).llm[0]
        assert int(forced) == len(tok.apply_chat_template(messages, tokenize=True, return_dict=False))


def test_a_bare_pad_token_between_words_counts_as_the_processor(tmp_path, image_dir):
    # Without <|vision_start|> around it, dropping the pad token would join the words on either side.
    folder = tiny_model_folder(tmp_path / "bare", "qwen2vl")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = tok.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>")
    tok.save_pretrained(folder)
    processor = _without_video_processor(transformers.Qwen2VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
    )
    name = _image(image_dir, 400, 300)
    rec = [{"images": [name], "messages": [{"role": "user", "content": "Descr<image>ibe it"}]}]
    got = lengths_from_raw(rec, folder, CountOptions(model="qwen2vl", image_root=image_dir), num_workers=0)
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Descr"}, {"type": "image"}, {"type": "text", "text": "ibe it"}],
        }
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert "Descr<|image_pad|>ibe" in text
    out = processor(text=[text], images=[Image.open(image_dir / name)])
    assert int(got.llm[0]) == len(out["input_ids"][0])
    assert int(got.vit[0]) == int(np.prod(np.asarray(out["image_grid_thw"])[0]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(st.sampled_from(["ok", "ok", "text", "missing", "mismatch", "bad"]), min_size=1, max_size=30),
    chunk_size=st.integers(1, 7),
    shards=st.integers(1, 4),
    on_error=st.sampled_from(["skip", "report"]),
)
def test_every_sample_is_kept_or_listed_once_whatever_the_chunks_and_shards(
    kinds, chunk_size, shards, on_error, folders, tmp_path
):
    def record(i, kind):
        image = {"path": f"{i}.png", "width": 50 + 37 * i, "height": 400 - 9 * i}
        if kind == "text":
            return {"conversations": [{"from": "human", "value": f"only text {i}"}]}
        if kind == "missing":
            return {"image": f"missing{i}.png", "conversations": [{"from": "human", "value": "<image>"}]}
        if kind == "mismatch":
            return {"image": [image], "conversations": [{"from": "human", "value": "no placeholder"}]}
        if kind == "bad":
            return {"conversations": "not a list"}
        return {"image": [image], "conversations": [{"from": "human", "value": f"<image> sample {i}"}]}

    records = [record(i, k) for i, k in enumerate(kinds)]
    kw = dict(num_workers=0)
    count = dict(image_root=tmp_path, on_error=on_error)
    whole = lengths_from_raw(records, folders["internvl"], CountOptions(model="internvl", **count), chunk_size=31, **kw)
    n = len(records)
    assert sorted(whole.index.tolist() + whole.skipped.tolist()) == list(range(n))
    assert [d["index"] for d in whole.issues] == sorted(d["index"] for d in whole.issues)
    listed = {d["index"] for d in whole.issues if not d["kept"]}
    assert listed == set(whole.skipped.tolist())
    parts = [
        lengths_from_raw(
            records,
            folders["internvl"],
            CountOptions(model="internvl", **count),
            chunk_size=chunk_size,
            shard=(i, shards),
            **kw,
        ).save_part(tmp_path / f"{shards}-{i}.npz")
        for i in range(shards)
    ]
    merged = merge_length_parts(parts)
    for name in ("index", "vit", "llm"):
        assert np.array_equal(getattr(merged, name), getattr(whole, name))
    assert merged.issues == whole.issues


@pytest.mark.parametrize(
    "config, total, fps, expected_rule",
    [
        ({"do_sample_frames": True, "num_frames": 8}, 100, None, 8),
        ({"do_sample_frames": True, "fps": 1.0}, 250, 25.0, 10),
        ({"do_sample_frames": True, "num_frames": 6, "initial_shift": 0}, 7, None, 6),
        ({"do_sample_frames": False, "num_frames": 8}, 100, None, 100),
    ],
)
def test_internvl_video_frames_follow_the_video_processors_sampling(
    folders, tmp_path, config, total, fps, expected_rule
):
    import torch

    folder = tiny_model_folder(tmp_path / "v", "internvl")
    (folder / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": "InternVLVideoProcessor", **config})
    )
    # InternVLVideoProcessor.sample_frames keeps torch.arange(initial_shift, total, total / n) frames
    if config["do_sample_frames"]:
        n = config.get("num_frames") or int(total / fps * config["fps"])
        shift = config.get("initial_shift", True)
        shift = total / n / 2 if shift is True else shift
        assert len(torch.arange(shift, total, total / n).int()) == expected_rule
    video = {"path": "v.mp4", "num_frames": total, "width": 320, "height": 240, **({"fps": fps} if fps else {})}
    rec = [{"video": video, "conversations": [{"from": "human", "value": "<video>hi"}]}]
    got = lengths_from_raw(rec, folder, CountOptions(model="internvl"), num_workers=0)
    assert int(got.vit[0]) == expected_rule
