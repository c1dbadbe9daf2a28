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

Every field read is checked where it is read: sizes and counts are integers in ``[1, MAX_DIMENSION]`` (so that
no count divides by zero or leaves float64), ratios finite and positive (``downsample_ratio`` in ``(0, 1]``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional, Union

from .._flops import TRAIN_FACTOR

__all__ = ["ConfigFlops", "config_flops", "read_model_config"]

# Text decoders with the Llama layout (q/k/v/o attention, gate/up/down MLP, an LM head).
TEXT_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_vl_text", "qwen2_5_vl_text")
VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "internvl")
# The largest size or count a config field may hold: far above any model's, and low enough that every product
# of the count stays exact in Python ints and finite in float64.
MAX_DIMENSION = 2**31


class ConfigFlops(NamedTuple):
    """Training FLOPs per unit of each load: ``vit_linear`` per ViT unit (patch or tile), ``vit_quadratic`` per
    squared ViT sequence length, ``llm_linear`` per token, ``llm_quadratic`` per squared sample length."""

    vit_linear: float
    vit_quadratic: float
    llm_linear: float
    llm_quadratic: float


def _model_type(config: Any) -> str:
    return str(getattr(config, "model_type", type(config).__name__))


def _get(config: Any, name: str, *alternatives: str) -> Any:
    for key in (name, *alternatives):
        value = getattr(config, key, None)
        if value is not None:
            return value
    raise ValueError(f"config ({_model_type(config)}): has no {name!r}, which the FLOP count needs")


def _as_dimension(config: Any, name: str, value: Any, minimum: int = 1) -> int:
    """``value`` of field ``name`` as an int in ``[minimum, MAX_DIMENSION]``; else a ValueError naming the field."""
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or not minimum <= int(value) <= MAX_DIMENSION:
        raise ValueError(
            f"config ({_model_type(config)}): {name} must be an integer in [{minimum}, {MAX_DIMENSION}], got {value!r}"
        )
    return int(value)


def _shown(value: Any) -> str:
    """``repr(value)``, its middle left out past 40 characters (a field can hold an integer of any length)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:16]}...{text[-8:]} ({len(text)} characters)"


def _dim(config: Any, name: str, *alternatives: str) -> int:
    """The size or count ``name`` (or the first alternative present), checked."""
    return _as_dimension(config, name, _get(config, name, *alternatives))


def _optional_dim(config: Any, name: str) -> Optional[int]:
    value = getattr(config, name, None)
    return None if value is None else _as_dimension(config, name, value)


def _as_ratio(config: Any, name: str, value: Any, maximum: float) -> float:
    """``value`` of the ratio ``name`` as a float in ``(0, maximum]``; else a ValueError naming the field."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= maximum
    if not ok:
        raise ValueError(f"config ({_model_type(config)}): {name} must be a number in (0, {maximum:g}], got {value!r}")
    return float(value)


def _ratio(config: Any, name: str, maximum: float) -> float:
    return _as_ratio(config, name, _get(config, name), maximum)


def _pair(config: Any, name: str) -> tuple[int, int]:
    value = _get(config, name)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _as_dimension(config, name, value[0]), _as_dimension(config, name, value[1])
    size = _as_dimension(config, name, value)
    return size, size


def text_flops(config: Any) -> tuple[float, float]:
    """``(per token, per squared sample length)`` forward FLOPs of a Llama-layout decoder and its LM head."""
    hidden = _dim(config, "hidden_size")
    layers = _dim(config, "num_hidden_layers")
    heads = _dim(config, "num_attention_heads")
    kv_heads = _optional_dim(config, "num_key_value_heads") or heads
    head_dim = _optional_dim(config, "head_dim")
    if head_dim is None:
        _check_head_split(config, hidden, heads)
        head_dim = hidden // heads
    intermediate = _dim(config, "intermediate_size")
    vocab = _dim(config, "vocab_size")
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    per_layer = attention + 3 * hidden * intermediate
    return 2.0 * (layers * per_layer + hidden * vocab), 2.0 * heads * head_dim * layers


def _patch_embed(vision: Any, width: int) -> int:
    patch = _dim(vision, "patch_size")
    channels = _dim(vision, "in_channels", "num_channels")
    return channels * _dim(vision, "temporal_patch_size") * patch**2 * width


def qwen2_vl_vision_flops(vision: Any) -> tuple[float, float]:
    """``(per patch, per squared frame-group length)`` forward FLOPs of the Qwen2-VL ViT."""
    embed = _dim(vision, "embed_dim")
    depth = _dim(vision, "depth")
    mlp = _as_dimension(vision, "embed_dim * mlp_ratio", int(embed * _ratio(vision, "mlp_ratio", 1024.0)))
    merge = _dim(vision, "spatial_merge_size")
    out = _dim(vision, "hidden_size")
    per_patch = _patch_embed(vision, embed) + depth * (4 * embed**2 + 2 * embed * mlp)
    per_patch += embed**2 * merge**2 + embed * out  # merger: (embed * merge**2)**2 + that * out per merged token
    return 2.0 * per_patch, 4.0 * embed * depth


