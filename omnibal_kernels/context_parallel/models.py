"""``apply_context_parallel``: a transformers model trained on a CP rank's shard of a pack, text or vision-language.

One call prepares a model for the batches of ``PackCollator.for_model(model, context_parallel=...)``:

* its text attention becomes :func:`~omnibal_kernels.context_parallel.context_parallel_attention` (registered in
  transformers' ``AttentionInterface`` and selected for the text model only; a vision tower keeps its own);
* a forward pre-hook checks that the batch is a shard for this group (its ``context_parallel_shard`` is this
  process's rank of a group of this size), hands the attention the group, and, for a vision-language model,
  encodes the images (frame groups, tiles) the rank was given, routes their embedding rows to the ranks holding
  their placeholders (:func:`~.vision.exchange_vision_rows`) and gives the model the rows of its own
  placeholders as precomputed encoder outputs (``mm_encoder_outputs``), in place of the pixels.

Then on every rank of the group ``model(**batch)`` returns the rank's logits and its part of the pack's loss
(its targets' summed loss over the pack's ``num_items_in_batch``): the ranks' losses add up to the pack's, and
their gradients, summed over the group (the usual all-reduce), to the unsharded model's, vision tower
included.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ..model_inputs import MROPE_MODEL_TYPES, TILE_MODEL_TYPES, forward_keys
from .adapters import TRANSFORMERS_ATTENTION, register_transformers_attention
from .shard import ContextParallelShard
from .vision import VisionShard, exchange_vision_rows

__all__ = ["apply_context_parallel"]

_SHARD_KEY = "context_parallel_shard"
_GROUP_KEY = "context_parallel_group"
# The inputs a vision-language forward would encode itself; the hook encodes the rank's units instead.
_PIXEL_KEYS = ("pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "second_per_grid_ts")
_HOOK_ATTR = "_omnibal_context_parallel_hook"
# The submodules that make image features (Qwen-VL: visual; InternVL: vision_tower, multi_modal_projector).
_VISION_MODULES = ("visual", "vision_tower", "multi_modal_projector")


def _parameters(model: Any, name: str) -> list[torch.nn.Parameter]:
    """The parameters of ``model``'s submodule ``name`` (found on the model or its inner ``model``)."""
    for owner in (model, getattr(model, "model", None)):
        module = getattr(owner, name, None)
        if isinstance(module, torch.nn.Module):
            return list(module.parameters())
    return []


