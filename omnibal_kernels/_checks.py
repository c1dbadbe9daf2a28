"""Argument checks shared by every module, with one convention.

A wrong type raises ``TypeError``, a wrong value ``ValueError`` (or an exported subclass such as
``OversizeError``); every message names the argument, file or sample and says what was expected. Checks take
``(name, value)`` in that order. Nothing here imports torch, triton or numba at import time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+; only the checker reads it

    import torch

__all__ = [
    "BACKENDS",
    "MAX_EPOCH",
    "MAX_IMAGE_SIDE",
    "QWEN2VL_MAX_RATIO",
    "as_int_array",
    "backends",
    "check_backend",
    "check_cpu_tensor",
    "check_epoch",
    "check_finite_non_negative",
    "check_image_sizes",
    "check_int",
    "check_positive_int",
    "default_world",
    "device_of",
    "is_cuda",
    "is_tensor",
    "use_cpu_twin",
]

# Image sides are limited so that width * height and every intermediate of the published float formulas stay
# exact in float64 (2**26 * 2**26 = 2**52 < 2**53): then numpy, Triton and Python's float arithmetic agree.
MAX_IMAGE_SIDE = 2**26
# Qwen2-VL's smart_resize rejects images whose long side exceeds 200x the short side.
QWEN2VL_MAX_RATIO = 200


# The one ``backend`` vocabulary: every ``backend=`` argument of the package takes a value of this table, and
# each stage accepts the values of its row. The meaning of every value, per stage:
BACKENDS: dict[str, dict[str, str]] = {
    # GPU ops (ops/, and the counting ops of vision/): where the op runs
    "ops": {
        "auto": "follow the data: CUDA tensors run the Triton kernel, anything else the CPU twin in cpu/",
        "triton": "the Triton kernel in ops/ (CPU tensors only under TRITON_INTERPRET=1)",
        "cpu": "the CPU twin in cpu/ (CPU data only)",
    },
    # pack_batch: how the per-token fields of a batch are filled on the CPU
    "packing": {
        "auto": "numba when it imports, else torch",
        "numba": "the fused one-pass numba kernel (cpu/varlen_metadata_numba.py)",
        "torch": "vectorized torch ops (cpu/varlen_metadata.py)",
    },
    # varlen_attention: which attention implementation
    "attention": {
        "auto": "flash_attn, then torch_varlen for CUDA half-precision inputs, else sdpa",
        "flash_attn": "flash_attn.flash_attn_varlen_func (CUDA, fp16/bf16)",
        "torch_varlen": "torch.nn.attention.varlen.varlen_attn (CUDA, fp16/bf16, torch >= 2.9)",
        "sdpa": "torch's scaled_dot_product_attention on groups of segments (any device and dtype)",
    },
}


def backends(stage: str) -> tuple[str, ...]:
    """The ``backend`` values ``stage`` (a key of :data:`BACKENDS`) accepts, ``"auto"`` first."""
    return tuple(BACKENDS[stage])


def check_backend(name: str, value: object, stage: str = "ops") -> str:
    """``value`` when it is a ``backend`` of ``stage``; ``ValueError`` naming ``name`` (the caller) otherwise."""
    allowed = backends(stage)
    if value not in allowed:  # a tuple: unhashable values are a ValueError too
        raise ValueError(f"{name}: backend must be one of {allowed}, got {value!r}")
    return value


def device_of(*values: Any) -> str:
    """The device type of the data: ``"cuda"`` when any value is a CUDA tensor, else the device type of the
    first tensor that is not on the CPU, else ``"cpu"`` (lists and numpy arrays live on the host)."""
    if any(is_cuda(v) for v in values):
        return "cuda"
    for v in values:
        if is_tensor(v) and v.device.type != "cpu":
            return str(v.device.type)
    return "cpu"


def use_cpu_twin(name: str, backend: object, *data: Any) -> bool:
    """The one routing rule of every op: whether ``data`` goes to the CPU twin under ``backend``.

    ``name`` is the op (for errors); ``data`` the op's inputs (tensors, arrays or lists), on one device.
    """
    check_backend(name, backend, "ops")
    device_type = device_of(*data)
    if backend == "cpu":
        if device_type != "cpu":
            raise ValueError(f"{name}: backend='cpu' needs CPU data, got data on {device_type}")
        return True
    return backend == "auto" and device_type == "cpu"


def check_cpu_tensor(name: str, value: Any) -> None:
    """``value`` is no tensor on a device other than the CPU: the input check of every CPU twin."""
    if is_tensor(value) and value.device.type != "cpu":
        raise ValueError(f"{name}: the CPU twin needs CPU tensors, got a tensor on {value.device}")


def check_int(name: str, value: object) -> int:
    """``value`` as a Python int; ``TypeError`` for anything but an integer (``bool`` included)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    return int(value)


