"""A tiny vision-language model written as a chain of layers, for pipeline examples and tests on the CPU.

``embed`` (patch embedding + text token embedding) -> ``vit_0..`` (ViT blocks, attention within each tile)
-> ``projector`` (vision MLP; the text embeddings go up to the LLM width, a factorized embedding) ->
``llm_0..`` (pre-norm causal blocks with a gated MLP) -> ``head`` (norm + vocabulary projection of the text
positions). Every layer passes one tensor ``(batch, vision_tokens + text_tokens, width)`` to the next, so any
contiguous split is a valid pipeline stage. The ViT and LLM have different widths and depths, so their layers
differ in time and memory, as in a real VLM. Attention in the LLM spans the whole micro-batch (no per-sample
mask): the model exists to exercise pipelines, not packing.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .chain import Chain

__all__ = ["TinyVLMConfig", "build_tiny_vlm", "tiny_vlm_kinds"]


@dataclass(frozen=True)
class TinyVLMConfig:
    """Shapes of the tiny VLM; ``vision_tokens`` and ``text_tokens`` are fixed per micro-batch (padded)."""

    vit_layers: int = 6
    vit_width: int = 96
    vit_heads: int = 4
    patch_dim: int = 48
    patches_per_tile: int = 16
    vision_tokens: int = 256
    llm_layers: int = 4
    llm_width: int = 128
    llm_heads: int = 4
    text_tokens: int = 128
    vocab: int = 512


class _Embed(nn.Module):
    def __init__(self, c: TinyVLMConfig) -> None:
        super().__init__()
        self.patch = nn.Linear(c.patch_dim, c.vit_width)
        self.position = nn.Parameter(torch.randn(c.patches_per_tile, c.vit_width) * 0.02)
        self.tokens = nn.Embedding(c.vocab, c.vit_width)
        self.c = c

    def forward(self, patches: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        b, nv, _ = patches.shape
        v = self.patch(patches).view(b, nv // self.c.patches_per_tile, self.c.patches_per_tile, -1) + self.position
        return torch.cat([v.view(b, nv, -1), self.tokens(ids)], dim=1)


class _ViTBlock(nn.Module):
    def __init__(self, c: TinyVLMConfig) -> None:
        super().__init__()
        d = c.vit_width
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        v, text = x[:, :c.vision_tokens], x[:, c.vision_tokens:]
        b, nv, d = v.shape
        tiles = v.reshape(b * nv // c.patches_per_tile, c.patches_per_tile, d)
        q, k, w = self.qkv(self.norm1(tiles)).view(tiles.shape[0], c.patches_per_tile, 3, c.vit_heads, -1).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), w.transpose(1, 2))
        tiles = tiles + self.out(att.transpose(1, 2).reshape(tiles.shape))
        tiles = tiles + self.fc2(F.gelu(self.fc1(self.norm2(tiles))))
        return torch.cat([tiles.reshape(b, nv, d), text], dim=1)


class _Projector(nn.Module):
    def __init__(self, c: TinyVLMConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(c.vit_width)
        self.fc1, self.fc2 = nn.Linear(c.vit_width, c.llm_width), nn.Linear(c.llm_width, c.llm_width)
        self.text = nn.Linear(c.vit_width, c.llm_width, bias=False)
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, text = x[:, :self.c.vision_tokens], x[:, self.c.vision_tokens:]
        return torch.cat([self.fc2(F.gelu(self.fc1(self.norm(v)))), self.text(text)], dim=1)


class _LLMBlock(nn.Module):
    def __init__(self, c: TinyVLMConfig) -> None:
        super().__init__()
        d = c.llm_width
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_up, self.down = nn.Linear(d, 6 * d, bias=False), nn.Linear(3 * d, d, bias=False)
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.c.llm_heads, -1).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, n, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class _Head(nn.Module):
    def __init__(self, c: TinyVLMConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(c.llm_width)
        self.proj = nn.Linear(c.llm_width, c.vocab, bias=False)
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x[:, self.c.vision_tokens:]))


def build_tiny_vlm(config: TinyVLMConfig = TinyVLMConfig(), seed: int = 0) -> Chain:
    """The chain as a ``Chain`` (an ``nn.Sequential``) with named layers (``embed``, ``vit_i``, ``projector``, ``llm_i``,
    ``head``); layer 0 takes ``(patches (B, vision_tokens, patch_dim), ids (B, text_tokens))``, the head returns
    logits ``(B, text_tokens, vocab)``. Weights are a pure function of ``seed``."""
    if config.vision_tokens % config.patches_per_tile:
        raise ValueError(f"vision_tokens ({config.vision_tokens}) must be a multiple of patches_per_tile "
                         f"({config.patches_per_tile})")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[tuple[str, nn.Module]] = [("embed", _Embed(config))]
        layers += [(f"vit_{i}", _ViTBlock(config)) for i in range(config.vit_layers)]
        layers += [("projector", _Projector(config))]
        layers += [(f"llm_{i}", _LLMBlock(config)) for i in range(config.llm_layers)]
        layers += [("head", _Head(config))]
        return Chain(OrderedDict(layers))
    finally:
        torch.random.set_rng_state(gen_state)


def tiny_vlm_kinds(model: nn.Sequential) -> list[str]:
    """The kind of each layer (``"vit"``, ``"projector"``, ``"llm"``, ``"head"``) from its name."""
    kinds = []
    for name, _ in model.named_children():
        kinds.append("vit" if name == "embed" or name.startswith("vit_") else
                     "llm" if name.startswith("llm_") else name)
    return kinds