def _model_kind(model: Any) -> str:
    """``"text"``, ``"patches"`` (Qwen2-VL, Qwen2.5-VL) or ``"tiles"`` (InternVL), else a ValueError naming
    the class."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    name = type(model).__name__
    if config is None or not callable(getattr(model, "forward", None)):
        raise TypeError(f"apply_context_parallel: model must be a transformers model, got {name}")
    keys = forward_keys(model.forward)
    if model_type in MROPE_MODEL_TYPES or model_type in TILE_MODEL_TYPES:
        if "mm_encoder_outputs" not in keys or not callable(getattr(model, "get_image_features", None)):
            raise ValueError(
                f"apply_context_parallel: {name} takes no precomputed encoder outputs (mm_encoder_outputs), "
                "so its image features cannot be routed to the ranks holding their placeholders; use the "
                "ForConditionalGeneration class of an installed transformers that has them"
            )
        return "patches" if model_type in MROPE_MODEL_TYPES else "tiles"
    if getattr(config, "vision_config", None) is not None:
        raise ValueError(
            f"apply_context_parallel: cannot route the image features of {name} (model_type {model_type!r}); "
            f"vision-language models it routes: {', '.join(MROPE_MODEL_TYPES + TILE_MODEL_TYPES)}"
        )
    if "labels" not in keys or "position_ids" not in keys:
        raise ValueError(
            f"apply_context_parallel: {name} is not a causal LM that takes labels and position_ids (a "
            "ForCausalLM class)"
        )
    return "text"


class _ContextParallelHook:
    """The forward pre-hook: check the shard against the group, pass the group on, route vision features."""

    def __init__(self, kind: str, group: Any) -> None:
        self.kind, self.group = kind, group

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if args:
            raise TypeError("a context-parallel model takes its batch as keyword arguments: model(**batch)")
        shard = kwargs.get(_SHARD_KEY)
        if not isinstance(shard, ContextParallelShard):
            raise ValueError(
                f"{type(module).__name__}: the batch has no context_parallel_shard (a ContextParallelShard): "
                "it comes from another collator; use PackCollator.for_model(model, context_parallel="
                "ContextParallelOptions(size=C)) on every rank of the group"
            )
        group = kwargs.get(_GROUP_KEY, self.group)
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if shard.context_parallel_size != size or shard.rank != rank:
            raise ValueError(
                f"{type(module).__name__}: the batch is CP rank {shard.rank}'s shard for a group of "
                f"{shard.context_parallel_size} (context_parallel.size) but this process is rank {rank} of a "
                f"group of {size}: build the collator with the group's size and this process's rank"
            )
        kwargs[_GROUP_KEY] = group
        if self.kind != "text":
            self._route(module, kwargs, shard.vision, group)
        return args, kwargs

    def _route(self, model: Any, kwargs: dict[str, Any], vision: Optional[VisionShard], group: Any) -> None:
        pixels = {key: kwargs.pop(key, None) for key in _PIXEL_KEYS}
        if vision is None:
            if pixels["pixel_values"] is not None or pixels["pixel_values_videos"] is not None:
                raise ValueError(
                    f"{type(model).__name__}: the batch holds pixels but its context_parallel_shard no vision "
                    "routing (a batch from another collator); use PackCollator.for_model(model, "
                    "context_parallel=...), which divides the pack's images among the ranks"
                )
            return
        own = self._encode(model, pixels, vision)
        if own is None:
            own = self._nothing_encoded(model)
        rows = exchange_vision_rows(own, vision, group)
        kinds = set(vision.work.units.kind.tolist())
        outputs: dict[str, Any] = {}
        if 0 in kinds:
            outputs["image"] = self._encoder_output(rows[: vision.image_rows])
        if 1 in kinds:
            outputs["video"] = self._encoder_output(rows[vision.image_rows :])
        kwargs["mm_encoder_outputs"] = outputs

    def _encode(self, model: Any, pixels: dict[str, Any], vision: VisionShard) -> Optional[torch.Tensor]:
        """This rank's embedding rows: its images' then its videos' (None when it encodes nothing)."""
        parts = []
        if self.kind == "tiles" and vision.encoded_image_rows:
            config = model.config
            out = model.get_image_features(
                pixel_values=pixels["pixel_values"],
                vision_feature_layer=config.vision_feature_layer,
                vision_feature_select_strategy=config.vision_feature_select_strategy,
                return_dict=True,
            )
            features = out.pooler_output
            parts.append(features.reshape(-1, features.shape[-1]))
        elif self.kind == "patches":
            if vision.encoded_image_rows:
                out = model.get_image_features(pixels["pixel_values"], pixels["image_grid_thw"], return_dict=True)
                parts.append(torch.cat(list(out.pooler_output), dim=0))
            if vision.encoded_video_rows:
                out = model.get_video_features(
                    pixels["pixel_values_videos"], pixels["video_grid_thw"], return_dict=True
                )
                parts.append(torch.cat(list(out.pooler_output), dim=0))
        return torch.cat(parts, dim=0) if parts else None

    @staticmethod
    def _nothing_encoded(model: Any) -> torch.Tensor:
        """The features of a rank that encodes no unit of a pack with images: no rows, but in the graph of every
        vision parameter with a zero weight, so that each gets a gradient (0) on this rank as on the others (DDP
        expects every parameter used) and the exchange's backward runs here too."""
        embeddings = model.get_input_embeddings().weight
        empty = embeddings.new_zeros((0, embeddings.shape[1]))
        if not torch.is_grad_enabled():
            return empty
        vision = [p for name in _VISION_MODULES for p in _parameters(model, name) if p.requires_grad]
        if not vision:
            return empty.requires_grad_()
        anchor = torch.stack([p.sum().to(empty.dtype) for p in vision]).sum()
        return empty + 0.0 * anchor

    def _encoder_output(self, rows: torch.Tensor) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        # Qwen-VL forwards concatenate a tuple of per-image features; InternVL's scatters one tensor
        pooled: Any = (rows,) if self.kind == "patches" else rows
        return BaseModelOutputWithPooling(pooler_output=pooled)


def apply_context_parallel(model: Any, group: Any = None, *, attention: str = TRANSFORMERS_ATTENTION) -> Any:
    """Prepare a transformers model to train CP ranks' shards of packs (see the module docstring).

    Args:
        model: a text causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...) or a vision-language model
            (``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``,
            ``InternVLForConditionalGeneration``), not yet wrapped (apply before DDP/FSDP).
        group: the CP process group (None: the whole world); its size must be the collator's
            ``context_parallel.size``.
        attention: the name the CP attention is registered under.

    Returns:
        ``model``, changed in place (applying again replaces the hook and the group).

    Collective: every forward runs the attention's K/V exchanges and, for a vision-language pack, one
    all-to-all of embedding rows, so every rank of ``group`` runs ``model(**batch)`` on its shard of the same
    pack (and ``backward`` on its loss) in step.

    Raises:
        TypeError: not a transformers model.
        ValueError: a vision-language model whose features it cannot route (named), torch.distributed not
            initialized. At forward: a batch without a shard (another collator's), a shard for another group
            size or rank, pixels without vision routing.
    """
    kind = _model_kind(model)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("apply_context_parallel: torch.distributed is not initialized (init_process_group first)")
    dist.get_world_size(group)  # a group this process is not in fails here, not at the first forward
    name = register_transformers_attention(attention)
    if kind == "text":
        model.set_attn_implementation(name)
    else:
        model.set_attn_implementation({"text_config": name})
    previous = getattr(model, _HOOK_ATTR, None)
    if previous is not None:
        previous.remove()
    handle = model.register_forward_pre_hook(_ContextParallelHook(kind, group), with_kwargs=True)
    object.__setattr__(model, _HOOK_ATTR, handle)
    return model
