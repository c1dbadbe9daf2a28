"""A tiny vision-language model and samples sized like the bundled data, for the examples, the benchmarks and
the pipeline tests.

Sizes follow the bundled InternVL-Chat SFT loads scaled by 1/16: a real 448 px tile (256 LLM tokens) becomes
a 16x16 px tile of 16 4x4 patches (16 LLM tokens), and the text tokens are divided by 16 as well. The model
runs a ViT over the tiles (one varlen sequence per tile), scatters the projected patches into the token
embeddings at the image placeholders and runs the causal LM of :mod:`omnibal_kernels.testing.models`, on a
packed batch (``(1, T)`` with ``cu_seqlens``) or a dense padded one (``(B, S)``).

:meth:`TinyVLM.as_chain` is the same model (the same parameters) as a chain of layers for pipeline stages:
``vit_embed`` -> ``vit_0..`` -> ``projector`` -> ``llm_0..`` -> ``head``, every layer passing float tensors only
(pipeline stages send and infer shapes of those), on dense batches with positions ``0..S-1``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional, cast

import numpy as np
import torch
import torch.nn as nn

from ..attention import varlen_attention
from ..balance import CostModel
from ..lengths import Lengths, default_lengths
from ..pipeline.chain import Chain
from .models import RMSNorm, TinyBlock

__all__ = [
    "IMAGE_TOKEN",
    "PATCH",
    "PATCHES",
    "SCALE",
    "TILE",
    "VOCAB",
    "TinyVLM",
    "TinyViTBlock",
    "chain_kinds",
    "dense_micro_batch",
    "make_sample",
    "pipeline_example",
    "scaled_lengths",
]

TILE, PATCH = 16, 4  # tile side and patch side in pixels
PATCHES = (TILE // PATCH) ** 2  # patches (and LLM tokens) per tile
SCALE = 16  # a real tile is 256 LLM tokens, here PATCHES = 256 / SCALE
VOCAB = 128
IMAGE_TOKEN = VOCAB - 1  # placeholder id where image embeddings go


def scaled_lengths(num_samples: int, seed: int) -> Lengths:
    """``num_samples`` bundled samples (seeded draw) scaled by 1/16: ``vit`` tiles, ``llm`` tokens, and the
    ``label`` tokens of :func:`make_sample` (its text tokens after the first position)."""
    real = default_lengths()
    pick = np.sort(np.random.default_rng(seed).choice(len(real), num_samples, replace=False))
    tiles = real.vit[pick]
    text = np.ceil(np.maximum(real.llm[pick] - 256 * tiles, 0) / SCALE).astype(np.int64) + 1
    return Lengths(tiles, tiles * PATCHES + text, label=text - (tiles == 0))


def make_sample(lengths: Lengths, i: int, seed: int) -> dict[str, torch.Tensor]:
    """Sample ``i``: random tiles and tokens of its sizes, image placeholders first, no loss on them."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + i)
    tiles, tokens = int(lengths.vit[i]), int(lengths.llm[i])
    text = torch.randint(0, VOCAB - 1, (tokens - tiles * PATCHES,), generator=g)
    input_ids = torch.cat([torch.full((tiles * PATCHES,), IMAGE_TOKEN), text])
    labels = input_ids.clone()
    labels[: tiles * PATCHES] = -100
    return {"input_ids": input_ids, "labels": labels, "pixel_values": torch.randn(tiles, 3, TILE, TILE, generator=g)}


