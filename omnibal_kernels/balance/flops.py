"""Training FLOPs of a transformers model from its config: the cost terms of :meth:`CostModel.from_config`.

Counted: every matrix multiply, at 2 FLOPs per multiply-add, forward; training is 3x the forward (the backward
computes the gradients of both the activations and the weights). Not counted: norms, activations, rotary
embeddings, softmax, biases (each a few FLOPs per element, below 1% of a layer's matmuls at any real width).

- Text decoder (Llama, Qwen2, Qwen2-VL's and Qwen2.5-VL's text models, InternVL's): per token, the q/k/v/o
  projections (``heads``, ``kv heads`` of ``head_dim``), the gated MLP (gate, up, down of ``intermediate``)
  in every layer and the LM head (``vocab``); causal attention over each sample's ``t`` tokens, ``QK^T`` and
  ``AV`` on ``t**2 / 2`` query-key pairs: ``2 * heads * head_dim * t**2`` per layer (the diagonal's linear
  ``t`` left out).
- Qwen2-VL ViT, per patch: the patch embedding (``channels * temporal * patch**2`` inputs), ``depth`` blocks
  (qkv, proj, fc1/fc2 of ``embed_dim * mlp_ratio``), the patch merger (``merge**2`` patches per merged
  token, then to the LLM width); bidirectional attention within each image or video frame group of ``s``
  patches, ``4 * embed_dim * s**2`` per block: the quadratic term.
- Qwen2.5-VL ViT: as Qwen2-VL with a gated MLP; its blocks in ``fullatt_block_indexes`` attend over each
  frame group (quadratic term), the others within windows of ``(window_size // merge // patch * merge)**2``
  patches: linear in patches, counted as full windows (an upper bound for images that do not fill them).
- InternVL ViT, per tile: ``(image_size / patch)**2`` patches plus the class token through every layer,
  attention within the tile (so linear in tiles: ``vit_quadratic`` is 0), then the pixel-shuffle projector
  (``downsample_ratio``) to the LLM width.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple, Union

from .._flops import TRAIN_FACTOR

__all__ = ["ConfigFlops", "config_flops", "read_model_config"]

# Text decoders with the Llama layout (q/k/v/o attention, gate/up/down MLP, an LM head).
TEXT_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_vl_text", "qwen2_5_vl_text")
VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "internvl")


class ConfigFlops(NamedTuple):
    """Training FLOPs per unit of each load: ``vit_linear`` per ViT unit (patch or tile), ``vit_quadratic`` per
    squared ViT sequence length, ``llm_linear`` per token, ``llm_quadratic`` per squared sample length."""

    vit_linear: float
    vit_quadratic: float
    llm_linear: float
    llm_quadratic: float


def _get(config: Any, name: str, *alternatives: str) -> Any:
    for key in (name, *alternatives):
        value = getattr(config, key, None)
        if value is not None:
            return value
    model_type = getattr(config, "model_type", type(config).__name__)
    raise ValueError(f"config ({model_type}): has no {name!r}, which the FLOP count needs")


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, (int, float)) else (int(value[0]), int(value[1]))


def text_flops(config: Any) -> tuple[float, float]:
    """``(per token, per squared sample length)`` forward FLOPs of a Llama-layout decoder and its LM head."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    intermediate = int(_get(config, "intermediate_size"))
    vocab = int(_get(config, "vocab_size"))
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    per_layer = attention + 3 * hidden * intermediate
    return 2.0 * (layers * per_layer + hidden * vocab), 2.0 * heads * head_dim * layers


def _patch_embed(vision: Any, width: int) -> int:
    patch = int(_get(vision, "patch_size"))
    channels = int(_get(vision, "in_channels", "num_channels"))
    return channels * int(_get(vision, "temporal_patch_size")) * patch**2 * width


def qwen2_vl_vision_flops(vision: Any) -> tuple[float, float]:
    """``(per patch, per squared frame-group length)`` forward FLOPs of the Qwen2-VL ViT."""
    embed = int(_get(vision, "embed_dim"))
    depth = int(_get(vision, "depth"))
    mlp = int(embed * float(_get(vision, "mlp_ratio")))
    merge = int(_get(vision, "spatial_merge_size"))
    out = int(_get(vision, "hidden_size"))
    per_patch = _patch_embed(vision, embed) + depth * (4 * embed**2 + 2 * embed * mlp)
    per_patch += embed**2 * merge**2 + embed * out  # merger: (embed * merge**2)**2 + that * out per merged token
    return 2.0 * per_patch, 4.0 * embed * depth


