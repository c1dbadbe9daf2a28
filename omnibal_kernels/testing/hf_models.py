"""Tiny random transformers models and samples for them: what the packing and loss tests train.

Configs (1 layer, hidden 32): Llama and Qwen2 (text), Qwen2-VL and Qwen2.5-VL (mRoPE, images and videos as
patches with grids), InternVL (images as ``(n, 3, 16, 16)`` tiles, 4 tokens per tile). Samples put text around
placeholder runs as each model's processor would; :func:`training_samples` also masks a prompt prefix, so a
sample's label tokens differ from its tokens. transformers is imported inside functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from .. import _tiny_models
from .._tiny_models import TinySizes
from ..lengths import Lengths
from ..packing.planned import sample_loads

__all__ = [
    "CONFIGS",
    "IMG",
    "IMG_CONTEXT",
    "MERGE",
    "PATCH_DIM",
    "SIZES",
    "TEMPORAL",
    "TILE_TOKENS",
    "VID",
    "V_END",
    "V_START",
    "alone",
    "config",
    "internvl_sample",
    "label_tokens",
    "lengths_of",
    "model_class",
    "mrope_text_config",
    "qwen_sample",
    "text_ids",
    "tiny_model",
    "training_samples",
]

VOCAB, IMG, VID, V_START, V_END, IMG_CONTEXT = 128, 120, 121, 122, 123, 124
PATCH, TEMPORAL, CHANNELS, MERGE = 2, 2, 3, 2
PATCH_DIM = CHANNELS * TEMPORAL * PATCH * PATCH
TILE = 16  # InternVL tile side; patch 4 -> 16 patches -> 4 tokens per tile after the 0.5 pixel shuffle
TILE_TOKENS = 4
SIZES = TinySizes(
    vocab=VOCAB,
    hidden=32,
    intermediate=64,
    layers=1,
    heads=2,
    kv_heads=1,
    patch=PATCH,
    window=8,  # 8 px = 2 merged tokens: grids wider than that run the window attention and its reordering
    tile=TILE,
    tile_patch=4,
    image_token=IMG,
    video_token=VID,
    vision_start_token=V_START,
    vision_end_token=V_END,
    internvl_image_token=IMG_CONTEXT,
)


def mrope_text_config() -> dict:
    """The text config of the Qwen-VL models (mRoPE sections)."""
    return _tiny_models.mrope_text_config(SIZES)


CONFIGS: dict[str, Callable[[], Any]] = {
    "llama": partial(_tiny_models.llama_config, SIZES),
    "qwen2": partial(_tiny_models.qwen2_config, SIZES),
    "qwen2_vl": partial(_tiny_models.qwen2_vl_config, SIZES),
    "qwen2_5_vl": partial(_tiny_models.qwen2_5_vl_config, SIZES),
    "internvl": partial(_tiny_models.internvl_config, SIZES),
}


def config(name: str) -> Any:
    """The tiny config of model ``name`` (a key of :data:`CONFIGS`)."""
    return CONFIGS[name]()


def model_class(config: Any) -> Any:
    """The transformers class that trains ``config``: image-text-to-text for VLMs, else causal LM."""
    import transformers
    from transformers.models.auto import modeling_auto

    name = (
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(config.model_type)
        or modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]
    )
    return getattr(transformers, name)


def tiny_model(name: str, attn: str = "sdpa", dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """Model ``name`` with random weights drawn after ``torch.manual_seed(seed)``, on the CPU."""
    torch.manual_seed(seed)
    cfg = config(name)
    return model_class(cfg)._from_config(cfg, attn_implementation=attn, dtype=dtype)


def text_ids(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` ordinary token ids (no special or placeholder token)."""
    return rng.integers(3, 100, n).tolist()


