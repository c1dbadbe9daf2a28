"""Cost model: how long a sample takes to train, from its ViT and LLM loads.

``cost = vit_linear * v + vit_quadratic * v**2 + llm_linear * t + llm_quadratic * t**2`` per sample, summed
over a pack. Linear terms are the weight matmuls (2 FLOPs per parameter per token); quadratic terms are
attention scores and their weighted sum, which grow with the square of a sequence's length. Balancing packs
by this cost, not only by token counts, equalizes step time when sequence lengths differ.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["CostModel"]

# Training = forward + backward, the backward costing about twice the forward.
_TRAIN_FACTOR = 3.0
_GIGA = 1e9


@dataclass(frozen=True)
class CostModel:
    """Per-sample training cost, in GFLOP, as linear and quadratic terms of the two loads.

    The default, ``CostModel.internvl_7b()``, is an InternVL-Chat-like model: InternViT-300M on 448x448
    tiles (1,025 tokens each, attended within the tile, so the ViT cost is linear in tiles) and a 7B LLM
    (32 layers, hidden 4096, causal attention over each sample's tokens).
    """

    vit_linear: float
    vit_quadratic: float
    llm_linear: float
    llm_quadratic: float

    @classmethod
    def from_shapes(
        cls,
        *,
        vit_params: float,
        vit_layers: int,
        vit_hidden: int,
        vit_tokens_per_unit: int,
        vit_units_attend_jointly: bool,
        llm_params: float,
        llm_layers: int,
        llm_hidden: int,
    ) -> "CostModel":
        """Builds the cost terms from model shapes.

        Args:
            vit_params, vit_layers, vit_hidden: size of the vision encoder.
            vit_tokens_per_unit: ViT tokens per unit of ViT load (1,025 per InternVL tile, 1 per patch).
            vit_units_attend_jointly: True when all of a sample's units form one attention sequence (patch
                based ViTs such as Qwen2-VL's); False when each unit is attended alone (InternVL tiles).
            llm_params, llm_layers, llm_hidden: size of the language model (causal attention).
        """
        s = float(vit_tokens_per_unit)
        vit_matmul = 2.0 * vit_params * s
        # QK^T and AV: 2 matmuls x 2 FLOPs per multiply-add x s^2 x hidden, per layer (bidirectional).
        vit_attention = 4.0 * s * s * vit_hidden * vit_layers
        if vit_units_attend_jointly:
            vit_lin, vit_quad = vit_matmul, vit_attention
        else:
            vit_lin, vit_quad = vit_matmul + vit_attention, 0.0
        llm_lin = 2.0 * llm_params
        # Causal attention: half of the s^2 scores, so 2 * t^2 * hidden per layer.
        llm_quad = 2.0 * llm_hidden * llm_layers
        f = _TRAIN_FACTOR / _GIGA
        return cls(vit_lin * f, vit_quad * f, llm_lin * f, llm_quad * f)

    @classmethod
    def internvl_7b(cls) -> "CostModel":
        """InternViT-300M (24 layers, hidden 1024, 448px tiles) + a 7B LLM (32 layers, hidden 4096)."""
        return cls.from_shapes(
            vit_params=0.3e9,
            vit_layers=24,
            vit_hidden=1024,
            vit_tokens_per_unit=1025,
            vit_units_attend_jointly=False,
            llm_params=7.0e9,
            llm_layers=32,
            llm_hidden=4096,
        )

    @classmethod
    def tokens_only(cls) -> "CostModel":
        """Cost = LLM tokens (no ViT, no attention term)."""
        return cls(0.0, 0.0, 1.0, 0.0)

    def terms(self) -> list[float]:
        """``[vit_linear, vit_quadratic, llm_linear, llm_quadratic]``."""
        return [float(self.vit_linear), float(self.vit_quadratic), float(self.llm_linear), float(self.llm_quadratic)]

    def sample_costs(self, vit: np.ndarray, llm: np.ndarray) -> np.ndarray:
        """(N,) float64 cost of every sample."""
        v = np.asarray(vit, dtype=np.float64)
        t = np.asarray(llm, dtype=np.float64)
        return self.vit_linear * v + self.vit_quadratic * v * v + self.llm_linear * t + self.llm_quadratic * t * t

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