def qwen2_5_vl_vision_flops(vision: Any) -> tuple[float, float]:
    """``(per patch, per squared frame-group length)`` forward FLOPs of the Qwen2.5-VL ViT (windows linear)."""
    embed = _dim(vision, "hidden_size")
    depth = _dim(vision, "depth")
    intermediate = _dim(vision, "intermediate_size")
    merge = _dim(vision, "spatial_merge_size")
    patch = _dim(vision, "patch_size")
    out = _dim(vision, "out_hidden_size")
    blocks = getattr(vision, "fullatt_block_indexes", None) or ()
    full = len({_as_dimension(vision, "fullatt_block_indexes", i, 0) for i in blocks} & set(range(depth)))
    window_patches = (_dim(vision, "window_size") // merge // patch * merge) ** 2
    per_patch = _patch_embed(vision, embed) + depth * (4 * embed**2 + 3 * embed * intermediate)
    per_patch += embed**2 * merge**2 + embed * out
    windowed = 4 * embed * window_patches * (depth - full)  # sum over windows of w**2 <= window_patches * patches
    return 2.0 * per_patch + windowed, 4.0 * embed * full


def internvl_vision_flops(config: Any, text_hidden: int) -> float:
    """Forward FLOPs per tile of the InternVL ViT and its projector (attention within the tile included)."""
    vision = config.vision_config
    embed = _dim(vision, "hidden_size")
    layers = _dim(vision, "num_hidden_layers")
    intermediate = _dim(vision, "intermediate_size")
    (height, width), (patch_h, patch_w) = _pair(vision, "image_size"), _pair(vision, "patch_size")
    patches = (height // patch_h) * (width // patch_w)
    tokens = patches + 1  # the class token
    ratio = _ratio(config, "downsample_ratio", 1.0)
    shuffled_width = _as_dimension(config, "hidden_size / downsample_ratio**2", float(round(embed / ratio / ratio, 0)))
    tile_tokens = int(round(patches * ratio**2))
    macs = patches * _dim(vision, "num_channels") * patch_h * patch_w * embed
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
        vit_linear = internvl_vision_flops(config, _dim(text, "hidden_size"))
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
    file = path if path.is_file() else path / "config.json"
    if file.is_file():
        # transformers divides by some fields as it builds the config: their values are checked first
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{file}: not a transformers config ({exc})") from exc
        _check_fields(raw, str(file))
    try:
        if path.is_file():
            return transformers.AutoConfig.for_model(**json.loads(path.read_text(encoding="utf-8")))
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        if not isinstance(exc, (OSError, ValueError, KeyError, TypeError, *_config_errors())):
            raise
        # one line: transformers' messages span several
        raise ValueError(f"{path}: not a transformers config ({' '.join(str(exc).split())})") from exc


# The fields of a config.json the count reads (or that transformers divides by): sizes and counts, the ones that
# may be null, and ratios with their largest value.
_DIMENSIONS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "embed_dim",
    "depth",
    "num_heads",
    "out_hidden_size",
    "patch_size",
    "image_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "in_channels",
    "num_channels",
    "window_size",
)
_OPTIONAL_DIMENSIONS = ("num_key_value_heads", "head_dim")
_RATIOS = {"mlp_ratio": 1024.0, "downsample_ratio": 1.0}
_SUB_CONFIGS = ("text_config", "llm_config", "vision_config")


def _check_head_split(config: Any, hidden: int, heads: int) -> None:
    """Without ``head_dim``, each head is ``hidden_size // num_attention_heads`` wide: the split must be exact."""
    if int(hidden) % int(heads):
        raise ValueError(
            f"config ({_model_type(config)}): hidden_size ({hidden}) must be a multiple of num_attention_heads "
            f"({heads}) when head_dim is not given"
        )


def _check_fields(raw: Any, where: str) -> None:
    """The sizes, counts and ratios of a config.json object (and of its sub-configs), each checked as the count
    reads it; a ValueError naming the file and the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a config must be a JSON object, got {type(raw).__name__}")
    config = SimpleNamespace(model_type=f"{where}: {raw.get('model_type')}")
    for name in _DIMENSIONS + _OPTIONAL_DIMENSIONS:
        if name not in raw or (raw[name] is None and name in _OPTIONAL_DIMENSIONS):
            continue
        values = raw[name] if name in ("patch_size", "image_size") and isinstance(raw[name], list) else [raw[name]]
        for value in values:
            _as_dimension(config, name, value)
    for name, maximum in _RATIOS.items():
        if name in raw:
            _as_ratio(config, name, raw[name], maximum)
    if raw.get("head_dim") is None and "hidden_size" in raw and "num_attention_heads" in raw:
        _check_head_split(config, raw["hidden_size"], raw["num_attention_heads"])
    for name in _SUB_CONFIGS:
        if isinstance(raw.get(name), dict):
            _check_fields(raw[name], f"{where}: {name}")


def _config_errors() -> tuple[type[Exception], ...]:
    """transformers' refusals of a config's values (the strict dataclass checks of huggingface_hub, which derive
    from Exception alone), beside the builtin errors."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)
