"""Helpers every Triton launcher of ``ops/`` uses: output allocation and the device check before a launch."""

from __future__ import annotations

import torch
import triton


@triton.jit
def _probe_kernel():
    pass


def interpreted() -> bool:
    """True when triton was loaded with ``TRITON_INTERPRET=1`` (kernels then run on CPU tensors)."""
    return not isinstance(_probe_kernel, triton.runtime.JITFunction)


def check_launchable(x: torch.Tensor, fn: str) -> None:
    """``x`` is where a Triton kernel can run: a CUDA tensor, or a CPU tensor under the interpreter."""
    if x.device.type == "cuda" or (x.device.type == "cpu" and interpreted()):
        return
    raise ValueError(
        f"{fn}: the Triton kernel needs a CUDA tensor (CPU tensors only under TRITON_INTERPRET=1), "
        f"got a tensor on {x.device}"
    )


def alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every output buffer of a launcher comes from here (tests poison it to catch unwritten elements)."""
    return torch.empty(shape, dtype=dtype, device=device)
