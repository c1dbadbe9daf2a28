"""Length files from raw data: samples per second, ours next to a plain per-sample loop, same samples and loads.

Data (fixed seed): LLaVA-style JSON Lines records with 0-3 images each (JPEG files of log-uniform sides, 64 to
3000 pixels) and 1-3 chat turns; a tiny Qwen2-VL folder (:func:`omnibal_kernels.raw_lengths.tiny_model_folder`).

Providers (every one gives the same ``vit``/``llm`` per sample; checked):
  ours[workers=0]    lengths_from_raw in this process (chunks of 1024, batched tokenizer calls)
  ours[workers=2]    lengths_from_raw over 2 worker processes (pool start and tokenizer loads included)
  plain_loop         per sample: json.loads, PIL.Image.open(...).size per image (header only), transformers'
                     smart_resize, the chat template, the text with every image's pad tokens, the tokenizer
  plain_loop_decode  the same loop, but opening images as most scripts do, Image.open(...).convert("RGB")

    python benchmarks/bench_raw_lengths.py                            # one run, table and ratios
    python -m pytest benchmarks/bench_raw_lengths.py --benchmark-only # pytest-benchmark groups
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.raw_lengths import CountOptions, lengths_from_raw
from omnibal_kernels.raw_lengths.tiny import tiny_model_folder

NUM_SAMPLES = 4000
NUM_IMAGES = 400
SEED = 0
WORDS = (
    "What is shown in the picture ? Describe the image in detail please . A small cat sits on a red mat next "
    "to a wooden chair in the garden . The chart shows sales growing from 2019 to 2023"
).split()


def make_data(folder: Path, num_samples: int = NUM_SAMPLES, seed: int = SEED) -> Path:
    """Write the images, the records (``data.jsonl``) and the model folder (``model/``) under ``folder``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    sides = np.exp(rng.uniform(np.log(64), np.log(3000), (NUM_IMAGES, 2))).astype(int)
    for i, (w, h) in enumerate(sides):
        Image.new("RGB", (int(w), int(h)), tuple(int(c) for c in rng.integers(0, 255, 3))).save(
            images / f"{i}.jpg", quality=80
        )
    with open(folder / "data.jsonl", "w") as f:
        for _ in range(num_samples):
            k = int(rng.integers(0, 4))
            turns = []
            for t in range(int(rng.integers(1, 4))):
                q = " ".join(rng.choice(WORDS, int(rng.integers(5, 60))))
                a = " ".join(rng.choice(WORDS, int(rng.integers(5, 200))))
                turns += [
                    {"from": "human", "value": ("<image>\n" * k if t == 0 else "") + q},
                    {"from": "gpt", "value": a},
                ]
            imgs = [f"{int(j)}.jpg" for j in rng.integers(0, NUM_IMAGES, k)]
            f.write(json.dumps({"image": imgs, "conversations": turns}) + "\n")
    tiny_model_folder(folder / "model", "qwen2vl", max_pixels=28 * 28 * 1280)
    return folder


def plain_loop(folder: Path, decode: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """What a user script would do, one sample at a time."""
    from PIL import Image
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    model = folder / "model"
    tok = AutoTokenizer.from_pretrained(model)
    cfg = json.loads((model / "preprocessor_config.json").read_text())
    lo, hi = cfg["size"]["shortest_edge"], cfg["size"]["longest_edge"]
    roles = {"human": "user", "gpt": "assistant"}
    vit, llm = [], []
    with open(folder / "data.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            patches = []
            for name in rec["image"]:
                with Image.open(folder / "images" / name) as im:
                    w, h = im.convert("RGB").size if decode else im.size
                rh, rw = smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
                patches.append((rh // 14) * (rw // 14))
            messages = [
                {
                    "role": roles[t["from"]],
                    "content": t["value"].replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>"),
                }
                for t in rec["conversations"]
            ]
            text = tok.apply_chat_template(messages, tokenize=False)
            pieces = text.split("<|image_pad|>")
            text = pieces[0] + "".join("<|image_pad|>" * (p // 4) + s for p, s in zip(patches, pieces[1:]))
            vit.append(sum(patches))
            llm.append(len(tok(text)["input_ids"]))
    return np.array(vit), np.array(llm)


def ours(folder: Path, workers: int) -> tuple[np.ndarray, np.ndarray]:
    r = lengths_from_raw(
        folder / "data.jsonl",
        folder / "model",
        CountOptions(model="qwen2vl", image_root=folder / "images"),
        num_workers=workers,
        progress=False,
    )
    return r.vit, r.llm


def providers(folder: Path) -> dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]]:
    return {
        "ours[workers=0]": lambda: ours(folder, 0),
        "ours[workers=2]": lambda: ours(folder, 2),
        "plain_loop": lambda: plain_loop(folder),
        "plain_loop_decode": lambda: plain_loop(folder, decode=True),
    }


def main() -> None:
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_data(Path(tmp))
        results: dict[str, float] = {}
        expected = None
        for name, fn in providers(folder).items():
            fn()  # warm: file cache, imports
            t0 = time.perf_counter()
            vit, llm = fn()
            results[name] = time.perf_counter() - t0
            if expected is None:
                expected = (vit, llm)
            elif not (np.array_equal(vit, expected[0]) and np.array_equal(llm, expected[1])):
                raise AssertionError(f"{name} disagrees with ours on the loads")
    print(
        f"{NUM_SAMPLES} samples, {NUM_IMAGES} JPEG files, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"transformers {transformers.__version__}"
    )
    base = results["plain_loop"]
    print(f"{'provider':<20} {'seconds':>8} {'samples/s':>10} {'vs plain_loop':>14}")
    for name, sec in results.items():
        print(f"{name:<20} {sec:8.3f} {NUM_SAMPLES / sec:10.0f} {base / sec:13.2f}x")


# ------------------------------------------------------------------------------------------ pytest-benchmark

try:
    import pytest
except ImportError:  # pragma: no cover - the script runs without pytest
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="module")
    def raw_data(tmp_path_factory: Any) -> Path:
        return make_data(tmp_path_factory.mktemp("raw"), num_samples=1000)

    @pytest.mark.parametrize("provider", ["ours[workers=0]", "ours[workers=2]", "plain_loop", "plain_loop_decode"])
    def test_raw_lengths(benchmark: Any, raw_data: Path, provider: str) -> None:
        benchmark.group = "raw lengths (1000 samples)"
        benchmark.extra_info.update(samples=1000, cpus=os.cpu_count())
        benchmark.pedantic(providers(raw_data)[provider], rounds=2, warmup_rounds=1)


if __name__ == "__main__":
    main()
