"""Label tokens and ViT sequences of length files from raw data: what transformers' processors give.

Label tokens: the samples of :mod:`test_raw_lengths` (images in assistant turns too), rendered by the tiny
folders' chat templates, which mark assistant turns with ``{% generation %}``; the reference is the processor's
own ``apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`` (``Qwen2VLProcessor``,
``InternVLProcessor``; for InternVL-Chat the tokenizer's, on the text its chat code expands), counted as the
causal loss counts labels after packing: ``sum(assistant_masks[1:])``. ViT sequences: the processor's pixels
packed by :func:`~omnibal_kernels.vision.pack_vision_fields`, whose ``vit_cu_seqlens`` are what the vision
towers attend (``tests/test_vision_seqlens.py``). Then the files, parts, merges and resumes that carry both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from test_raw_lengths import (  # noqa: E402
    SETTINGS,
    WORDS,
    _image,
    _pil_images,
    _record,
    _without_video_processor,
    conversations,
    folders,
    image_dir,
)
from transformers import AutoTokenizer  # noqa: E402
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize  # noqa: E402

from omnibal_kernels.cli import main  # noqa: E402
from omnibal_kernels.lengths import load_lengths  # noqa: E402
from omnibal_kernels.raw_lengths import CountOptions, RawLengths, lengths_from_raw, merge_length_parts  # noqa: E402
from omnibal_kernels.raw_lengths.tiny import tiny_model_folder  # noqa: E402
from omnibal_kernels.raw_lengths.tokens import span_tokens  # noqa: E402
from omnibal_kernels.vision import pack_vision_fields  # noqa: E402

__all__ = ["folders", "image_dir"]  # the fixtures, shared with test_raw_lengths


def _rows(result):
    off = result.vit_seqlens_offsets
    return [result.vit_seqlens[a:b].tolist() for a, b in zip(off[:-1], off[1:])]


def _messages_with_paths(turns, image_dir):
    """The conversation as chat messages whose image parts name their files (the processor loads them)."""
    out = []
    for role, parts in turns:
        if all(k == "text" for k, _ in parts):
            out.append({"role": role, "content": "".join(v for _, v in parts)})
            continue
        out.append(
            {
                "role": role,
                "content": [
                    {"type": "text", "text": v}
                    if k == "text"
                    else {"type": "image", "image": str(image_dir / _image(image_dir, *v))}
                    for k, v in parts
                    if k != "text" or v
                ],
            }
        )
    return out


def _processor(model, folder):
    tok = AutoTokenizer.from_pretrained(folder)
    if model == "internvl":
        seq = json.loads((folder / "processor_config.json").read_text())["image_seq_length"]
        return _without_video_processor(transformers.InternVLProcessor)(
            image_processor=GotOcr2ImageProcessorPil.from_pretrained(folder),
            tokenizer=tok,
            video_processor=None,
            image_seq_length=seq,
            chat_template=tok.chat_template,
        )
    return _without_video_processor(transformers.Qwen2VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
    )


@SETTINGS
@given(samples=st.lists(conversations(assistant_images=True), min_size=1, max_size=4))
@pytest.mark.parametrize("model", ["qwen2vl", pytest.param("internvl", marks=pytest.mark.slow)])
def test_labels_and_vit_sequences_equal_the_processor(model, samples, folders, image_dir):
    folder = folders[model]
    processor = _processor(model, folder)
    records = [_record(turns, layout, image_dir) for turns, layout in samples]
    got = lengths_from_raw(records, folder, CountOptions(model=model, image_root=image_dir), num_workers=0)
    assert got.settings["options"]["labels"] is True and got.label is not None
    for s, (turns, _) in enumerate(samples):
        out = processor.apply_chat_template(
            _messages_with_paths(turns, image_dir),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            return_tensors="pt",
        )
        mask = out["assistant_masks"][0].tolist()
        assert (int(got.llm[s]), int(got.label[s])) == (len(out["input_ids"][0]), sum(mask[1:]))
        packed = pack_vision_fields(
            [{k: out[k] for k in ("pixel_values", "image_grid_thw") if k in out}]
            if _pil_images(turns, image_dir)
            else [{"input_ids": out["input_ids"]}]
        )
        attended = np.diff(packed["vit_cu_seqlens"].numpy()).tolist() if packed else []
        assert _rows(got)[s] == attended


@pytest.mark.slow
@SETTINGS
@given(samples=st.lists(conversations(assistant_images=True), min_size=1, max_size=4))
def test_internvl_chat_labels_equal_the_mask_of_its_expanded_text(samples, folders, image_dir):
    # The remote-code chat code replaces <image> with <img> + <IMG_CONTEXT> * tokens * tiles + </img> in the
    # messages' text; the template renders that text, so its mask is the mask of the model's input.
    folder = folders["internvl-chat"]
    tok = AutoTokenizer.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    tiler = GotOcr2ImageProcessorPil(
        crop_to_patches=True, min_patches=1, max_patches=config["max_dynamic_patch"], size={"height": 448, "width": 448}
    )
    per_tile = int((448 // 14) ** 2 * config["downsample_ratio"] ** 2)
    records = [_record(turns, layout, image_dir) for turns, layout in samples]
    got = lengths_from_raw(records, folder, CountOptions(model="internvl", image_root=image_dir), num_workers=0)
    for s, (turns, _) in enumerate(samples):
        images = _pil_images(turns, image_dir)
        tiles = iter([int(n) for n in tiler(images)["num_patches"]] if images else [])
        messages = [
            {
                "role": r,
                "content": "".join(
                    v if k == "text" else f"<img>{'<IMG_CONTEXT>' * per_tile * next(tiles)}</img>" for k, v in parts
                ),
            }
            for r, parts in turns
        ]
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert (int(got.llm[s]), int(got.label[s])) == (len(out["input_ids"]), sum(out["assistant_masks"][1:]))


def test_video_labels_and_frame_groups(folders, tmp_path):
    # Qwen2-VL: a sample's images' sequences, then each video's frame groups, videos in their order although
    # their frame caps differ (cap_pixels_per_frame counts them in separate calls).
    folder = tiny_model_folder(tmp_path / "q", "qwen2vl")
    config = json.loads((folder / "video_preprocessor_config.json").read_text())
    config.update(cap_pixels_per_frame=True, max_video_tokens=40)
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(folder)
    videos = [(4, 320, 240), (16, 640, 360), (4, 300, 500)]  # two frame caps, the first and last sharing one
    parts = [
        {"type": "video", "video": {"path": f"{i}.mp4", "num_frames": f, "width": w, "height": h}}
        for i, (f, w, h) in enumerate(videos)
    ]
    rec = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": {"path": "i.png", "width": 500, "height": 400}},
                    {"type": "text", "text": "What happens?"},
                ],
            },
            {"role": "assistant", "content": parts + [{"type": "text", "text": "A cat."}]},
        ]
    }
    got = lengths_from_raw([rec], folder, CountOptions(model="qwen2vl"), num_workers=0)
    rh, rw = smart_resize(400, 500, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    expected, pads, caps = [(rh // 14) * (rw // 14)], [], []
    for f, w, h in videos:
        caps.append(max(min(28 * 28 * 16, int(40 * 28 * 28 * 0.9) * 2 // f), int(28 * 28 * 4 * 1.05)))
        vh, vw = smart_resize(h, w, factor=28, min_pixels=28 * 28 * 4, max_pixels=caps[-1])
        expected += [(vh // 14) * (vw // 14)] * (-(-f // 2))
        pads.append(-(-f // 2) * (vh // 14) * (vw // 14) // 4)
    assert caps[0] == caps[2] != caps[1] and _rows(got) == [expected]
    reply = "".join(f"<|vision_start|>{'<|video_pad|>' * p}<|vision_end|>" for p in pads) + "A cat."
    messages = [
        {
            "role": "user",
            "content": "<|vision_start|>" + "<|image_pad|>" * (expected[0] // 4) + "<|vision_end|>What happens?",
        },
        {"role": "assistant", "content": reply},
    ]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert (int(got.llm[0]), int(got.label[0])) == (len(out["input_ids"]), sum(out["assistant_masks"][1:]))
    # InternVL: every frame is one tile, one sequence; frames in the trained turn are trained tokens
    folder = folders["internvl"]
    tok = AutoTokenizer.from_pretrained(folder)
    rec = [
        {
            "video": {"path": "v.mp4", "num_frames": 3, "width": 640, "height": 480},
            "image": {"path": "x.png", "width": 900, "height": 300},
            "conversations": [
                {"from": "human", "value": "<image>What happens?"},
                {"from": "gpt", "value": "<video>A cat."},
            ],
        }
    ]
    got = lengths_from_raw(rec, folder, CountOptions(model="internvl"), num_workers=0)
    frames = "\n".join(f"Frame{i + 1}: <img>{'<IMG_CONTEXT>' * 64}</img>" for i in range(3))
    tiles = int(got.vit[0]) - 3
    messages = [
        {"role": "user", "content": f"<img>{'<IMG_CONTEXT>' * 64 * tiles}</img>\nWhat happens?"},
        {"role": "assistant", "content": frames + "\nA cat."},
    ]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert (int(got.llm[0]), int(got.label[0])) == (len(out["input_ids"]), sum(out["assistant_masks"][1:]))
    assert _rows(got) == [[1] * (tiles + 3)] and tiles > 1


# ------------------------------------------------------------------------------------------ the span count


def _encoder(tok, trim, ends):
    """The tokenizer, with offsets that leave out each token's leading space (GPT-2's ``trim_offsets``) and,
    with ``ends``, an end-of-text token added before and after the text (zero-width offsets)."""
    from tokenizers import Tokenizer, processors

    inner = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    steps = [processors.ByteLevel(trim_offsets=trim)]
    if ends:
        eos = tok.convert_tokens_to_ids("<|endoftext|>")
        steps.append(
            processors.TemplateProcessing(
                single="<|endoftext|> $A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)]
            )
        )
    inner.post_processor = processors.Sequence(steps)
    return inner


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS + ["<|im_end|>", "<|image_pad|>", "é", " "]), min_size=1, max_size=30),
    trim=st.booleans(),
    ends=st.booleans(),
    data=st.data(),
)
def test_span_tokens_count_what_overlaps_the_spans(words, trim, ends, data, folders):
    tok = AutoTokenizer.from_pretrained(folders["qwen2vl"])
    encoder = _encoder(tok, trim, ends)
    text = " ".join(words)
    # span ends anywhere, and often just after a character the byte-level tokenizer splits into several tokens
    split = [i + 1 for i, c in enumerate(text) if ord(c) > 127]
    cut = st.integers(0, len(text)) | (st.sampled_from(split) if split else st.nothing())
    bounds = sorted(data.draw(st.lists(cut, max_size=8)))
    spans = list(zip(bounds[::2], bounds[1::2]))
    enc = encoder.encode_batch([text], add_special_tokens=True)[0]
    assert not ends or enc.offsets[0] == enc.offsets[-1] == (0, 0)
    # the rule of return_assistant_tokens_mask: a token counts when it overlaps a span; the first never does
    expected = sum(1 for t, (a, b) in enumerate(enc.offsets) if t > 0 and any(a < e and b > s for s, e in spans))
    assert span_tokens(enc, spans) == expected


# ------------------------------------------------------------------------------------------ without marks


def test_labels_need_a_template_that_marks_training(tmp_path, image_dir, capsys):
    plain = tiny_model_folder(tmp_path / "plain", "qwen2vl", mark_training=False)
    marked = tiny_model_folder(tmp_path / "marked", "qwen2vl")
    records = [{"conversations": [{"from": "human", "value": "What is it?"}, {"from": "gpt", "value": "A cat."}]}]
    got = lengths_from_raw(records, plain, CountOptions(model="qwen2vl"), num_workers=0)
    assert got.label is None and got.settings["options"]["labels"] is False and _rows(got) == [[]]
    with pytest.raises(ValueError, match="marks no text for training"):
        lengths_from_raw(records, plain, CountOptions(model="qwen2vl", labels=True), num_workers=0)
    off = lengths_from_raw(records, marked, CountOptions(model="qwen2vl", labels=False), num_workers=0)
    on = lengths_from_raw(records, marked, CountOptions(model="qwen2vl"), num_workers=0)
    assert off.label is None and on.label.tolist() == [
        len(AutoTokenizer.from_pretrained(marked)("A cat.<|im_end|>")["input_ids"])
    ]
    with pytest.raises(TypeError, match="labels"):
        lengths_from_raw(records, marked, CountOptions(model="qwen2vl", labels="yes"), num_workers=0)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(records[0]) + "\n")
    assert (
        main(["lengths", str(data), "--tokenizer", str(plain), "--model", "qwen2vl", "-o", str(tmp_path / "o.json")])
        == 0
    )
    assert "no label tokens counted" in capsys.readouterr().err
    assert "label_num" not in json.loads((tmp_path / "o.json").read_text())[0]
    assert (
        main(
            [
                "lengths",
                str(data),
                "--tokenizer",
                str(plain),
                "--model",
                "qwen2vl",
                "--labels",
                "yes",
                "-o",
                str(tmp_path / "p.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "marks no text for training" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------ files


def _data(image_dir, n=23):
    out = []
    for i in range(n):
        imgs = [_image(image_dir, 40 + 37 * i, 500 - 11 * i) for _ in range(i % 3)]
        out.append(
            {
                "image": imgs,
                "conversations": [
                    {"from": "human", "value": "<image>" * len(imgs) + " ".join(WORDS[: 2 + i % 9])},
                    {"from": "gpt", "value": " ".join(WORDS[i % 5 :])},
                ],
            }
        )
    return out


def test_every_format_carries_sequences_and_labels(folders, image_dir, tmp_path, capsys):
    records = _data(image_dir)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    got = lengths_from_raw(
        records, folders["qwen2vl"], CountOptions(model="qwen2vl", image_root=image_dir), num_workers=0
    )
    assert got.label.sum() > 0 and got.vit_seqlens.size > 0
    for suffix in ("json", "jsonl", "npz"):
        path, _ = got.write(tmp_path / f"l.{suffix}")
        back = load_lengths(path)
        np.testing.assert_array_equal(back.vit_seqlens, got.vit_seqlens)
        np.testing.assert_array_equal(back.vit_seqlens_offsets, got.vit_seqlens_offsets)
        np.testing.assert_array_equal(back.llm, got.llm)
        if suffix == "npz":
            with np.load(path) as z:
                assert z["label"].tolist() == got.label.tolist()
        else:
            text = path.read_text()
            rows = json.loads(text) if suffix == "json" else [json.loads(line) for line in text.splitlines()]
            assert [list(r) for r in rows[:1]] == [["vit_num", "token_num", "vit_seqlens", "label_num"]]
            assert [r["label_num"] for r in rows] == got.label.tolist()
    # the command line writes the same, in each format
    for suffix in ("json", "jsonl", "npz"):
        out = tmp_path / f"cli.{suffix}"
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
                    str(image_dir),
                    "--workers",
                    "0",
                    "-o",
                    str(out),
                ]
            )
            == 0
        )
        assert out.read_bytes() == (tmp_path / f"l.{suffix}").read_bytes()
    assert f"label total {int(got.label.sum()):,}" in capsys.readouterr().out
    no = tmp_path / "no.json"
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
                str(image_dir),
                "--workers",
                "0",
                "--labels",
                "no",
                "-o",
                str(no),
            ]
        )
        == 0
    )
    assert list(json.loads(no.read_text())[0]) == ["vit_num", "token_num", "vit_seqlens"]


def test_parts_merges_and_resumes_keep_sequences_and_labels(folders, image_dir, tmp_path, capsys):
    records = _data(image_dir)
    kw = dict(num_workers=0, chunk_size=4)
    count = dict(image_root=image_dir)
    folder = folders["internvl"]
    whole = lengths_from_raw(records, folder, CountOptions(model="internvl", **count), **kw)
    parts = [
        lengths_from_raw(records, folder, CountOptions(model="internvl", **count), shard=(i, 4), **kw).save_part(
            tmp_path / f"p{i}.npz"
        )
        for i in (3, 1, 0, 2)
    ]
    merged = merge_length_parts(parts)
    for name in ("index", "vit", "llm", "vit_seqlens", "vit_seqlens_offsets", "label"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(whole, name))
    # a part of the format before ViT sequences and labels is refused, naming the file and the version
    with np.load(parts[0]) as z:
        old = {"index": z["index"], "vit": z["vit"], "llm": z["llm"]}
        meta = json.loads(str(z["meta"]))
    meta["version"] = 2
    with open(tmp_path / "old.npz", "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **old)
    with pytest.raises(ValueError, match=r"old\.npz is a part of format version 2, this version reads 3"):
        merge_length_parts([tmp_path / "old.npz", *parts[1:]])
    # parts counted without labels are another run
    unlabelled = lengths_from_raw(
        records, folder, CountOptions(model="internvl", **count, labels=False), shard=(1, 4), **kw
    ).save_part(tmp_path / "u1.npz")
    with pytest.raises(ValueError, match="options.labels"):
        merge_length_parts([parts[0], unlabelled, parts[2], parts[3]])
    # a resumed run reads the saved chunks back whole; a chunk whose sequences disagree is counted again
    work = tmp_path / "work"
    first = lengths_from_raw(records, folder, CountOptions(model="internvl", **count), work_dir=work, **kw)
    chunk = sorted(work.glob("chunk-*.npz"))[2]
    with np.load(chunk) as z:
        saved = {k: z[k] for k in z.files}
    saved["label"] = saved["label"] + 1  # a mark that a reused chunk shows
    saved["vit_seqlens"][:1] += 1
    with open(chunk, "wb") as f:
        np.savez(f, **saved)
    again = lengths_from_raw(records, folder, CountOptions(model="internvl", **count), work_dir=work, **kw)
    assert f"{chunk} is damaged" in capsys.readouterr().err
    for name in ("vit_seqlens", "vit_seqlens_offsets", "label"):
        np.testing.assert_array_equal(getattr(again, name), getattr(first, name))
    # a work folder of the chunk format before ViT sequences holds another run's chunks
    run = json.loads((work / "run.json").read_text())
    del run["chunk_format"]
    (work / "run.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match="another run"):
        lengths_from_raw(records, folder, CountOptions(model="internvl", **count), work_dir=work, **kw)
    restarted = lengths_from_raw(
        records, folder, CountOptions(model="internvl", **count), work_dir=work, stale_work_dir="restart", **kw
    )
    np.testing.assert_array_equal(restarted.label, first.label)


def test_inconsistent_arrays_name_the_sample_by_its_index():
    base = dict(
        index=np.array([3, 7]),
        vit=np.array([2, 4]),
        llm=np.array([10, 20]),
        start=0,
        stop=9,
        num_samples=9,
        issues=[],
        settings={},
        vit_seqlens=np.array([1, 1, 2, 2]),
        vit_seqlens_offsets=np.array([0, 2, 4]),
        label=np.array([9, 19]),
    )
    RawLengths(**base)
    for change, message in (
        (dict(vit_seqlens=np.array([1, 1, 2, 3])), "sample 7: its ViT sequences sum to 5"),
        (dict(vit_seqlens=np.array([1, 1, 5, -1])), "sample 7: a negative ViT sequence"),
        (dict(label=np.array([10, 0])), "sample 3: 10 label tokens, outside"),
        (dict(label=np.array([0, -1])), "sample 7: -1 label tokens"),
        (dict(vit_seqlens_offsets=np.array([0, 3, 2])), "non-decreasing"),
    ):
        with pytest.raises(ValueError, match=message):
            RawLengths(**{**base, **change})
