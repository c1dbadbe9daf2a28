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
from functools import partial
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Union

from .. import _tiny_models
from .._tiny_models import TinySizes

__all__ = ["SIZES", "TINY_MODELS", "TinyModel", "build_model", "check_device", "model_config"]

# Text models of 2 layers of width 64, grouped-query attention, vocabulary 256; the placeholder and vision tokens
# at the top of the vocabulary, above every random text id. Qwen-VL cuts the released models' 14 px patches.
SIZES = TinySizes(
    vocab=256,
    hidden=64,
    intermediate=176,
    layers=2,
    heads=4,
    kv_heads=2,
    patch=14,
    window=112,
    tile=112,
    tile_patch=14,
    image_token=252,
    video_token=253,
    vision_start_token=254,
    vision_end_token=255,
    internvl_image_token=252,
)


class TinyModel(NamedTuple):
    """A named tiny model: its config, and the image resolution (``calibration_lengths``' ``image_scale``) at
    which it times quickly on a CPU."""

    config: Callable[[], Any]
    image_scale: float = 1.0


TINY_MODELS: dict[str, TinyModel] = {
    "tiny-llama": TinyModel(partial(_tiny_models.llama_config, SIZES)),
    "tiny-qwen2-vl": TinyModel(partial(_tiny_models.qwen2_vl_config, SIZES), 0.3),
    "tiny-qwen2.5-vl": TinyModel(partial(_tiny_models.qwen2_5_vl_config, SIZES), 0.3),
    "tiny-internvl": TinyModel(partial(_tiny_models.internvl_config, SIZES)),
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


def check_device(device: Optional[str], name: str = "device") -> str:
    """``device`` as the device a built model runs on: ``"cpu"``, or ``"cuda"`` / ``"cuda:N"`` where that GPU
    exists (None: CUDA when available, else the CPU); a ValueError naming ``name`` otherwise."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str):
        raise TypeError(f"{name} must be a str such as 'cpu' or 'cuda:0', got {type(device).__name__}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{name} {device!r}: this torch ({torch.__version__}) sees no CUDA device")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"{name} {device!r}: this machine has {count} CUDA device(s)")
    return device


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

    device = check_device(device)
    on_cuda = device.startswith("cuda")
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
