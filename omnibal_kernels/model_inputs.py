"""What a transformers model reads from a packed batch, taken from the model (or its config) once.

:meth:`omnibal_kernels.packing.PackCollator.for_model` builds its collator from :func:`model_inputs`, so that
``model(**batch)`` trains a packed row exactly like its samples one at a time. Four things must match what the
installed transformers does:

- Placeholder tokens and the vision tower's spatial merge (Qwen2-VL / Qwen2.5-VL, and ``tokens_per_second``
  for Qwen2.5-VL videos): the batch's mRoPE positions are numbered per sample as the model's own
  ``get_rope_index`` numbers them.
- The mRoPE layout. The Qwen-VL text models of transformers find packed sequences only in ``(4, 1, T)``
  ``position_ids`` whose row 0 holds the 1-D text positions; given the plain 3 rows they let the samples of a
  row attend to each other.
- The keys the model's ``forward`` accepts: its named arguments and the keyword arguments it declares
  (``**kwargs: Unpack[TransformersKwargs]``); every other key of the packed batch is left out. Qwen-VL models
  also hand those keyword arguments to their vision tower, which takes ``cu_seqlens`` / ``max_seqlen`` as its
  own patch boundaries and passes the flash-attention keys (``cu_seq_lens_q``, ...) next to its own, so their
  batches keep none of these: the text positions in row 0 carry the boundaries, for the sdpa/eager mask and
  for flash-attention's varlen path alike.
- ``use_cache=False``: transformers skips packed-sequence detection whenever a cache exists, and the models
  create one when ``use_cache`` is on (the config default, also in training mode), so every batch carries
  ``use_cache=False`` (InternVL's forward does not name it but hands it on to its text model).

transformers is imported only inside functions: the package imports without it.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

__all__ = ["ModelInputs", "model_inputs", "forward_keys"]

# Model types whose text positions are mRoPE (3 rows: time, height, width) and whose forward passes its
# keyword arguments on to the vision tower.
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
# Model types whose images are (n, C, H, W) tiles behind 1-D text positions.
TILE_MODEL_TYPES = ("internvl",)
# Packed-text keyword arguments a Qwen-VL vision tower would receive along with the text model.
_VISION_TOWER_MISREADS = frozenset(
    ("cu_seqlens", "max_seqlen", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
)
# How a transformers text model that reads a text-position row in 4-row position_ids tests for it.
_TEXT_ROW_TEST = re.compile(r"position_ids\.shape\[0\]\s*==\s*4")
_UNPACK = re.compile(r"^\s*(?:typing\.)?Unpack\[\s*([A-Za-z_][\w.]*)\s*\]\s*$")


@dataclass(frozen=True)
class ModelInputs:
    """What one transformers model takes from a packed batch (see the module docstring).

    model_type: the config's ``model_type`` (``"llama"``, ``"qwen2_vl"``, ...).
    options: :class:`omnibal_kernels.packing.PackOptions` keyword arguments read from the config
        (placeholder ids, spatial merge, ``tokens_per_second``, ``mrope_text_row``); empty for text models.
    keys: the batch keys the model's ``forward`` accepts and reads as packing means them.
    constants: values added to every batch (``use_cache=False``).
    tile_token_id, tokens_per_tile: InternVL's image placeholder and how many of them one tile becomes;
        :meth:`select` checks every sample's placeholders against its tiles (None: no check).
    """

    model_type: str
    options: Mapping[str, Any] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()
    constants: Mapping[str, Any] = field(default_factory=dict)
    tile_token_id: int | None = None
    tokens_per_tile: int | None = None

    def select(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a packed batch that go to the model's ``forward``, plus :attr:`constants`.

        Raises ValueError naming the sample whose placeholder tokens do not match its tiles (InternVL).
        """
        if self.tokens_per_tile is not None:
            self._check_tiles(fields)
        out = {key: value for key, value in fields.items() if key in self.keys}
        out.update(self.constants)
        return out

    def _check_tiles(self, fields: Mapping[str, Any]) -> None:
        import torch

        seq_lens = fields["seq_lens"]
        num_tiles = fields.get("num_images")
        num_samples = seq_lens.shape[0] if num_tiles is None else num_tiles.shape[0]
        is_placeholder = fields["input_ids"][0] == self.tile_token_id
        found = torch.bincount(fields["seq_idx"][0][is_placeholder].long(), minlength=seq_lens.shape[0])
        want = torch.zeros_like(found)
        if num_tiles is not None:
            want[:num_samples] = num_tiles.long() * self.tokens_per_tile
        bad = torch.nonzero(found != want).flatten()
        if bad.numel():
            i = int(bad[0])
            tiles = int(want[i]) // cast(int, self.tokens_per_tile)  # select checks tiles only when it is set
            raise ValueError(
                f"sample {i}: {int(found[i])} image placeholder tokens (id {self.tile_token_id}) but "
                f"{tiles} tiles in pixel_values, which take {int(want[i])} ({self.tokens_per_tile} "
                f"per tile)"
            )


