"""The models a cost model is calibrated on: named tiny ones, or any config, built with random weights.

Named models (``TINY_MODELS``) are small enough to time on a CPU in seconds while compute, not Python, takes
most of each step: a Llama, a Qwen2-VL, a Qwen2.5-VL and an InternVL with two text layers of width 64. Their
width keeps a pack's activations within the caches of a CPU core over the packs timed, so that a pack's time
grows linearly with its tokens (at width 128 and vocabulary 1,024 a pack of 2,000 tokens already costs more per
token than one of 1,000, a pack-level effect no per-sample term describes). A
config folder (``config.json``, as every Hugging Face checkpoint has) builds that model at full size, with
random weights (timing does not depend on their values).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Union

__all__ = ["TINY_MODELS", "TinyModel", "build_model", "model_config"]

# Text model of every named model: 2 layers of width 64, grouped-query attention, vocabulary 256.
_TEXT: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# Placeholder and vision tokens at the top of the vocabulary, above every random text id.
_IMAGE, _VIDEO, _VISION_START, _VISION_END = 252, 253, 254, 255
# mRoPE sections of a 16-wide head (8 rotary frequencies: time, height, width).
_MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}


def _llama() -> Any:
    import transformers

    return transformers.LlamaConfig(**_TEXT)


def _qwen_ids() -> dict[str, Any]:
    return dict(
        image_token_id=_IMAGE,
        video_token_id=_VIDEO,
        vision_start_token_id=_VISION_START,
        vision_end_token_id=_VISION_END,
    )


def _qwen2_vl() -> Any:
    import transformers

    vision = dict(
        depth=2,
        embed_dim=32,
        num_heads=2,
        hidden_size=_TEXT["hidden_size"],
        mlp_ratio=2,
        patch_size=14,
        temporal_patch_size=2,
        in_channels=3,
        spatial_merge_size=2,
    )
    return transformers.Qwen2VLConfig(
        text_config={**_TEXT, "rope_parameters": _MROPE}, vision_config=vision, **_qwen_ids()
    )


def _qwen2_5_vl() -> Any:
    import transformers

    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=_TEXT["hidden_size"],
        num_heads=2,
        patch_size=14,
        temporal_patch_size=2,
        in_channels=3,
        spatial_merge_size=2,
        window_size=112,
        fullatt_block_indexes=[1],
        tokens_per_second=2,
    )
    return transformers.Qwen2_5_VLConfig(
        text_config={**_TEXT, "rope_parameters": _MROPE}, vision_config=vision, **_qwen_ids()
    )


def _internvl() -> Any:
    import transformers

    vision = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=[112, 112],
        patch_size=[14, 14],
    )
    return transformers.InternVLConfig(
        text_config={"model_type": "qwen2", **_TEXT}, vision_config=vision, image_token_id=_IMAGE, downsample_ratio=0.5
    )


class TinyModel(NamedTuple):
    """A named tiny model: its config, and the image resolution (``calibration_lengths``' ``image_scale``) at
    which it times quickly on a CPU."""

    config: Callable[[], Any]
    image_scale: float = 1.0


TINY_MODELS: dict[str, TinyModel] = {
    "tiny-llama": TinyModel(_llama),
    "tiny-qwen2-vl": TinyModel(_qwen2_vl, 0.3),
    "tiny-qwen2.5-vl": TinyModel(_qwen2_5_vl, 0.3),
    "tiny-internvl": TinyModel(_internvl),
}


def model_config(model: Union[str, os.PathLike[str]]) -> Any:
    """The config of a named tiny model (``TINY_MODELS``), or read from a folder holding ``config.json``.

    Raises:
        ValueError: neither a known name nor a config folder (or the folder's config is not readable).
    """
    if isinstance(model, str) and model in TINY_MODELS:
        return TINY_MODELS[model].config()
    path = Path(model)
    if not (path / "config.json").is_file() and not (path.is_file() and path.suffix == ".json"):
        raise ValueError(
            f"model {str(model)!r}: neither a named model ({', '.join(TINY_MODELS)}) nor a folder holding config.json"
        )
    from ..balance.flops import read_model_config

    return read_model_config(path)


def build_model(
    config: Any, *, device: str = "cpu", dtype: Optional[str] = None, attn_implementation: Optional[str] = None
) -> Any:
    """The transformers model of ``config`` with random weights, in training mode, on ``device``.

    Args:
        config: a transformers config (see :func:`model_config`).
        device: where the model runs (``"cpu"``, ``"cuda"``, ...).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (default: bfloat16 on CUDA, float32 else).
        attn_implementation: transformers' attention (default: ``"flash_attention_2"`` on CUDA when
            flash-attn imports, else the per-sample attention of :mod:`omnibal_kernels.calibration.attention`).
    """
    import importlib.util

    import torch
    import transformers

    from .attention import register_segment_attention

    on_cuda = str(device).startswith("cuda")
    dtype = dtype or ("bfloat16" if on_cuda else "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    segments = register_segment_attention()
    if attn_implementation is None:
        use_flash = on_cuda and importlib.util.find_spec("flash_attn") is not None
        attn_implementation = "flash_attention_2" if use_flash else segments
    is_vlm = getattr(config, "vision_config", None) is not None
    auto = transformers.AutoModelForImageTextToText if is_vlm else transformers.AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation=attn_implementation, dtype=getattr(torch, dtype))
    return model.to(device).train()
