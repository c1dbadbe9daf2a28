"""The parallel layout and the machine a whole-run comparison assumes: ``Layout`` and ``Hardware``.

``gpus = data-parallel x pipeline x tensor-parallel`` ranks; each pipeline (one data-parallel rank) trains
``micro_batches`` micro-batches per optimizer step under ``schedule``, and every GPU has ``memory_gb`` GiB.
``Hardware`` holds what the simulation turns FLOPs and bytes into time and memory with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .._checks import check_positive_int
from ..pipeline.schedule import SCHEDULES, check_micro_batches

__all__ = ["Hardware", "Layout"]

_GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """A parallel layout. Checked when built: a ``ValueError`` names the setting that is wrong.

    Attributes:
        gpus: all ranks; a multiple of ``pp * tp``.
        pp: pipeline stages (one per rank; at most the model's layers, checked where the model is known).
        tp: tensor-parallel ranks per stage (with sequence parallelism: every layer's FLOPs, parameters and
            activations split ``tp`` ways).
        micro_batches: micro-batches per pipeline and optimizer step.
        memory_gb: GiB per GPU (parameters, gradients, optimizer state and activations).
        schedule: the pipeline schedule, ``"1f1b"`` (Megatron's and DeepSpeed's) or ``"gpipe"``.
    """

    gpus: int
    pp: int
    tp: int = 1
    micro_batches: int = 32
    memory_gb: float = 80.0
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        for name in ("gpus", "pp", "tp"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        object.__setattr__(self, "micro_batches", check_micro_batches(self.micro_batches))
        if self.gpus % (self.pp * self.tp):
            raise ValueError(
                f"gpus ({self.gpus}) must be a multiple of pp x tp ({self.pp} x {self.tp} = {self.pp * self.tp})"
            )
        memory = self.memory_gb
        if isinstance(memory, bool) or not isinstance(memory, (int, float)):
            raise TypeError(f"memory_gb must be a number of GiB, got {type(memory).__name__}")
        if not (math.isfinite(memory) and memory > 0):
            raise ValueError(f"memory_gb must be a positive number of GiB, got {memory}")
        if self.schedule not in ("1f1b", "gpipe"):
            others = ", ".join(s for s in SCHEDULES if s not in ("1f1b", "gpipe"))
            raise ValueError(
                f"schedule must be '1f1b' or 'gpipe' (one stage per rank), got {self.schedule!r} ({others} "
                "take several stages per rank: use pipeline.partition for them)"
            )

    @property
    def dp(self) -> int:
        """Data-parallel ranks (pipelines)."""
        return self.gpus // (self.pp * self.tp)

    @property
    def memory_bytes(self) -> float:
        return float(self.memory_gb) * _GIB

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "pp": self.pp,
            "tp": self.tp,
            "dp": self.dp,
            "micro_batches": self.micro_batches,
            "memory_gb": self.memory_gb,
            "schedule": self.schedule,
        }


@dataclass(frozen=True)
class Hardware:
    """What one GPU does: ``tflops`` peak (16-bit) at ``efficiency``, ``link_gb_per_s`` between pipeline
    stages, ``dtype_bytes`` per activation element, and ``static_bytes_per_param`` (parameters, gradients and
    optimizer state; ``None``: 16-bit weights and gradients plus fp32 master weights and two Adam moments
    sharded over the data-parallel ranks, ``4 + 12 / dp``, Megatron's distributed optimizer).

    The defaults are an A100 (312 TFLOP/s bf16) at half of peak and a 25 GB/s link, the paper's GPU.
    """

    tflops: float = 312.0
    efficiency: float = 0.5
    link_gb_per_s: float = 25.0
    dtype_bytes: int = 2
    static_bytes_per_param: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("tflops", "efficiency", "link_gb_per_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.tflops > 0 or not 0 < self.efficiency <= 1 or self.link_gb_per_s < 0:
            raise ValueError(
                f"tflops must be > 0, efficiency in (0, 1] and link_gb_per_s >= 0, got {self.tflops}, "
                f"{self.efficiency}, {self.link_gb_per_s}"
            )
        check_positive_int("dtype_bytes", self.dtype_bytes)
        if self.static_bytes_per_param is not None and not self.static_bytes_per_param > 0:
            raise ValueError(f"static_bytes_per_param must be > 0, got {self.static_bytes_per_param}")

    def static_bytes(self, dp: int) -> float:
        """Parameter, gradient and optimizer bytes per parameter with ``dp`` data-parallel ranks."""
        return self.static_bytes_per_param if self.static_bytes_per_param is not None else 4.0 + 12.0 / dp
