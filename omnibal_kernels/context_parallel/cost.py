"""The predicted time of every rank of a context-parallel group: linear work, attention tiles, K/V exchange.

``time[r] = token * tokens[r] + pair * pairs[r] + kv_token * kv_received[r]``

``tokens`` are the tokens rank ``r`` holds (padding included: it is computed), ``pairs`` the causal query-key
pairs its attention kernel computes in ``tile`` x ``tile`` blocks (:func:`~.layout.tiled_pairs`), and
``kv_received`` the K/V rows it gets from the other ranks (their gradients go back the same way in the
backward pass). The group's step takes as long as its slowest rank. The exchange is counted on the critical
path, not overlapped with compute, which is what an exchange before each layer's attention costs.

Vision-language packs add each rank's ViT work: the images (video frame groups, tiles) it encodes, each
``vit_linear * load + vit_quadratic * s**2`` (``load`` its ViT rows, ``s`` the rows that attend together:
:mod:`.vision`), independently of the tokens it holds.

The time unit is GFLOP of training work, the unit of the named cost models of
:class:`~omnibal_kernels.CostModel`, so the two can be summed; :meth:`ContextParallelCost.from_cost_model` takes
the LLM terms of any ``CostModel`` (a fitted one in seconds included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_finite_non_negative, check_positive_int
from .._flops import GIGA, TRAIN_FACTOR
from .layout import Layout

__all__ = ["ContextParallelCost", "RankTimes", "layout_times"]


@dataclass(frozen=True)
class ContextParallelCost:
    """Cost terms of a CP rank's work, in GFLOP of training (forward and backward) per unit.

    Attributes:
        token: per token held (the weight matmuls of every layer).
        pair: per causal query-key pair computed by attention (every layer).
        kv_token: per K/V row received from another rank (every layer, the gradients' way back included),
            as the GFLOP the GPU could have done in the time the transfer takes.
        tile: side of the attention kernel's blocks of queries and keys (128 for flash-attention's forward
            kernels on current GPUs); ``1`` counts exact pairs.
        vit_linear: per ViT row encoded (a patch of a patch model such as Qwen2-VL, a tile of a tile model
            such as InternVL: the unit of :class:`~omnibal_kernels.CostModel`'s ViT load).
        vit_quadratic: per ``s**2`` of every ViT sequence of ``s`` rows (an image's frame group); 0 for tile
            models, whose tiles all attend alone at one size. With both ViT terms 0 the images are divided by
            their rows.

    The default, :meth:`llama3_8b`, is an 8B Llama-3-shaped model in bfloat16 with a 675M-parameter ViT of 32
    layers of width 1280 (Qwen2-VL's) on a GPU that sustains 400 TFLOP/s and exchanges 100 GB/s per rank;
    these are assumptions of the model, not measurements.
    """

    token: float
    pair: float
    kv_token: float
    tile: int = 128
    vit_linear: float = 0.0
    vit_quadratic: float = 0.0

    def __post_init__(self) -> None:
        for name in ("token", "pair", "kv_token", "vit_linear", "vit_quadratic"):
            object.__setattr__(self, name, check_finite_non_negative(name, getattr(self, name), "ContextParallelCost"))
        object.__setattr__(self, "tile", check_positive_int("tile", self.tile))

    @classmethod
    def from_shapes(
        cls,
        *,
        params: float,
        layers: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        dtype_bytes: int = 2,
        flops_per_second: float = 4e14,
        exchange_bytes_per_second: float = 1e11,
        tile: int = 128,
        vit_params: float = 0.0,
        vit_layers: int = 0,
        vit_hidden: int = 0,
    ) -> ContextParallelCost:
        """The terms of a decoder-only LLM (and of its ViT, for vision-language models).

        Args:
            params: parameters (2 FLOPs per parameter per token forward).
            layers, heads, kv_heads, head_dim: attention shape (``kv_heads < heads``: grouped-query attention).
            dtype_bytes: bytes per K/V element exchanged.
            flops_per_second: the training throughput a rank sustains, converting transfer time to GFLOP.
            exchange_bytes_per_second: bytes per second a rank receives in the K/V exchange.
            tile: attention kernel block side.
            vit_params, vit_layers, vit_hidden: the ViT of a patch model (0: no ViT terms); every patch of a
                ViT sequence attends to every other (``s**2`` pairs).
        """
        token = 2.0 * params * TRAIN_FACTOR / GIGA
        vit_linear = 2.0 * vit_params * TRAIN_FACTOR / GIGA
        vit_quadratic = 4.0 * vit_hidden * vit_layers * TRAIN_FACTOR / GIGA
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add x heads * head_dim per pair and layer
        pair = 4.0 * heads * head_dim * layers * TRAIN_FACTOR / GIGA
        # K and V forward, their gradients backward
        kv_bytes = 2.0 * (2 * kv_heads * head_dim * dtype_bytes * layers)
        kv_token = kv_bytes / exchange_bytes_per_second * flops_per_second / GIGA
        return cls(token, pair, kv_token, tile, vit_linear, vit_quadratic)

    @classmethod
    def llama3_8b(cls) -> ContextParallelCost:
        """8B parameters, 32 layers, 32 query heads, 8 K/V heads of 128 (bfloat16), 400 TFLOP/s, 100 GB/s; a
        675M-parameter ViT of 32 layers of width 1280."""
        return cls.from_shapes(
            params=8.0e9,
            layers=32,
            heads=32,
            kv_heads=8,
            head_dim=128,
            vit_params=6.75e8,
            vit_layers=32,
            vit_hidden=1280,
        )

    @classmethod
    def from_cost_model(cls, cost_model: Any, *, kv_token: float, tile: int = 128) -> ContextParallelCost:
        """The LLM terms of a :class:`~omnibal_kernels.CostModel` (``llm_linear`` per token; ``llm_quadratic``
        per ``t**2``, i.e. per half a causal pair) and its ViT terms, with the exchange term ``kv_token`` given
        in the cost model's unit (GFLOP for the named models, seconds for a fitted one). Its fixed overheads
        (``per_sample``, ``per_pack``) are not a CP rank's work and are left out."""
        return cls(
            float(cost_model.llm_linear),
            2.0 * float(cost_model.llm_quadratic),
            kv_token,
            tile,
            float(cost_model.vit_linear),
            float(cost_model.vit_quadratic),
        )

    @classmethod
    def tokens_only(cls) -> ContextParallelCost:
        """Time = tokens held (no attention, no exchange); ViT time = rows encoded."""
        return cls(1.0, 0.0, 0.0, 1, 1.0, 0.0)


@dataclass(frozen=True)
class RankTimes:
    """The predicted work of every rank of a CP group for one batch.

    Attributes:
        strategy: the strategy of the layout (``"auto"`` resolved to the one it chose).
        times: ``(P,)`` float64 predicted time per rank (unit of :class:`ContextParallelCost`).
        tokens: ``(P,)`` int64 tokens held, padding included.
        pairs: ``(P,)`` float64 query-key pairs computed, in kernel tiles.
        exact_pairs: ``(P,)`` float64 causal pairs without tile rounding.
        kv_received: ``(P,)`` int64 K/V rows received from other ranks.
        padding: tokens added to the batch (Megatron padding), over all ranks.
    """

    strategy: str
    times: np.ndarray
    tokens: np.ndarray
    pairs: np.ndarray
    exact_pairs: np.ndarray
    kv_received: np.ndarray
    padding: int

    @property
    def step_time(self) -> float:
        """The slowest rank's time: the group's step."""
        return float(self.times.max()) if self.times.size else 0.0

    @property
    def imbalance(self) -> float:
        """Slowest rank over the mean rank (1.0 is perfect balance; 1.0 for an empty batch)."""
        mean = float(self.times.mean()) if self.times.size else 0.0
        return self.step_time / mean if mean > 0 else 1.0

    @property
    def kv_exchanged(self) -> int:
        """K/V rows received over the group."""
        return int(self.kv_received.sum())

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (lists for the per-rank arrays)."""
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "padding": self.padding,
            "step_time": self.step_time,
            "imbalance": self.imbalance,
            "kv_exchanged": self.kv_exchanged,
        }
        for name in ("times", "tokens", "pairs", "exact_pairs", "kv_received"):
            out[name] = getattr(self, name).tolist()
        return out


def layout_times(layout: Layout, cost: ContextParallelCost) -> RankTimes:
    """The predicted per-rank work of ``layout`` under ``cost``."""
    tokens = layout.rank_tokens()
    pairs = layout.rank_pairs(cost.tile)
    exact = pairs if cost.tile == 1 else layout.rank_pairs(1)
    received = layout.kv_received()
    times = cost.token * tokens + cost.pair * pairs + cost.kv_token * received
    return RankTimes(layout.strategy, times, tokens, pairs, exact, received, layout.padding)
