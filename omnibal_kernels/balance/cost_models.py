"""Cost models by name, and the one ``--cost-model`` value the CLI reads (a name, a JSON file, a config folder).

The named models count training FLOPs (GFLOP, :meth:`CostModel.from_config`) of public 7B-class shapes:

=================  ===========================================================================================
``internvl_7b``    InternViT-300M on 448 px tiles + a 7B LLM (:meth:`CostModel.internvl_7b`, the default)
``qwen2_vl_7b``    Qwen2-VL-7B: a 32-block ViT (width 1280) over each image / frame group + Qwen2-7B
``qwen2_5_vl_7b``  Qwen2.5-VL-7B: its windowed ViT (full attention in 4 of 32 blocks) + Qwen2-7B
``llama_7b``       Llama-2-7B (32 layers, width 4096), text only
``tokens_only``    cost = LLM tokens (:meth:`CostModel.tokens_only`)
=================  ===========================================================================================
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Union

from .cost import CostModel

__all__ = ["NAMED_COST_MODELS", "cost_model_from_spec", "named_cost_model"]

# Qwen2-7B, the text model of Qwen2-VL-7B and Qwen2.5-VL-7B (their published config.json).
_QWEN2_7B_TEXT = dict(
    hidden_size=3584,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    intermediate_size=18944,
    vocab_size=152064,
)
_QWEN_PATCHES = dict(patch_size=14, in_channels=3, temporal_patch_size=2, spatial_merge_size=2)


def _qwen2_vl_7b() -> CostModel:
    vision = SimpleNamespace(embed_dim=1280, depth=32, mlp_ratio=4, num_heads=16, hidden_size=3584, **_QWEN_PATCHES)
    return CostModel.from_config(
        SimpleNamespace(
            model_type="qwen2_vl",
            vision_config=vision,
            text_config=SimpleNamespace(model_type="qwen2_vl_text", **_QWEN2_7B_TEXT),
        )
    )


def _qwen2_5_vl_7b() -> CostModel:
    vision = SimpleNamespace(
        hidden_size=1280,
        depth=32,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=3584,
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
        **_QWEN_PATCHES,
    )
    return CostModel.from_config(
        SimpleNamespace(
            model_type="qwen2_5_vl",
            vision_config=vision,
            text_config=SimpleNamespace(model_type="qwen2_5_vl_text", **_QWEN2_7B_TEXT),
        )
    )


def _llama_7b() -> CostModel:
    return CostModel.from_config(
        SimpleNamespace(
            model_type="llama",
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
        )
    )


NAMED_COST_MODELS: dict[str, Callable[[], CostModel]] = {
    "internvl_7b": CostModel.internvl_7b,
    "qwen2_vl_7b": _qwen2_vl_7b,
    "qwen2_5_vl_7b": _qwen2_5_vl_7b,
    "llama_7b": _llama_7b,
    "tokens_only": CostModel.tokens_only,
}


def named_cost_model(name: str) -> CostModel:
    """The model called ``name`` in :data:`NAMED_COST_MODELS`.

    Raises:
        ValueError: an unknown name (the known ones listed).
    """
    if name not in NAMED_COST_MODELS:
        raise ValueError(f"unknown cost model {name!r}; the named models are {', '.join(NAMED_COST_MODELS)}")
    return NAMED_COST_MODELS[name]()


def cost_model_from_spec(spec: Union[str, os.PathLike[str]]) -> CostModel:
    """A cost model from a name of :data:`NAMED_COST_MODELS`, a JSON file of its terms
    (:meth:`CostModel.from_json`, as ``omnibal-kernels calibrate`` writes), or a transformers config folder
    (:meth:`CostModel.from_config`).

    Raises:
        TypeError: ``spec`` not a string or path.
        ValueError: none of those (naming ``spec`` and what was expected), or a file or folder they refuse.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"cost model must be a name or a path, got {type(spec).__name__}")
    text = os.fspath(spec)
    if isinstance(spec, str) and text in NAMED_COST_MODELS:
        return named_cost_model(text)
    path = Path(text)
    if path.is_dir():
        return CostModel.from_config(path)
    if path.is_file():
        return CostModel.from_json(path)
    raise ValueError(
        f"{text!r} is neither a named cost model ({', '.join(NAMED_COST_MODELS)}) nor an existing "
        "JSON file of cost terms or transformers config folder"
    )
