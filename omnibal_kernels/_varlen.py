"""Result types and argument checks shared by the Triton ops (ops/) and their CPU twins (cpu/).

Nothing here imports triton or numba, so both sides import it without importing each other. A batch of variable-length sequences is described either by ``seq_lens`` (B,) or by ``cu_seqlens`` (B+1,)
int32. Both may live on the host (a list, a numpy array or a CPU tensor: everything is checked, nothing
syncs) or on the device (only shapes and dtypes are checked; values need a host sync, which happens at most
once and only where the caller did not pass the host-side numbers).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Union

import numpy as np
import torch

from ._checks import check_positive_int, is_tensor

LengthsLike = Union[Sequence[int], np.ndarray, torch.Tensor]

# cu_seqlens is int32 (flash-attention's convention), so the total token count must fit in it.
INT32_MAX = 2**31 - 1

class Segments(NamedTuple):
    """Segment boundaries ready for a kernel."""

    cu_seqlens: torch.Tensor  # int32 (batch + 1,) on the target device
    total_tokens: int  # cu_seqlens[-1], known on the host
    max_seqlen: int | None  # longest segment when known on the host without a sync, else None
    batch: int


def _check_total_tokens(total_tokens: object, fn: str) -> int | None:
    """``total_tokens`` as an int in ``[0, INT32_MAX]``, or None."""
    if total_tokens is None:
        return None
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, (int, np.integer)):
        raise TypeError(f"{fn}: total_tokens must be an int, got {type(total_tokens).__name__}")
    if not 0 <= int(total_tokens) <= INT32_MAX:
        raise ValueError(f"{fn}: total_tokens must be in [0, {INT32_MAX}], got {total_tokens}")
    return int(total_tokens)


def is_host(x: object) -> bool:
    """True for lists, tuples, numpy arrays and CPU tensors."""
    return not isinstance(x, torch.Tensor) or x.device.type == "cpu"


def _to_device(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """int32 host array -> device tensor without a host sync (pinned staging, non-blocking copy)."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int32))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _host_int_array(x: LengthsLike, name: str, fn: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{fn}: {name} must hold integers, got dtype {x.dtype}")
        arr = x.detach().numpy()
    else:
        arr = np.asarray(x)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{fn}: {name} must hold integers, got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {tuple(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def _check_device_lengths(x: torch.Tensor, name: str, fn: str, numel: int, int32_only: bool) -> None:
    if x.dim() != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {tuple(x.shape)}")
    allowed = (torch.int32,) if int32_only else (torch.int32, torch.int64)
    if x.dtype not in allowed:
        raise TypeError(f"{fn}: {name} must have dtype {' or '.join(map(str, allowed))}, got {x.dtype}")
    if x.numel() != numel:
        raise ValueError(f"{fn}: {name} must have {numel} entries, got {x.numel()}")


def _check_host_lengths(lens: np.ndarray, fn: str, padded_len: int | None) -> None:
    bad = np.flatnonzero(lens < 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{fn}: sequence {i} has negative length {int(lens[i])}")
    if padded_len is not None:
        bad = np.flatnonzero(lens > padded_len)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{fn}: sequence {i} has length {int(lens[i])} > padded length {padded_len}")
    total = int(lens.sum())
    if total > INT32_MAX:
        raise ValueError(f"{fn}: {total} tokens in total overflow int32 cu_seqlens (at most {INT32_MAX})")


def resolve_segments(
    seq_lens: LengthsLike | None,
    cu_seqlens: LengthsLike | None,
    total_tokens: int | None,
    *,
    batch: int,
    padded_len: int | None,
    device: torch.device,
    fn: str,
) -> Segments:
    """Check ``seq_lens`` / ``cu_seqlens`` against a batch of ``batch`` rows and move them to ``device``.

    Host lengths are checked completely (non-negative, at most ``padded_len``, total fits int32, matches
    ``total_tokens`` when given) and copied without a sync. Device lengths get shape/dtype checks; when
    ``total_tokens`` is None it is read back with one sync, together with the value checks.
    """
    if (seq_lens is None) == (cu_seqlens is None):
        raise TypeError(f"{fn}: pass exactly one of seq_lens or cu_seqlens")
    total_tokens = _check_total_tokens(total_tokens, fn)

    if seq_lens is not None:
        if is_host(seq_lens):
            lens = _host_int_array(seq_lens, "seq_lens", fn)
            if lens.size != batch:
                raise ValueError(f"{fn}: seq_lens has {lens.size} entries for a batch of {batch}")
            _check_host_lengths(lens, fn, padded_len)
            cu = np.zeros(batch + 1, dtype=np.int64)
            np.cumsum(lens, out=cu[1:])
            return _host_segments(cu, total_tokens, device, fn, "seq_lens")
        assert isinstance(seq_lens, torch.Tensor)
        _check_device_lengths(seq_lens, "seq_lens", fn, batch, int32_only=False)
        _check_same_device(seq_lens, "seq_lens", device, fn)
        cu_dev = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        torch.cumsum(seq_lens, 0, dtype=torch.int32, out=cu_dev[1:])
        return _device_segments(cu_dev, seq_lens, total_tokens, padded_len, fn, "seq_lens")

    assert cu_seqlens is not None
    if is_host(cu_seqlens):
        if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dtype != torch.int32:
            raise TypeError(f"{fn}: cu_seqlens must have dtype torch.int32, got {cu_seqlens.dtype}")
        cu = _host_int_array(cu_seqlens, "cu_seqlens", fn)
        if cu.size != batch + 1:
            raise ValueError(f"{fn}: cu_seqlens must have batch + 1 = {batch + 1} entries, got {cu.size}")
        if cu[0] != 0:
            raise ValueError(f"{fn}: cu_seqlens must start at 0, got {int(cu[0])}")
        lens = np.diff(cu)
        bad = np.flatnonzero(lens < 0)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{fn}: cu_seqlens must be non-decreasing; it drops after entry {i}")
        _check_host_lengths(lens, fn, padded_len)
        return _host_segments(cu, total_tokens, device, fn, "cu_seqlens")
    assert isinstance(cu_seqlens, torch.Tensor)
    _check_device_lengths(cu_seqlens, "cu_seqlens", fn, batch + 1, int32_only=True)
    _check_same_device(cu_seqlens, "cu_seqlens", device, fn)
    return _device_segments(cu_seqlens.contiguous(), None, total_tokens, padded_len, fn, "cu_seqlens")


def _check_same_device(x: torch.Tensor, name: str, device: torch.device, fn: str) -> None:
    if x.device != device:
        raise ValueError(f"{fn}: {name} is on {x.device} but the data is on {device}")


def _host_segments(cu: np.ndarray, total_tokens: int | None, device: torch.device, fn: str, name: str) -> Segments:
    total = int(cu[-1])
    if total_tokens is not None and total_tokens != total:
        raise ValueError(f"{fn}: total_tokens={total_tokens} but {name} add up to {total}")
    lens = np.diff(cu)
    max_seqlen = int(lens.max()) if lens.size else 0
    return Segments(_to_device(cu, device), total, max_seqlen, cu.size - 1)


def _device_segments(
    cu_dev: torch.Tensor,
    lens_dev: torch.Tensor | None,
    total_tokens: int | None,
    padded_len: int | None,
    fn: str,
    name: str,
) -> Segments:
    batch = cu_dev.numel() - 1
    if total_tokens is not None:
        # Trust the caller: nothing is read back. Kernels mask every store to [0, total_tokens), so a wrong
        # value gives wrong rows but never an out-of-bounds write.
        return Segments(cu_dev, total_tokens, None, batch)
    # The one host sync of this path: total, shortest and longest segment in a single transfer.
    if batch == 0:
        return Segments(cu_dev, 0, 0, 0)
    if lens_dev is None:
        lens_dev = cu_dev[1:] - cu_dev[:-1]
    stats = torch.stack(
        [lens_dev.sum(dtype=torch.int64), cu_dev[0].long(), lens_dev.min().long(), lens_dev.max().long()]
    )
    total, first, shortest, longest = (int(v) for v in stats.cpu())
    if total > INT32_MAX:
        raise ValueError(f"{fn}: {total} tokens in total overflow int32 cu_seqlens (at most {INT32_MAX})")
    if first != 0:
        raise ValueError(f"{fn}: cu_seqlens must start at 0, got {first}")
    if shortest < 0:
        raise ValueError(f"{fn}: {name} holds a negative length ({shortest})")
    if padded_len is not None and longest > padded_len:
        raise ValueError(f"{fn}: a sequence has length {longest} > padded length {padded_len}")
    return Segments(cu_dev, total, longest, batch)


def batch_from(seq_lens: LengthsLike | None, cu_seqlens: LengthsLike | None, fn: str) -> int:
    """Number of sequences described by ``seq_lens`` (B,) or ``cu_seqlens`` (B+1,)."""
    if (seq_lens is None) == (cu_seqlens is None):
        raise TypeError(f"{fn}: pass exactly one of seq_lens or cu_seqlens")
    x = seq_lens if seq_lens is not None else cu_seqlens
    name = "seq_lens" if seq_lens is not None else "cu_seqlens"
    shape = tuple(x.shape) if isinstance(x, (torch.Tensor, np.ndarray)) else (len(x),)  # type: ignore[arg-type]
    if len(shape) != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {shape}")
    if seq_lens is not None:
        return shape[0]
    if shape[0] < 1:
        raise ValueError(f"{fn}: cu_seqlens must have batch + 1 >= 1 entries, got 0")
    return shape[0] - 1


def check_padded(padded: object, fn: str) -> torch.Tensor:
    """``padded`` is a tensor of at least 2 dims ``(batch, padded_len, ...)``."""
    if not isinstance(padded, torch.Tensor):
        raise TypeError(f"{fn}: padded must be a torch.Tensor, got {type(padded).__name__}")
    if padded.dim() < 2:
        raise ValueError(f"{fn}: padded must be (batch, padded_len, ...), got shape {tuple(padded.shape)}")
    return padded


def check_packed(packed: object, fn: str) -> torch.Tensor:
    """``packed`` is a tensor of at least 1 dim ``(total_tokens, ...)``."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{fn}: packed must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() < 1:
        raise ValueError(f"{fn}: packed must be (total_tokens, ...), got a 0-d tensor")
    return packed


def check_fill_value(fill_value: object, dtype: torch.dtype, fn: str) -> None:
    """A Python number that ``dtype`` holds exactly (no silent truncation of 0.5 into an integer tensor)."""
    if not isinstance(fill_value, (bool, int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: fill_value must be a Python number, got {type(fill_value).__name__}")
    if not (dtype.is_floating_point or dtype.is_complex) and isinstance(fill_value, (float, np.floating)):
        if not float(fill_value).is_integer():
            raise TypeError(f"{fn}: fill_value {fill_value} does not fit the integer dtype {dtype}")


class PackedTokens(NamedTuple):
    """What ``unpad_from_mask`` returns."""

    packed: torch.Tensor  # (total_tokens, *rest)
    cu_seqlens: torch.Tensor  # int32 (B + 1,), on the device of the data
    max_seqlen: int  # longest row
    seq_lens: torch.Tensor  # int32 (B,), on the device of the data


def unpack_segments(
    packed: torch.Tensor,
    seq_lens: LengthsLike | None,
    cu_seqlens: LengthsLike | None,
    padded_len: int | None,
    fill_value: object,
    fn: str,
) -> Segments:
    """Checks of ``unpack``'s arguments (shared by the op and its CPU twin) and the resulting ``Segments``."""
    check_fill_value(fill_value, packed.dtype, fn)
    if padded_len is not None and (
        isinstance(padded_len, bool) or not isinstance(padded_len, (int, np.integer)) or padded_len < 0
    ):
        raise ValueError(f"{fn}: padded_len must be a non-negative int, got {padded_len!r}")
    batch = batch_from(seq_lens, cu_seqlens, fn)
    lengths = seq_lens if seq_lens is not None else cu_seqlens
    seg = resolve_segments(
        seq_lens,
        cu_seqlens,
        None if is_host(lengths) else packed.shape[0],
        batch=batch,
        padded_len=None if padded_len is None else int(padded_len),
        device=packed.device,
        fn=fn,
    )
    if seg.total_tokens != packed.shape[0]:
        raise ValueError(f"{fn}: packed has {packed.shape[0]} rows but the lengths add up to {seg.total_tokens}")
    return seg


def check_attention_mask(padded: torch.Tensor, attention_mask: object, fn: str) -> torch.Tensor:
    """Shape, dtype and device checks of a ``(B, S)`` ``attention_mask``; returns it as bool."""
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"{fn}: attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(padded.shape[:2]):
        raise ValueError(
            f"{fn}: attention_mask has shape {tuple(attention_mask.shape)}, expected {tuple(padded.shape[:2])}"
        )
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"{fn}: attention_mask must be bool or integer, got {attention_mask.dtype}")
    if attention_mask.device != padded.device:
        raise ValueError(f"{fn}: attention_mask is on {attention_mask.device} but padded is on {padded.device}")
    return attention_mask != 0


def mask_segments(mask: torch.Tensor, fn: str) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(seq_lens int32, cu_seqlens int32, total, max_seqlen)`` of a bool ``(B, S)`` right-padded mask.

    Reads the total, the longest row and the first row that is not right-padded in one host transfer.
    """
    batch, padded_len = mask.shape
    seq_lens = mask.sum(1, dtype=torch.int32)
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(seq_lens, 0, dtype=torch.int32, out=cu_seqlens[1:])
    if batch == 0:
        return seq_lens, cu_seqlens, 0, 0
    prefix = torch.arange(padded_len, device=mask.device)[None, :] < seq_lens[:, None]
    rows = torch.arange(batch, device=mask.device)
    first_bad = torch.where((mask != prefix).any(1), rows, batch).min()
    stats = torch.stack([seq_lens.sum(dtype=torch.int64), seq_lens.max().long(), first_bad.long()])
    total, longest, first_bad_row = (int(v) for v in stats.cpu())  # the one host sync
    if first_bad_row < batch:
        raise ValueError(f"{fn}: attention_mask row {first_bad_row} is not right-padded (ones, then zeros)")
    if total > INT32_MAX:
        raise ValueError(f"{fn}: {total} tokens in total overflow int32 cu_seqlens (at most {INT32_MAX})")
    return seq_lens, cu_seqlens, total, longest


class VarlenMetadata(NamedTuple):
    """What ``varlen_metadata`` returns."""

    cu_seqlens: torch.Tensor  # int32 (B + 1,)
    position_ids: torch.Tensor  # int64 (T,), restarting at 0 in every sequence
    seq_idx: torch.Tensor  # int32 (T,), the sequence each token belongs to
    labels: torch.Tensor | None  # the input labels with ignore_index on each sequence's first token


def check_varlen_args(
    seq_lens: object,
    total_tokens: int | None,
    labels: object,
    ignore_index: object,
    fn: str,
) -> int:
    """Checks of ``varlen_metadata``'s arguments; returns the total token count.

    Everything is checked for CPU ``seq_lens``. For device ``seq_lens`` the total comes from
    ``total_tokens``, else from ``labels.numel()``, else from one host sync that also checks the lengths.
    """
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"{fn}: seq_lens must be a torch.Tensor, got {type(seq_lens).__name__}")
    if seq_lens.dim() != 1:
        raise ValueError(f"{fn}: seq_lens must be 1-D, got shape {tuple(seq_lens.shape)}")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: seq_lens must have dtype torch.int32 or torch.int64, got {seq_lens.dtype}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{fn}: ignore_index must be an int, got {type(ignore_index).__name__}")
    total_tokens = _check_total_tokens(total_tokens, fn)
    if labels is not None:
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{fn}: labels must be a torch.Tensor or None, got {type(labels).__name__}")
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
            raise TypeError(f"{fn}: labels must hold integers, got dtype {labels.dtype}")
        if not (labels.dim() == 1 or (labels.dim() == 2 and labels.shape[0] == 1)):
            raise ValueError(f"{fn}: labels must be (T,) or (1, T), got shape {tuple(labels.shape)}")
        if labels.device != seq_lens.device:
            raise ValueError(f"{fn}: labels are on {labels.device} but seq_lens on {seq_lens.device}")
        if total_tokens is not None and labels.numel() != total_tokens:
            raise ValueError(f"{fn}: labels hold {labels.numel()} tokens but total_tokens={total_tokens}")
        total_tokens = labels.numel()
    if seq_lens.device.type == "cpu":
        lens = seq_lens.numpy().astype(np.int64)
        _check_host_lengths(lens, fn, None)
        total = int(lens.sum())
        if total_tokens is not None and total_tokens != total:
            what = "labels hold" if labels is not None else "total_tokens is"
            raise ValueError(f"{fn}: {what} {total_tokens} tokens but seq_lens add up to {total}")
        return total
    if total_tokens is not None:
        return total_tokens
    if seq_lens.numel() == 0:
        return 0
    # the one host sync of this path: total and shortest length together
    stats = torch.stack([seq_lens.sum(dtype=torch.int64), seq_lens.min().long()])
    total, shortest = (int(v) for v in stats.cpu())
    if shortest < 0:
        raise ValueError(f"{fn}: seq_lens holds a negative length ({shortest})")
    if total > INT32_MAX:
        raise ValueError(f"{fn}: {total} tokens in total overflow int32 cu_seqlens (at most {INT32_MAX})")
    return total


# --------------------------------------------------------------------------------------------- vision


class PatchBuckets(NamedTuple):
    """Images grouped by patch count (numpy arrays, or torch tensors on the input's device)."""

    perm: Any
    """``(N,)`` int64: image indices bucket by bucket, original order inside each bucket (stable)"""
    offsets: Any
    """``(K + 1,)`` int64: bucket ``b`` holds ``perm[offsets[b]:offsets[b + 1]]``; ``offsets[-1] == N``"""
    bucket_ids: Any
    """``(N,)`` int32: bucket of each image, in the original order"""
    boundaries: Any
    """``(K - 1,)`` int64: bucket ``b >= 1`` holds counts ``>= boundaries[b - 1]`` and ``< boundaries[b]``"""


class PackedPatches(NamedTuple):
    """Images cut into Qwen2-VL ViT patches and packed into one varlen sequence of ``P`` patches."""

    patches: Any
    """``(P, C * temporal_patch_size * patch_size**2)``, input dtype; Qwen2-VL's ``pixel_values`` layout"""
    vit_cu_seqlens: Any
    """``(S + 1,)`` int32: one segment per frame group of each image, as Qwen2-VL's vision tower builds it"""
    vit_max_seqlen: int
    """longest segment"""
    patch_positions: Any
    """``(P, 2)`` int64 ``(row, col)`` of each patch in its image, for 2-D rotary embeddings"""
    image_grid_thw: Any
    """``(N, 3)`` int64 ``(t, h, w)`` in patches per image"""


class PatchPlan(NamedTuple):
    views: list  # per image a 4-D (frames, C, H, W) tensor view (any strides)
    grid: np.ndarray  # (N, 3) int64
    first_patch: np.ndarray  # (N + 1,) int64 patch offsets
    channels: int
    dtype: Any
    device: Any


ELEMENT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def plan_patches(images: Any, sizes: Any, patch_size: int, merge_size: int, temporal_patch_size: int) -> PatchPlan:
    """Validate the inputs of ``patchify`` and describe every image as a strided 4-D view."""
    patch_size = check_positive_int("patch_size", patch_size)
    merge_size = check_positive_int("merge_size", merge_size)
    temporal_patch_size = check_positive_int("temporal_patch_size", temporal_patch_size)
    factor = patch_size * merge_size
    views: list = []
    if isinstance(images, torch.Tensor):
        if sizes is None:
            raise ValueError("a padded images tensor needs sizes: (N, 2) (height, width) per image")
        if images.dim() not in (4, 5):
            raise ValueError(f"padded images must be (N, C, H, W) or (N, T, C, H, W), got {tuple(images.shape)}")
        hw = np.asarray(sizes.detach().cpu() if is_tensor(sizes) else sizes)
        if hw.ndim != 2 or hw.shape != (images.shape[0], 2):
            raise ValueError(f"sizes must be ({images.shape[0]}, 2) (height, width), got shape {tuple(hw.shape)}")
        if not np.issubdtype(hw.dtype, np.integer):
            raise TypeError(f"sizes must be integers, got dtype {hw.dtype}")
        for i in range(images.shape[0]):
            h, w = int(hw[i, 0]), int(hw[i, 1])
            if not (0 < h <= images.shape[-2] and 0 < w <= images.shape[-1]):
                raise ValueError(f"image {i}: size {h}x{w} is outside the padded {images.shape[-2]}x{images.shape[-1]}")
            img = images[i]
            views.append((img.unsqueeze(0) if img.dim() == 3 else img)[..., :h, :w])
    else:
        if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
            raise TypeError("images must be a list of (C, H, W) / (T, C, H, W) tensors or one padded tensor")
        if sizes is not None:
            raise ValueError("sizes is only for a padded images tensor")
        for i, img in enumerate(images):
            if not isinstance(img, torch.Tensor):
                raise TypeError(f"image {i}: expected a torch tensor, got {type(img).__name__}")
            if img.dim() not in (3, 4):
                raise ValueError(f"image {i}: expected (C, H, W) or (T, C, H, W), got shape {tuple(img.shape)}")
            views.append(img.unsqueeze(0) if img.dim() == 3 else img)
    if not views:
        raise ValueError("no images to pack")
    first = views[0]
    grid = np.zeros((len(views), 3), dtype=np.int64)
    for i, v in enumerate(views):
        if v.shape[1] != first.shape[1]:
            raise ValueError(f"image {i}: {v.shape[1]} channels, image 0 has {first.shape[1]}")
        if v.dtype != first.dtype:
            raise ValueError(f"image {i}: dtype {v.dtype}, image 0 has {first.dtype}")
        if v.device != first.device:
            raise ValueError(f"image {i}: on {v.device}, image 0 on {first.device}")
        if v.element_size() not in ELEMENT_VIEW:
            raise TypeError(f"image {i}: unsupported dtype {v.dtype}")
        t, _, h, w = v.shape
        if t < 1 or h <= 0 or w <= 0 or h % factor or w % factor:
            raise ValueError(f"image {i}: size {h}x{w} ({t} frames) must be positive multiples of "
                             f"patch_size * merge_size = {factor} (resize with qwen2vl_smart_resize first)")
        grid[i] = ((t + temporal_patch_size - 1) // temporal_patch_size, h // patch_size, w // patch_size)
    per_image = grid[:, 0] * grid[:, 1] * grid[:, 2]
    offsets = np.zeros(len(views) + 1, dtype=np.int64)
    np.cumsum(per_image, out=offsets[1:])
    return PatchPlan(views, grid, offsets, int(first.shape[1]), first.dtype, first.device)


def patch_segments(grid: np.ndarray) -> tuple[np.ndarray, int]:
    """``vit_cu_seqlens`` (int32) with one segment of ``h * w`` per frame group, and the longest segment."""
    seg = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    cu = np.zeros(seg.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg, out=cu[1:])
    if cu[-1] >= 2**31:
        raise ValueError(f"{int(cu[-1])} patches overflow int32 vit_cu_seqlens")
    return cu.astype(np.int32), int(seg.max()) if seg.size else 0
