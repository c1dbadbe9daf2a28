"""``Chain``: an ``nn.Sequential`` whose first layer may take several inputs and whose layers may pass tuples
(a tuple output becomes the next layer's positional arguments), the calling convention of pipeline stages."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["Chain"]


class Chain(nn.Sequential):
    """Runs its layers in order: ``layer_0(*inputs)``, then each on the previous output (unpacked if a tuple)."""

    def forward(self, *inputs: Any) -> Any:
        x: Any = inputs
        for layer in self:
            x = layer(*x) if isinstance(x, tuple) else layer(x)
        return x
