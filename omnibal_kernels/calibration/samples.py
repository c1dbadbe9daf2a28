"""Real model inputs of given loads: for every sample of a ``Lengths``, the tokens and pixels a model trains on.

Timing a model on packs needs samples whose loads are exactly those the cost model reads. For a sample with
ViT load ``v``, ViT sequences ``s_j`` and LLM load ``t``:

- text models (Llama, Qwen2): ``t`` random text tokens (``v`` must be 0);
- Qwen2-VL / Qwen2.5-VL: one image per ViT sequence (a sequence is an image or a video frame group; both
  attend alone), a ``(1, h, w)`` patch grid with ``h * w = s_j`` (``h``, ``w`` multiples of the spatial
  merge, as near square as the factors allow) and random patches; in the text, a vision-start token and
  ``s_j / merge**2`` placeholders per image, the rest of the ``t`` tokens random text;
- InternVL: ``v`` random tiles of the tower's image size; ``v * tokens_per_tile`` placeholders, the rest of
  the ``t`` tokens random text.

Without ``vit_seqlens`` each sample's ViT load is one sequence (one image), as the cost model assumes. Random
text ids are drawn below the smallest special token id of the config, so they never read as placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, cast

import numpy as np

from ..lengths import Lengths

__all__ = ["SampleMaker"]

_PATCH_MODELS = ("qwen2_vl", "qwen2_5_vl")
_TILE_MODELS = ("internvl",)


def _grid(units: int, merge: int) -> tuple[int, int]:
    """``(h, w)``, multiples of ``merge``, with ``h * w = units`` and ``h <= w`` as close as the factors allow."""
    q = units // (merge * merge)
    a = int(np.floor(np.sqrt(q)))
    while q % a:
        a -= 1
    return a * merge, (q // a) * merge


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))


@dataclass(frozen=True)
class SampleMaker:
    """Makes the samples of a model type (see the module docstring); build it with :meth:`for_config`."""

    kind: str  # "text", "patches" or "tiles"
    text_high: int  # random text ids are drawn from [0, text_high)
    placeholder: Optional[int] = None  # image placeholder token id
    separator: Optional[int] = None  # the token before each image (vision start), patches only
    merge: int = 1
    patch_dim: int = 0  # channels * temporal * patch**2, patches only
    tile_shape: tuple[int, int, int] = (0, 0, 0)  # (channels, height, width), tiles only
    tokens_per_tile: int = 0

    @classmethod
    def for_config(cls, config: Any) -> SampleMaker:
        """The maker for a transformers config (Llama/Qwen2 text models, Qwen2-VL, Qwen2.5-VL, InternVL)."""
        model_type = getattr(config, "model_type", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab = int(text.vocab_size)
        ids = [
            getattr(config, k, None)
            for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        ]
        high = min([vocab, *(int(i) for i in ids if i is not None)])
        if high < 2:
            raise ValueError(f"config ({model_type}): no text token ids below its special tokens")
        vision = getattr(config, "vision_config", None)
        if model_type in _PATCH_MODELS:
            if vision is None:
                raise ValueError(f"config ({model_type}): has no vision_config")
            dim = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
            start = getattr(config, "vision_start_token_id", None)
            return cls(
                "patches",
                high,
                int(config.image_token_id),
                None if start is None else int(start),
                int(vision.spatial_merge_size),
                dim,
            )
        if model_type in _TILE_MODELS:
            from ..model_inputs import model_inputs

            if vision is None:
                raise ValueError(f"config ({model_type}): has no vision_config")
            size = vision.image_size
            height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
            per_tile = cast(int, model_inputs(config).tokens_per_tile)  # set for every tile model
            return cls(
                "tiles",
                high,
                int(config.image_token_id),
                tile_shape=(int(vision.num_channels), height, width),
                tokens_per_tile=int(per_tile),
            )
        if vision is not None:
            raise ValueError(
                f"config: vision-language model type {model_type!r} is not supported; supported: "
                f"{', '.join(_PATCH_MODELS + _TILE_MODELS)} and text models"
            )
        return cls("text", high)

    def _sequences(self, lengths: Lengths, i: int) -> list[int]:
        v = int(lengths.vit[i])
        if lengths.vit_seqlens is None:
            return [v] if v else []
        offsets = cast(np.ndarray, lengths.vit_seqlens_offsets)  # set with vit_seqlens
        a, b = offsets[i], offsets[i + 1]
        return [int(s) for s in lengths.vit_seqlens[a:b] if s]

    def sample(self, lengths: Lengths, i: int, rng: np.random.Generator) -> dict[str, Any]:
        """Sample ``i`` of ``lengths`` as model inputs (``input_ids``, ``labels``, pixels).

        Raises:
            ValueError: loads the model cannot have, naming the sample: ViT load for a text model, a Qwen-VL
                sequence that is not a multiple of ``merge**2`` patches, fewer tokens than the placeholders need.
        """
        import torch

        t, sequences = int(lengths.llm[i]), self._sequences(lengths, i)
        if self.kind == "text" and sequences:
            raise ValueError(f"sample {i}: ViT load {int(lengths.vit[i])}, but the model has no vision tower")
        image_ids: list[int] = []
        pixels: dict[str, Any] = {}
        placeholder = cast(int, self.placeholder)  # for_config sets it for every kind with images
        if self.kind == "patches" and sequences:
            unit = self.merge * self.merge
            if any(s % unit for s in sequences):
                raise ValueError(
                    f"sample {i}: ViT sequences {sequences} are not all multiples of merge**2 = {unit} patches"
                )
            grids = [(1, *_grid(s, self.merge)) for s in sequences]
            for s in sequences:
                sep = self.separator if self.separator is not None else int(rng.integers(0, self.text_high))
                image_ids += [sep] + [placeholder] * (s // unit)
            pixels = {
                "pixel_values": _normal(rng, (sum(sequences), self.patch_dim)),
                "image_grid_thw": torch.tensor(grids, dtype=torch.int64),
            }
        elif self.kind == "tiles" and sequences:
            tiles = int(lengths.vit[i])
            image_ids = [placeholder] * (tiles * self.tokens_per_tile)
            pixels = {"pixel_values": _normal(rng, (tiles, *self.tile_shape))}
        filler = t - len(image_ids)
        if filler < 0 or t == 0:
            raise ValueError(
                f"sample {i}: LLM load {t} is less than its {len(image_ids)} image tokens (placeholders "
                f"and one vision-start token per image), or 0"
            )
        ids = torch.tensor(rng.integers(0, self.text_high, filler).tolist() + image_ids, dtype=torch.int64)
        labels = ids.clone()
        if image_ids:
            labels[filler:] = -100
        return {"input_ids": ids, "labels": labels, **pixels}

    def samples(self, lengths: Lengths, ids: Any, seed: int = 0) -> list[dict[str, Any]]:
        """The samples ``ids`` of ``lengths`` (:meth:`sample`), pixels and text drawn from ``seed``."""
        rng = np.random.default_rng(seed)
        return [self.sample(lengths, int(i), rng) for i in np.asarray(ids).reshape(-1)]