class TinyViTBlock(nn.Module):
    """Pre-norm bidirectional attention + MLP over packed patches; each tile attends only to itself."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        # x: (total_patches, hidden)
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.head_dim).unbind(1)
        x = x + self.proj(varlen_attention(q, k, v, cu_seqlens, PATCHES, causal=False).flatten(1))
        return x + self.mlp(self.norm2(x))


def chain_kinds(chain: nn.Module) -> list[str]:
    """The kind of each layer of :meth:`TinyVLM.as_chain` (``"vit"``, ``"projector"``, ``"llm"``, ``"head"``)."""
    return [name.split("_")[0] for name, _ in chain.named_children()]


class TinyVLM(nn.Module):
    """Patch embedding + ViT blocks -> projector -> image embeddings in place of IMAGE_TOKEN -> decoder
    (``omnibal_kernels.testing.TinyBlock``). Takes a packed batch (``(1, T)`` with ``cu_seqlens``) or a
    dense padded one (``(B, S)``, no ``cu_seqlens``)."""

    def __init__(
        self,
        hidden: int = 128,
        vit_hidden: int = 64,
        layers: int = 2,
        *,
        vit_layers: Optional[int] = None,
        llm_layers: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.vit_layers = layers if vit_layers is None else vit_layers
        self.llm_layers = layers if llm_layers is None else llm_layers
        self.hidden, self.vit_hidden, self.layers = hidden, vit_hidden, layers
        self.patch_embed = nn.Conv2d(3, vit_hidden, kernel_size=PATCH, stride=PATCH)
        self.vit_pos = nn.Parameter(torch.zeros(PATCHES, vit_hidden))
        self.vit_blocks = nn.ModuleList(TinyViTBlock(vit_hidden, 4) for _ in range(self.vit_layers))
        self.projector = nn.Sequential(nn.LayerNorm(vit_hidden), nn.Linear(vit_hidden, hidden))
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(TinyBlock(hidden, 4, 2, 2 * hidden, 10000.0) for _ in range(self.llm_layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def cost_model(self) -> CostModel:
        """This model's cost from its shapes (tiles attended alone; causal LM)."""
        vit = sum(p.numel() for p in (*self.vit_blocks.parameters(), *self.patch_embed.parameters()))
        llm = sum(p.numel() for p in (*self.blocks.parameters(), *self.lm_head.parameters()))
        return CostModel.from_shapes(
            vit_params=vit,
            vit_layers=self.vit_layers,
            vit_hidden=self.vit_hidden,
            vit_tokens_per_unit=PATCHES,
            vit_units_attend_jointly=False,
            llm_params=llm,
            llm_layers=self.llm_layers,
            llm_hidden=self.hidden,
        )

    def as_chain(self) -> Chain:
        """This model as a :class:`~omnibal_kernels.pipeline.chain.Chain` of named layers sharing its parameters.

        Layer 0 takes ``(input_ids (B, S), pixel_values (tiles, 3, TILE, TILE))`` (at least one tile), the last
        returns the logits ``(B, S, VOCAB)`` that ``forward`` gives for the same batch with positions ``0..S-1``
        and no ``cu_seqlens``. The ViT layers pass ``(patches, token ids as floats)``, the LLM layers the hidden
        states; the ids are copied on, so each layer's output is its own storage."""
        layers: list[tuple[str, nn.Module]] = [("vit_embed", _VisionEmbed(self))]
        layers += [(f"vit_{i}", _ViTLayer(cast(TinyViTBlock, block))) for i, block in enumerate(self.vit_blocks)]
        layers += [("projector", _Merge(self))]
        layers += [(f"llm_{i}", _LLMLayer(cast(TinyBlock, block))) for i, block in enumerate(self.blocks)]
        layers += [("head", _Head(self))]
        return Chain(OrderedDict(layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        pixel_values: Optional[torch.Tensor] = None,
        **_: Any,
    ) -> torch.Tensor:
        """Logits ``(B, S, VOCAB)`` (``(1, T, VOCAB)`` packed)."""
        x = self.embed(input_ids)
        if pixel_values is not None and pixel_values.shape[0]:
            patches = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.vit_pos  # (tiles, P, C)
            h = patches.reshape(-1, patches.shape[-1])
            cu = _tile_cu(h.shape[0], h.device)  # one sequence per tile
            for block in self.vit_blocks:
                h = block(h, cu)
            where = (input_ids == IMAGE_TOKEN).nonzero(as_tuple=True)  # row-major: sample, then position
            x = x.index_put(where, self.projector(h).to(x.dtype))  # autocast: the embeddings stay float32
        for block in self.blocks:
            x = block(x, position_ids, cu_seqlens, max_seqlen, "auto")
        return self.lm_head(self.norm(x))


def _tile_cu(rows: int, device: torch.device) -> torch.Tensor:
    return torch.arange(rows // PATCHES + 1, dtype=torch.int32, device=device) * PATCHES


class _VisionEmbed(nn.Module):
    """Patch embedding of the tiles; the token ids travel with the patches as floats (exact below 2**24), so
    that a stage boundary anywhere in the ViT sends float tensors only."""

    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.patch_embed, self.vit_pos = model.patch_embed, model.vit_pos

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        patches = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.vit_pos
        return patches.reshape(-1, patches.shape[-1]), input_ids.to(patches.dtype)


class _ViTLayer(nn.Module):
    def __init__(self, block: TinyViTBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.block(h, _tile_cu(h.shape[0], h.device)), ids.clone()


class _Merge(nn.Module):
    """The projector and the token embedding; the projected patches replace the embeddings of the image
    placeholders."""

    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.projector, self.embed = model.projector, model.embed

    def forward(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        input_ids = ids.long()
        x = self.embed(input_ids)
        return x.index_put((input_ids == IMAGE_TOKEN).nonzero(as_tuple=True), self.projector(h).to(x.dtype))


class _LLMLayer(nn.Module):
    def __init__(self, block: TinyBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return self.block(x, positions, None, None, "auto")


class _Head(nn.Module):
    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.norm, self.lm_head = model.norm, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def dense_micro_batch(samples: list[dict[str, torch.Tensor]], tokens: int, tiles: int) -> dict[str, torch.Tensor]:
    """One pack of samples (:func:`make_sample`) as a fixed-shape micro-batch for pipeline stages: one row of
    ``tokens`` tokens (the samples one after another), ``tiles`` tiles (the samples' own, then blank ones whose
    placeholders sit in the padding), labels -100 on placeholders and padding. Returns ``input_ids (1, tokens)``,
    ``labels (1, tokens)``, ``pixel_values (tiles, 3, TILE, TILE)``."""
    ids = torch.cat([s["input_ids"] for s in samples])
    labels = torch.cat([s["labels"] for s in samples])
    pixels = torch.cat([s["pixel_values"] for s in samples])
    spare = tiles - pixels.shape[0]
    pad = tokens - ids.numel() - spare * PATCHES
    if spare < 0 or pad < 0:
        raise ValueError(
            f"samples: {pixels.shape[0]} tiles and {ids.numel()} tokens do not fit {tiles} tiles and {tokens} tokens"
        )
    ids = torch.cat([ids, torch.full((spare * PATCHES,), IMAGE_TOKEN), torch.zeros(pad, dtype=ids.dtype)])
    labels = torch.cat([labels, torch.full((spare * PATCHES + pad,), -100)])
    pixels = torch.cat([pixels, torch.zeros(spare, 3, TILE, TILE)])
    return {"input_ids": ids[None], "labels": labels[None], "pixel_values": pixels}


def pipeline_example() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], list[str]]:
    """``(layers, inputs, kinds)`` for ``omnibal-kernels profile --model tiny-vlm``: the chain of a TinyVLM
    (6 ViT layers of width 64, 4 LLM layers of width 128) on one micro-batch of bundled-like samples."""
    torch.manual_seed(0)
    chain = TinyVLM(hidden=128, vit_hidden=64, vit_layers=6, llm_layers=4).as_chain()
    lengths = scaled_lengths(4, seed=0)
    batch = dense_micro_batch(
        [make_sample(lengths, i, 0) for i in range(4)],
        tokens=int(lengths.llm.sum()) + 16 * PATCHES,
        tiles=int(lengths.vit.sum()) + 16,
    )
    return chain, (batch["input_ids"], batch["pixel_values"]), chain_kinds(chain)