def _unpacked_keys(annotation: Any, function: Any) -> set[str]:
    """The keys of the TypedDict in a ``**kwargs: Unpack[SomeKwargs]`` annotation (empty when there is none)."""
    target = None
    if isinstance(annotation, str):
        match = _UNPACK.match(annotation)
        if match is None:
            return set()
        scope = getattr(inspect.unwrap(function), "__globals__", {})
        target = scope
        for part in match.group(1).split("."):
            target = target.get(part) if isinstance(target, dict) else getattr(target, part, None)
    elif "Unpack" in repr(typing.get_origin(annotation)) and typing.get_args(annotation):
        target = typing.get_args(annotation)[0]
    keys = getattr(target, "__annotations__", None)
    return set(keys) if isinstance(keys, dict) else set()


def forward_keys(forward: Any) -> frozenset[str]:
    """Keyword arguments ``forward`` takes: its named parameters and the keys of an ``Unpack[...]`` ``**kwargs``."""
    keys: set[str] = set()
    for parameter in inspect.signature(forward).parameters.values():
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            keys.add(parameter.name)
        elif parameter.kind is parameter.VAR_KEYWORD:
            keys |= _unpacked_keys(parameter.annotation, forward)
    keys.discard("self")
    return frozenset(keys)


def _model_class(config: Any) -> type[Any]:
    """The transformers class that trains ``config``: image-text-to-text for VLMs, else causal LM."""
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"):
        name = getattr(modeling_auto, mapping, {}).get(config.model_type)
        if name is not None and hasattr(transformers, name):
            return getattr(transformers, name)
    raise ValueError(
        f"model_or_config: transformers has no causal LM or image-text-to-text model for "
        f"model_type {config.model_type!r}; pass the model itself"
    )


def _reads_text_row(model_type: str) -> bool:
    """Whether transformers' modeling module of ``model_type`` takes row 0 of ``(4, B, T)`` position_ids as the
    text positions (read from its source: the installed version decides)."""
    import importlib

    try:
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        source = inspect.getsource(module)
    except (ImportError, OSError, TypeError):
        return False
    return _TEXT_ROW_TEST.search(source) is not None