def qwen2_5_vl_vision_flops(vision: Any) -> tuple[float, float]:
    """``(per patch, per squared frame-group length)`` forward FLOPs of the Qwen2.5-VL ViT (windows linear)."""
    embed = int(_get(vision, "hidden_size"))
    depth = int(_get(vision, "depth"))
    intermediate = int(_get(vision, "intermediate_size"))
    merge = int(_get(vision, "spatial_merge_size"))
    patch = int(_get(vision, "patch_size"))
    out = int(_get(vision, "out_hidden_size"))
    full = len(set(int(i) for i in (getattr(vision, "fullatt_block_indexes", None) or ())) & set(range(depth)))
    window_patches = (int(_get(vision, "window_size")) // merge // patch * merge) ** 2
    per_patch = _patch_embed(vision, embed) + depth * (4 * embed**2 + 3 * embed * intermediate)
    per_patch += embed**2 * merge**2 + embed * out
    windowed = 4 * embed * window_patches * (depth - full)  # sum over windows of w**2 <= window_patches * patches
    return 2.0 * per_patch + windowed, 4.0 * embed * full


def internvl_vision_flops(config: Any, text_hidden: int) -> float:
    """Forward FLOPs per tile of the InternVL ViT and its projector (attention within the tile included)."""
    vision = config.vision_config
    embed = int(_get(vision, "hidden_size"))
    layers = int(_get(vision, "num_hidden_layers"))
    intermediate = int(_get(vision, "intermediate_size"))
    (height, width), (patch_h, patch_w) = _pair(_get(vision, "image_size")), _pair(_get(vision, "patch_size"))
    patches = (height // patch_h) * (width // patch_w)
    tokens = patches + 1  # the class token
    ratio = float(_get(config, "downsample_ratio"))
    shuffled_width = int(round(embed / ratio**2))
    tile_tokens = int(round(patches * ratio**2))
    macs = patches * int(_get(vision, "num_channels")) * patch_h * patch_w * embed
    macs += tokens * layers * (4 * embed**2 + 2 * embed * intermediate)
    macs += tile_tokens * (shuffled_width * text_hidden + text_hidden**2)
    return 2.0 * macs + 4.0 * embed * tokens**2 * layers


def config_flops(config: Any) -> ConfigFlops:
    """Training FLOPs of ``config`` (a transformers ``PretrainedConfig``) per unit of every load term.

    Raises:
        ValueError: a model type not counted here (see the module docstring), or a config without a field
            the count needs (naming it).
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in TEXT_MODEL_TYPES + VISION_MODEL_TYPES:
        raise ValueError(
            f"config: model_type {model_type!r} is not counted; supported: "
            f"{', '.join(TEXT_MODEL_TYPES + VISION_MODEL_TYPES)}"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else getattr(config, "text_config", config)
    if model_type in VISION_MODEL_TYPES and text is config:
        raise ValueError(f"config ({model_type}): has no text_config")
    if getattr(text, "model_type", None) not in TEXT_MODEL_TYPES:
        raise ValueError(
            f"config ({model_type}): text model type {getattr(text, 'model_type', None)!r} is not "
            f"counted; supported: {', '.join(TEXT_MODEL_TYPES)}"
        )
    llm_linear, llm_quadratic = text_flops(text)
    vit_linear = vit_quadratic = 0.0
    if model_type == "qwen2_vl":
        vit_linear, vit_quadratic = qwen2_vl_vision_flops(_get(config, "vision_config"))
    elif model_type == "qwen2_5_vl":
        vit_linear, vit_quadratic = qwen2_5_vl_vision_flops(_get(config, "vision_config"))
    elif model_type == "internvl":
        vit_linear = internvl_vision_flops(config, int(_get(text, "hidden_size")))
    f = TRAIN_FACTOR
    return ConfigFlops(vit_linear * f, vit_quadratic * f, llm_linear * f, llm_quadratic * f)


def read_model_config(path: Union[str, os.PathLike[str]]) -> Any:
    """A transformers config from a folder holding ``config.json``, or from such a JSON file (never downloaded).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a transformers config (naming it).
    """
    path = Path(path)
    import transformers

    if not path.exists():
        raise FileNotFoundError(f"model config not found: {path}")
    try:
        if path.is_file():
            return transformers.AutoConfig.for_model(**json.loads(path.read_text(encoding="utf-8")))
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a transformers config ({exc})") from exc