def qwen_sample(
    rng: np.random.Generator,
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[tuple[int, int, int]] = (),
    seconds: list[float] | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Text around each image/video: <vision_start> placeholders <vision_end>, patches random; no labels on
    the placeholders."""
    ids = text_ids(rng, int(rng.integers(1, 5)))
    for token, grids in ((IMG, images), (VID, videos)):
        for t, h, w in grids:
            ids += [V_START] + [token] * (t * h * w // MERGE**2) + [V_END] + text_ids(rng, int(rng.integers(1, 4)))
    tokens = torch.tensor(ids)
    labels = tokens.clone()
    labels[(tokens == IMG) | (tokens == VID)] = -100
    sample: dict[str, Any] = {"input_ids": tokens, "labels": labels}
    if images:
        sample["image_grid_thw"] = torch.tensor(images)
        sample["pixel_values"] = torch.randn(sum(t * h * w for t, h, w in images), PATCH_DIM, dtype=dtype)
    if videos:
        sample["video_grid_thw"] = torch.tensor(videos)
        sample["pixel_values_videos"] = torch.randn(sum(t * h * w for t, h, w in videos), PATCH_DIM, dtype=dtype)
        if seconds is not None:
            sample["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    return sample


def internvl_sample(rng: np.random.Generator, tiles: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Text, ``tiles`` tiles' placeholders between <img> and </img>, text; no labels on the placeholders."""
    ids = text_ids(rng, int(rng.integers(1, 5)))
    if tiles:
        ids += [V_START] + [IMG_CONTEXT] * (tiles * TILE_TOKENS) + [V_END]
    tokens = torch.tensor(ids + text_ids(rng, int(rng.integers(1, 5))))
    labels = tokens.clone()
    labels[tokens == IMG_CONTEXT] = -100
    sample = {"input_ids": tokens, "labels": labels}
    if tiles:
        sample["pixel_values"] = torch.randn(tiles, CHANNELS, TILE, TILE, dtype=dtype)
    return sample


def training_samples(name: str, num_samples: int, seed: int, dtype: torch.dtype = torch.float32) -> list[dict]:
    """``num_samples`` seeded samples for model ``name`` with a masked prompt (labels -100 on a random prefix,
    placeholders included), of varied lengths; every sample of a vision model has images (so every vision
    parameter gets a gradient in every micro-step)."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    out = []
    for _ in range(num_samples):
        if name in ("llama", "qwen2"):
            tokens = torch.tensor(text_ids(rng, int(rng.integers(2, 25))))
            sample = {"input_ids": tokens, "labels": tokens.clone()}
        elif name == "internvl":
            sample = internvl_sample(rng, int(rng.integers(1, 4)), dtype)
        else:
            grid = (1, 2 * int(rng.integers(1, 3)), 2 * int(rng.integers(1, 3)))
            sample = qwen_sample(rng, [grid], dtype=dtype)
        prompt = int(rng.integers(0, sample["input_ids"].numel()))
        sample["labels"][:prompt] = -100
        out.append(sample)
    return out


def label_tokens(sample: dict[str, Any], ignore_index: int = -100) -> int:
    """The sample's label tokens as a causal loss counts them: labels after the first not ``ignore_index``."""
    labels = sample.get("labels", sample["input_ids"])
    return int((torch.as_tensor(labels)[1:] != ignore_index).sum())


def lengths_of(samples: list[dict[str, Any]], label: bool = True) -> Lengths:
    """The loads of ``samples`` as a length file holds them (:mod:`omnibal_kernels.packing.planned` counts), with
    label counts when ``label``."""
    loads = [sample_loads(s) for s in samples]
    return Lengths(
        np.array([v for _, v in loads], np.int64),
        np.array([t for t, _ in loads], np.int64),
        label=np.array([label_tokens(s) for s in samples], np.int64) if label else None,
    )


def alone(sample: dict[str, Any]) -> dict[str, Any]:
    """One sample as transformers takes it unpacked: batch dimension 1, the model computes its positions."""
    inputs = {
        "input_ids": sample["input_ids"][None],
        "labels": sample.get("labels", sample["input_ids"])[None],
        "use_cache": False,
    }
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        if key in sample:
            inputs[key] = sample[key]
    if "image_grid_thw" in sample or "video_grid_thw" in sample:
        ids = sample["input_ids"]
        inputs["mm_token_type_ids"] = ((ids == IMG).int() + 2 * (ids == VID).int())[None]
    return inputs
