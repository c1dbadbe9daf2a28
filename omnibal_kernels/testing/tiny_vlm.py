"""A tiny vision-language model and samples sized like the bundled data, shared by the example and the benchmarks.

Sizes follow the bundled InternVL-Chat SFT loads scaled by 1/16: a real 448 px tile (256 LLM tokens) becomes
a 16x16 px tile of 16 4x4 patches (16 LLM tokens), and the text tokens are divided by 16 as well. The model
runs a ViT over the tiles (one varlen sequence per tile), scatters the projected patches into the token
embeddings at the image placeholders and runs the causal LM of :mod:`omnibal_kernels.testing.models`, on a
packed batch (``(1, T)`` with ``cu_seqlens``) or a dense padded one (``(B, S)``).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn as nn

from ..attention import varlen_attention
from ..balance import CostModel
from ..lengths import Lengths, default_lengths
from .models import RMSNorm, TinyBlock

__all__ = ["IMAGE_TOKEN", "PATCH", "PATCHES", "SCALE", "TILE", "VOCAB", "TinyVLM", "TinyViTBlock", "make_sample",
           "scaled_lengths"]

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


class TinyVLM(nn.Module):
    """Patch embedding + ViT blocks -> projector -> image embeddings in place of IMAGE_TOKEN -> decoder
    (``omnibal_kernels.testing.TinyBlock``). Takes a packed batch (``(1, T)`` with ``cu_seqlens``) or a
    dense padded one (``(B, S)``, no ``cu_seqlens``)."""

    def __init__(self, hidden: int = 128, vit_hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.hidden, self.vit_hidden, self.layers = hidden, vit_hidden, layers
        self.patch_embed = nn.Conv2d(3, vit_hidden, kernel_size=PATCH, stride=PATCH)
        self.vit_pos = nn.Parameter(torch.zeros(PATCHES, vit_hidden))
        self.vit_blocks = nn.ModuleList(TinyViTBlock(vit_hidden, 4) for _ in range(layers))
        self.projector = nn.Sequential(nn.LayerNorm(vit_hidden), nn.Linear(vit_hidden, hidden))
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(TinyBlock(hidden, 4, 2, 2 * hidden, 10000.0) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def cost_model(self) -> CostModel:
        """This model's cost from its shapes (tiles attended alone; causal LM)."""
        vit = sum(p.numel() for p in (*self.vit_blocks.parameters(), *self.patch_embed.parameters()))
        llm = sum(p.numel() for p in (*self.blocks.parameters(), *self.lm_head.parameters()))
        return CostModel.from_shapes(vit_params=vit, vit_layers=self.layers, vit_hidden=self.vit_hidden,
                                     vit_tokens_per_unit=PATCHES, vit_units_attend_jointly=False,
                                     llm_params=llm, llm_layers=self.layers, llm_hidden=self.hidden)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                max_seqlen: Optional[int] = None, pixel_values: Optional[torch.Tensor] = None,
                **_: Any) -> torch.Tensor:
        """Logits ``(B, S, VOCAB)`` (``(1, T, VOCAB)`` packed)."""
        x = self.embed(input_ids)
        if pixel_values is not None and pixel_values.shape[0]:
            patches = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.vit_pos  # (tiles, P, C)
            h = patches.reshape(-1, patches.shape[-1])
            cu = torch.arange(pixel_values.shape[0] + 1, dtype=torch.int32) * PATCHES  # one sequence per tile
            for block in self.vit_blocks:
                h = block(h, cu)
            where = (input_ids == IMAGE_TOKEN).nonzero(as_tuple=True)  # row-major: sample, then position
            x = x.index_put(where, self.projector(h))
        for block in self.blocks:
            x = block(x, position_ids, cu_seqlens, max_seqlen, "auto")
        return self.lm_head(self.norm(x))