def check_positive_int(name: str, value: object, minimum: int = 1, maximum: Optional[int] = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``TypeError`` for a non-integer, else ``ValueError``."""
    value = check_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_finite_non_negative(name: str, value: object, owner: str = "") -> float:
    """``value`` as a float, finite and ``>= 0``; ``TypeError`` for anything but a real number (``bool``
    included), else ``ValueError``. ``owner`` (the class or file) prefixes the messages when given."""
    prefix = f"{owner}: " if owner else ""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{prefix}{name} must be a number, got {type(value).__name__} ({value!r})")
    try:
        number = float(value)
    except OverflowError:  # an int past float64's range
        number = math.inf
    if not math.isfinite(number) or number < 0:
        shown = repr(value) if len(repr(value)) <= 40 else f"an integer of {len(str(value))} digits"
        raise ValueError(f"{prefix}{name} must be finite and >= 0, got {shown}")
    return number


# Epochs are mixed into the plan's seed as 64-bit words: epochs past 2**63 (int64) would repeat earlier epochs'
# plans (2**64 would plan exactly like epoch 0).
MAX_EPOCH = (1 << 63) - 1


def check_epoch(epoch: object) -> int:
    """An int epoch in ``[0, 2**63)``."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
        raise TypeError(f"epoch must be a non-negative int below 2**63, got {type(epoch).__name__} ({epoch!r})")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch must be a non-negative int below 2**63, got {epoch!r}")
    return int(epoch)


def is_tensor(x: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``x`` is a torch tensor (without importing torch when it is not loaded yet)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x: Any) -> bool:
    """Whether ``x`` is a torch tensor on a CUDA device."""
    return is_tensor(x) and x.is_cuda


def as_int_array(x: Any, name: str) -> np.ndarray:
    """1-D int64 numpy copy of ``x``; integer-valued floats are accepted, other dtypes are a ``TypeError``."""
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        if arr.size == 0:
            return arr.astype(np.int64)
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TypeError(f"{name}[{i}] = {arr[i]!r} is not an integer")
    return arr.astype(np.int64)


def check_image_sizes(
    widths: np.ndarray, heights: np.ndarray, *, max_ratio: Optional[float] = None, owner: Optional[np.ndarray] = None
) -> None:
    """Every image side in ``[1, MAX_IMAGE_SIDE]`` and, with ``max_ratio``, long side / short side at most that.

    Errors name ``image i``, or ``sample owner[i]`` when ``owner`` maps images to the samples that hold them.
    """
    if widths.shape != heights.shape:
        raise ValueError(f"widths and heights differ in length: {widths.shape[0]} vs {heights.shape[0]}")

    def where(i: int) -> str:
        return f"image {i}" if owner is None else f"sample {int(owner[i])}"

    bad = (widths <= 0) | (heights <= 0) | (widths > MAX_IMAGE_SIDE) | (heights > MAX_IMAGE_SIDE)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where(i)}: image size {int(widths[i])}x{int(heights[i])} (width x height) has a side "
            f"outside [1, {MAX_IMAGE_SIDE}]"
        )
    if max_ratio is not None and widths.size:
        ratio = np.maximum(widths, heights) / np.minimum(widths, heights)
        bad = ratio > max_ratio
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{where(i)}: image {int(widths[i])}x{int(heights[i])} has absolute aspect ratio "
                f"{ratio[i]:.1f}, above the limit of {max_ratio:g}"
            )


def default_world(world_size: Optional[int] = None, rank: Optional[int] = None, *, owner: str = "") -> tuple[int, int]:
    """``(world_size, rank)``: the given values, else torch.distributed's when initialized, else ``(1, 0)``.

    ``owner`` names the caller in errors. No silent fallback: ``world_size`` and ``rank`` are given together or
    not at all, and without them a ``WORLD_SIZE`` above 1 in the environment (``torchrun``, ``accelerate
    launch``) needs an initialized process group, else every process would think it is rank 0 of 1 and train
    the same batches.

    Raises:
        ValueError: only one of ``world_size`` and ``rank`` given; ``WORLD_SIZE > 1`` without an initialized
            process group (naming ``torch.distributed.init_process_group``); ``rank`` not in ``[0, world_size)``.
        TypeError: a non-integer world size or rank.
    """
    import os

    import torch.distributed as dist

    prefix = f"{owner}: " if owner else ""
    if (world_size is None) != (rank is None):
        given, missing = ("world_size", "rank") if rank is None else ("rank", "world_size")
        raise ValueError(
            f"{prefix}{given} was given without {missing}; give both (every process its own rank) "
            "or neither (then torch.distributed's are used)"
        )
    if world_size is None:
        if dist.is_available() and dist.is_initialized():
            world_size, rank = dist.get_world_size(), dist.get_rank()
        else:
            env = os.environ.get("WORLD_SIZE", "").strip()
            if env.isdigit() and int(env) > 1:
                raise ValueError(
                    f"{prefix}WORLD_SIZE={env} in the environment but no torch.distributed process group is "
                    "initialized: call torch.distributed.init_process_group(...) first (or pass world_size and "
                    "rank); without it every process would be rank 0 of 1 and train the same batches"
                )
            world_size, rank = 1, 0
    world_size = check_positive_int("world_size", world_size)
    rank = check_int("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"{prefix}rank must be in [0, world_size={world_size}), got {rank}")
    return world_size, rank
