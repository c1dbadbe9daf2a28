"""Configs of tiny transformers models: one builder per architecture, at the sizes of a :class:`TinySizes`.

Two families use them: the models the tests train (:mod:`omnibal_kernels.testing.hf_models`, width 32) and the
ones cost models are calibrated on (:mod:`omnibal_kernels.calibration.models`, width 64). Every family has a Llama
and a Qwen2 text model, a Qwen2-VL and a Qwen2.5-VL (mRoPE; images and videos as patches) and an InternVL (images
as tiles, 4x fewer tokens after its pixel shuffle), all on the same text model. transformers is imported inside
the builders only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "TinySizes",
    "internvl_config",
    "llama_config",
    "mrope_text_config",
    "qwen2_5_vl_config",
    "qwen2_config",
    "qwen2_vl_config",
    "text_config",
]

# Every tiny head is 16 wide: 8 rotary frequencies, split (time, height, width) by mRoPE.
_HEAD_DIM = 16
_MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}
# The Qwen-VL vision layout of the released models: RGB, 2 frames per temporal patch, 2x2 patches per token.
_CHANNELS, _TEMPORAL, _MERGE = 3, 2, 2


@dataclass(frozen=True)
class TinySizes:
    """The sizes and special tokens of one family of tiny models.

    The text model has ``layers`` layers of width ``hidden`` (``heads`` query and ``kv_heads`` key/value heads of
    16, an MLP of ``intermediate``, a vocabulary of ``vocab``). Qwen2-VL's vision tower has ``layers`` layers of
    width 32, Qwen2.5-VL's two (the second attends over whole images, the first within windows of ``window``
    pixels); both cut ``patch``-pixel patches. InternVL's tower is the text model's width, layers and heads over
    ``tile``-pixel tiles of ``tile_patch``-pixel patches.
    """

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    patch: int
    window: int
    tile: int
    tile_patch: int
    image_token: int  # Qwen-VL image placeholder
    video_token: int  # Qwen-VL video placeholder
    vision_start_token: int
    vision_end_token: int
    internvl_image_token: int  # InternVL's image context placeholder


def text_config(sizes: TinySizes) -> dict[str, Any]:
    """The text model's config keywords (Llama layout)."""
    return dict(
        vocab_size=sizes.vocab,
        hidden_size=sizes.hidden,
        intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.kv_heads,
        head_dim=_HEAD_DIM,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def mrope_text_config(sizes: TinySizes) -> dict[str, Any]:
    """The text config of the Qwen-VL models (mRoPE sections)."""
    return {**text_config(sizes), "rope_parameters": dict(_MROPE)}


def llama_config(sizes: TinySizes) -> Any:
    """The tiny ``LlamaConfig``."""
    import transformers

    return transformers.LlamaConfig(**text_config(sizes))


def qwen2_config(sizes: TinySizes) -> Any:
    """The tiny ``Qwen2Config``."""
    import transformers

    return transformers.Qwen2Config(**text_config(sizes))


def _qwen_vision(sizes: TinySizes) -> dict[str, Any]:
    return dict(patch_size=sizes.patch, temporal_patch_size=_TEMPORAL, in_channels=_CHANNELS, spatial_merge_size=_MERGE)


def _qwen_tokens(sizes: TinySizes) -> dict[str, Any]:
    return dict(
        image_token_id=sizes.image_token,
        video_token_id=sizes.video_token,
        vision_start_token_id=sizes.vision_start_token,
        vision_end_token_id=sizes.vision_end_token,
    )


def qwen2_vl_config(sizes: TinySizes) -> Any:
    """The tiny ``Qwen2VLConfig``."""
    import transformers

    vision = dict(
        depth=sizes.layers, embed_dim=32, num_heads=2, hidden_size=sizes.hidden, mlp_ratio=2, **_qwen_vision(sizes)
    )
    return transformers.Qwen2VLConfig(text_config=mrope_text_config(sizes), vision_config=vision, **_qwen_tokens(sizes))


def qwen2_5_vl_config(sizes: TinySizes) -> Any:
    """The tiny ``Qwen2_5_VLConfig``."""
    import transformers

    vision = dict(
        depth=2,
        hidden_size=32,
        out_hidden_size=sizes.hidden,
        intermediate_size=64,
        num_heads=2,
        window_size=sizes.window,
        fullatt_block_indexes=[1],
        tokens_per_second=2,
        **_qwen_vision(sizes),
    )
    return transformers.Qwen2_5_VLConfig(
        text_config=mrope_text_config(sizes), vision_config=vision, **_qwen_tokens(sizes)
    )


def internvl_config(sizes: TinySizes) -> Any:
    """The tiny ``InternVLConfig`` (a Qwen2 text model)."""
    import transformers

    vision = dict(
        hidden_size=sizes.hidden,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        intermediate_size=2 * sizes.hidden,
        image_size=[sizes.tile, sizes.tile],
        patch_size=[sizes.tile_patch, sizes.tile_patch],
    )
    return transformers.InternVLConfig(
        text_config={"model_type": "qwen2", **text_config(sizes)},
        vision_config=vision,
        image_token_id=sizes.internvl_image_token,
        downsample_ratio=0.5,
    )