def _unwrap(model: Any) -> Any:
    """The transformers model inside a DistributedDataParallel / DataParallel or PEFT wrapper."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        else:
            return model


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _check_not_mrope_text(config: Any) -> None:
    """A text config with mRoPE sections belongs to a vision-language model: its placeholder ids are elsewhere."""
    if getattr(config, "vision_config", None) is not None or config.model_type in MROPE_MODEL_TYPES:
        return
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if isinstance(params, Mapping) and "mrope_section" in params:
            raise ValueError(
                f"model_or_config: {config.model_type!r} uses mRoPE positions; pass the whole "
                "vision-language model or its config (the placeholder ids live there)"
            )


def model_inputs(model_or_config: Any) -> ModelInputs:
    """Read what ``model_or_config`` takes from a packed batch.

    model_or_config: a transformers model (``LlamaForCausalLM``, ``Qwen2VLForConditionalGeneration``, ...; also
        inside ``DistributedDataParallel`` / ``DataParallel`` or a PEFT wrapper, read through to the model) or
        its config (``PretrainedConfig``; the model class then comes from transformers' auto mappings).

    Supported: text causal LMs (Llama, Qwen2, ...: 1-D positions), Qwen2-VL and Qwen2.5-VL (mRoPE, images and
    videos as patches with ``image_grid_thw`` / ``video_grid_thw``), InternVL (``InternVLForConditionalGeneration``;
    images and video frames as ``(n, C, H, W)`` tiles in ``pixel_values``).

    Raises:
        TypeError: neither a model nor a config.
        ValueError: a forward without ``position_ids`` (a wrapper that hides them: the boundaries would be
            lost), a vision-language model of another type, an mRoPE text model without its vision config,
            or a Qwen-VL model whose installed transformers reads no text-position row (it cannot train a
            packed row without letting the samples attend to each other).
    """
    model = _unwrap(model_or_config) if callable(getattr(model_or_config, "forward", None)) else model_or_config
    config = getattr(model, "config", None)
    forward = getattr(model, "forward", None)
    if config is not None and callable(forward):
        pass
    elif isinstance(getattr(model, "model_type", None), str) and hasattr(model, "to_dict"):
        config = model
        _check_not_mrope_text(config)
        forward = _model_class(config).forward
    else:
        raise TypeError(
            f"model_or_config must be a transformers model or its config, got {type(model_or_config).__name__}"
        )
    model_type = config.model_type
    keys = set(forward_keys(forward))
    options: dict[str, Any] = {}
    tile_token_id = tokens_per_tile = None
    vision = getattr(config, "vision_config", None)
    if "position_ids" not in keys:
        raise ValueError(
            f"model_or_config: {type(model).__name__}.forward takes no position_ids, which carry "
            "the sample boundaries of a packed row; pass the transformers model itself"
        )
    if model_type in MROPE_MODEL_TYPES:
        if vision is None:
            raise ValueError(f"{model_type}: the config has no vision_config")
        if not _reads_text_row(model_type):
            raise ValueError(
                f"{model_type}: the installed transformers text model reads no text-position row "
                "from position_ids, so it cannot train packed samples without attention between "
                "them; upgrade transformers"
            )
        options = {
            "image_token_id": int(config.image_token_id),
            "video_token_id": int(config.video_token_id),
            "spatial_merge_size": int(vision.spatial_merge_size),
            "mrope_text_row": True,
        }
        if model_type == "qwen2_5_vl":
            options["tokens_per_second"] = vision.tokens_per_second
        keys -= _VISION_TOWER_MISREADS
    elif model_type in TILE_MODEL_TYPES:
        # 1-D text positions; the vision tower gets only pixel_values. The forward declares no use_cache but
        # hands its keyword arguments on to the text model, which reads it.
        keys.add("use_cache")
        vision = config.vision_config
        (height, width), (patch_h, patch_w) = _pair(vision.image_size), _pair(vision.patch_size)
        patches = (height // patch_h) * (width // patch_w)
        tile_token_id = int(config.image_token_id)
        tokens_per_tile = int(round(patches * config.downsample_ratio**2))
    elif vision is not None:
        raise ValueError(
            f"model_or_config: model_type {model_type!r} is not supported for packing; supported "
            f"vision-language models: {', '.join(MROPE_MODEL_TYPES + TILE_MODEL_TYPES)}"
        )
    else:
        _check_not_mrope_text(config)
    constants = {"use_cache": False} if "use_cache" in keys else {}
    keys.discard("use_cache")
    return ModelInputs(
        model_type=model_type,
        options=options,
        keys=frozenset(keys),
        constants=constants,
        tile_token_id=tile_token_id,
        tokens_per_tile=tokens_per_tile,
    )
