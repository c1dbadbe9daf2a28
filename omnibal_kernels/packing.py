"""Pack a list of samples into one flash-attention style varlen batch, on the CPU (DataLoader collate side).

``pack_batch(samples)`` concatenates the samples' tokens into a single row and describes the sequence
boundaries the way flash-attention's varlen kernels and Hugging Face's packed-sequence path expect them::

    input_ids      (1, T) int64    the samples' tokens back to back (then any padding segment)
    labels         (1, T) int64    the samples' labels, ``ignore_index`` on the first token of every sample
    position_ids   (1, T) int64    0, 1, ... restarting at every segment
    seq_idx        (1, T) int32    segment index of every token (padding is segment ``B``)
    cu_seqlens     (S + 1,) int32  segment starts, 0 first, ``T`` last
    seq_lens       (S,) int32      segment lengths, ``cu_seqlens.diff()``
    max_seqlen     int             longest segment (rounded up to a bucket in static mode)
    cu_seq_lens_q, cu_seq_lens_k   the same tensor as ``cu_seqlens`` (Hugging Face flash-attention kwargs)
    max_length_q, max_length_k     ``max_seqlen``

``B`` is the number of samples, ``S`` the number of segments: ``B``, plus one when a padding segment is
added, or ``max_num_seqs`` in static mode. There is no ``attention_mask``: the boundaries are the mask.

Per-token work (positions, segment indices, boundary labels) runs in one fused numba pass
(``omnibal_kernels.cpu.collate``); the token copies are ``torch.cat``. Nothing loops over tokens in
Python. Inside a DataLoader worker every output is written straight into one shared-memory buffer, so
handing the batch to the main process passes one storage and copies nothing.

The numba kernel compiles on the first call in a process (about 1 s; about 0.5 s from numba's on-disk
cache). :class:`PackCollator` (or :func:`warmup`) does it in the main process, so forked DataLoader workers
inherit it; ``pack_batch`` used directly as ``collate_fn`` pays it once per worker on its first batch.

Static shapes: ``pad_to_length`` + ``max_num_seqs`` + ``max_seqlen_buckets`` fix every tensor shape and
limit ``max_seqlen`` to a few values. The padding is one segment, so attention over it costs like a
sample of that length: choose ``pad_to_length`` close to the planned pack capacity.

Multimodal samples (``pixel_values`` as tiles ``(n, C, H, W)`` or patches ``(n_patches, D)``, optional
``image_grid_thw`` ``(k, 3)``; ``pixel_values_videos``/``video_grid_thw``/``second_per_grid_ts`` for videos)
add, in sample order, text-only samples contributing nothing::

    pixel_values     (sum n, C, H, W) or (sum n_patches, D)   all samples' pixels, concatenated
    vit_cu_seqlens   (S_vit + 1,) int32   ViT segments: one per tile, or per frame group of each image grid
    vit_max_seqlen   int
    image_to_sample  (I,) int32           the sample of every image (tile)
    num_images       (B,) int32           images (tiles) per sample
    image_grid_thw   (I, 3) int64         when the samples give grids
    (videos: pixel_values_videos, video_grid_thw, video_vit_cu_seqlens, video_vit_max_seqlen,
    video_to_sample, num_videos, second_per_grid_ts)

With ``image_token_id`` set (Qwen2-VL style models), every batch gets mRoPE positions: ``position_ids``
``(3, 1, T)`` numbered per sample as the model's ``get_rope_index`` does, and ``text_position_ids``
``(1, T)``, the 1-D positions restarting per sample (see :class:`PackOptions`). :func:`unpack_batch`
splits a packed batch back into its samples.

Extension point: ``_FIELD_PACKERS`` maps a sample key to a packer that adds its own output fields (the
multimodal fields of :mod:`omnibal_kernels.vision.fields` are registered there directly); :func:`pack_sequences` is the text core
that returns the text fields as a plain dict.
"""
from __future__ import annotations

import importlib
import numbers
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .vision.fields import SAMPLE_KEYS as VISION_SAMPLE_KEYS
from .vision.fields import VISION_KEYS, pack_batch_vision, unpack_batch_vision
from .model_inputs import ModelInputs
from .vision.mrope import check_mrope_convention

__all__ = ["PackOptions", "PackedBatch", "PackCollator", "pack_batch", "pack_sequences", "unpack_batch", "warmup"]

# cu_seqlens is int32 (flash-attention's convention), so a batch holds at most 2**31 - 1 tokens.
_INT32_MAX = 2**31 - 1
_INT64 = torch.int64
_INTEGER_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
)
_INT64_MAX = 2**63 - 1
_UINT64 = getattr(torch, "uint64", None)
# unsigned dtypes torch.cat cannot combine with int64 ("Promotion for uint16, uint32, uint64 types is not supported")
_UNPROMOTABLE = frozenset(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))
_BACKENDS = ("auto", "numba", "torch")
_numel = torch.Tensor.numel
_from_numpy = torch.from_numpy
_np_empty = np.empty

# Fields pack_batch produces; a sample may not carry one of these (it would be silently overwritten).
TEXT_FIELDS = (
    "input_ids",
    "labels",
    "position_ids",
    "cu_seqlens",
    "max_seqlen",
    "seq_lens",
    "seq_idx",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
)
_RESERVED = frozenset(TEXT_FIELDS) - {"input_ids", "labels"}

# Sample key -> packer that consumes that key and adds output fields, as a callable or as a
# "module:function" string imported on first use (for packers outside this package). A packer is
# called as ``fn(samples, fields, options) -> None`` after the text fields are built and mutates
# ``fields`` (the dict that becomes the PackedBatch): it may add fields (pixel_values, vit_cu_seqlens, ...)
# or replace some (mRoPE position_ids). A packer registered under several keys runs once per batch.
_FIELD_PACKERS: dict[str, str | Callable[..., None]] = {key: pack_batch_vision for key in VISION_SAMPLE_KEYS}
# The packer that also runs on batches without any of its keys when mRoPE is on (PackOptions.mrope).
_MROPE_PACKER = pack_batch_vision


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_list_tensor(values: list[Any] | tuple[Any, ...] | range) -> torch.Tensor:
    """A non-empty list of ints as a tensor: int64 written by ``struct``, else ``torch.tensor``'s result.

    ``struct`` converts each item with ``__index__`` in C, straight into the tensor's memory (measured on
    the 32 lists of bench_pack.py, 34k ints: 0.38 ms against 5.3 ms for ``torch.tensor``, 0.69 ms for
    ``array.array`` and 0.65 ms for ``np.array(values, dtype=np.int64)``, which also truncates floats).
    It takes ints and numpy or 0-d tensor integers and rejects floats, strings, None and values outside
    int64. Whatever it rejects, and lists that start with a bool (torch makes a bool tensor of an all-bool
    list, which the caller rejects), goes to ``torch.tensor``, so every error and every rejected dtype
    stays what it was.
    """
    if type(values[0]) is not bool:
        out = torch.empty(len(values), dtype=_INT64)
        try:
            struct.pack_into(f"{len(values)}q", out.numpy(), 0, *values)
        except (TypeError, struct.error):
            pass
        else:
            return out
    return torch.tensor(values)


@dataclass(frozen=True)
class PackOptions:
    """Options of :func:`pack_batch` (validated once; :class:`PackCollator` keeps one).

    mask_first_label: put ``ignore_index`` on the first label of every sample, so that with the usual
        shift-by-one loss no sample learns to predict its first token from the previous sample.
    ignore_index: the label value the loss skips.
    pad_to_multiple_of: pad the total length ``T`` up to a multiple of this (tensor cores, sequence or
        context parallel splits). The padding is its own segment (``pad_token_id``, labels
        ``ignore_index``, positions from 0), never glued onto a sample.
    pad_to_length: pad ``T`` to exactly this (static shapes); a batch with more tokens raises ValueError.
    pad_token_id: the ``input_ids`` value of padding tokens.
    max_num_seqs: static mode: ``cu_seqlens`` always has ``max_num_seqs + 1`` entries (``seq_lens``
        ``max_num_seqs``), the unused ones describing zero-length segments at the end; a batch with more
        segments (padding segment included) raises ValueError.
    max_seqlen_buckets: static mode: round ``max_seqlen`` up to a multiple of this int, or to the smallest
        of these increasing ints that holds it (ValueError if none does), so torch.compile and CUDA graphs
        see few distinct values.
    allow_empty: keep empty samples as zero-length segments; by default an empty sample raises ValueError.
    token_fields: names of extra per-sample fields that hold one value per token; they are concatenated
        like ``input_ids`` into ``(1, T)`` (padding 0) instead of being collected per sample.
    backend: ``"numba"`` (fused one-pass kernel), ``"torch"`` (vectorized torch ops) or ``"auto"`` (numba
        when importable). Measured on 16 samples of real lengths (17k tokens): about 20 us with numba,
        about 90 us with torch on one thread and far more when torch's threads compete for cores.

    Multimodal samples (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``,
    ``second_per_grid_ts``) are packed by :mod:`omnibal_kernels.vision`; these options are for them:

    image_token_id: the image placeholder token (Qwen2-VL's ``<|image_pad|>``). Setting it turns on
        Qwen2-VL mRoPE for every batch, text-only ones included, so the shape of ``position_ids`` never
        changes between batches: ``position_ids`` becomes ``(3, 1, T)`` (each sample as ``get_rope_index``
        numbers it, restarting per sample; padding like text) and ``text_position_ids`` ``(1, T)`` keeps
        the 1-D positions that packed-sequence detection reads. None: no mRoPE, ``position_ids`` ``(1, T)``.
    video_token_id: the video placeholder token (``<|video_pad|>``); needs ``image_token_id``.
    spatial_merge_size: the vision tower's spatial merge (2 for Qwen2-VL/2.5-VL): an image of grid
        ``(t, h, w)`` takes ``t * h * w / merge**2`` placeholder tokens.
    tokens_per_second: Qwen2.5-VL videos: temporal positions ``floor(k * (tokens_per_second *
        second_per_grid_t))`` in float32, as transformers computes them, from the samples'
        ``second_per_grid_ts`` (missing ones count as 1.0, as transformers does); None: Qwen2-VL's ``0..t-1``.
    mrope_text_row: make ``position_ids`` ``(4, 1, T)`` with ``text_position_ids`` as row 0, the layout in
        which recent transformers Qwen-VL text models take the text positions for packed sequences.
    mrope_convention: where text continues after a long video: ``"max_hw"`` (at the video's start plus
        ``max(h, w) / spatial_merge_size``, transformers >= 5.3) or ``"max_position"`` (at its largest
        position plus one: Qwen's original numbering, transformers <= 5.2); see
        :mod:`omnibal_kernels.vision.mrope`. None (default): the one the installed transformers computes
        (``"max_position"`` without transformers), resolved when mRoPE is on.

    To train a transformers model, :meth:`PackCollator.for_model` sets the options of this group from the
    model's config.
    """

    mask_first_label: bool = True
    ignore_index: int = -100
    pad_to_multiple_of: int | None = None
    pad_to_length: int | None = None
    pad_token_id: int = 0
    max_num_seqs: int | None = None
    max_seqlen_buckets: int | tuple[int, ...] | None = None
    allow_empty: bool = False
    token_fields: tuple[str, ...] = ()
    backend: str = "auto"
    image_token_id: int | None = None
    video_token_id: int | None = None
    spatial_merge_size: int = 2
    tokens_per_second: float | None = None
    mrope_text_row: bool = False
    mrope_convention: str | None = None

    def __post_init__(self) -> None:
        for name in ("mask_first_label", "allow_empty"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("ignore_index", "pad_token_id"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {value!r}")
        for name in ("pad_to_multiple_of", "pad_to_length", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.pad_to_length is not None and self.pad_to_multiple_of is not None:
            if self.pad_to_length % self.pad_to_multiple_of:
                raise ValueError(
                    f"pad_to_length={self.pad_to_length} is not a multiple of "
                    f"pad_to_multiple_of={self.pad_to_multiple_of}"
                )
        buckets = self.max_seqlen_buckets
        if buckets is not None:
            if _is_int(buckets):
                if buckets < 1:
                    raise ValueError(f"max_seqlen_buckets must be positive, got {buckets}")
            else:
                try:
                    buckets = tuple(buckets)
                except TypeError:
                    raise TypeError(
                        f"max_seqlen_buckets must be an int or a sequence of ints, got {buckets!r}"
                    ) from None
                if not buckets or not all(_is_int(b) and b >= 1 for b in buckets):
                    raise ValueError(f"max_seqlen_buckets must be positive ints, got {buckets!r}")
                if any(a >= b for a, b in zip(buckets, buckets[1:])):
                    raise ValueError(f"max_seqlen_buckets must be strictly increasing, got {buckets!r}")
                object.__setattr__(self, "max_seqlen_buckets", buckets)
        if isinstance(self.token_fields, str):
            raise TypeError("token_fields must be a sequence of field names, not a str")
        token_fields = tuple(self.token_fields)
        for name in token_fields:
            if not isinstance(name, str):
                raise TypeError(f"token_fields must hold str names, got {name!r}")
            if name in TEXT_FIELDS or name == "attention_mask":
                raise ValueError(f"token_fields may not name {name!r}: pack_batch handles it itself")
        object.__setattr__(self, "token_fields", token_fields)
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {self.backend!r}")
        for name in ("image_token_id", "video_token_id"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise TypeError(f"{name} must be an int or None, got {value!r}")
        if self.video_token_id is not None and self.image_token_id is None:
            raise ValueError("video_token_id needs image_token_id (mRoPE numbers images and videos together)")
        if not _is_int(self.spatial_merge_size) or self.spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size must be a positive int, got {self.spatial_merge_size!r}")
        tps = self.tokens_per_second
        if tps is not None and (
            isinstance(tps, bool) or not isinstance(tps, numbers.Real) or not tps > 0
        ):
            raise ValueError(f"tokens_per_second must be a positive number or None, got {tps!r}")
        if not isinstance(self.mrope_text_row, bool):
            raise TypeError(f"mrope_text_row must be a bool, got {self.mrope_text_row!r}")
        if self.mrope_convention is not None or self.mrope:
            object.__setattr__(self, "mrope_convention", check_mrope_convention(self.mrope_convention))

    @property
    def mrope(self) -> bool:
        """Whether batches get Qwen2-VL mRoPE ``position_ids`` (``image_token_id`` is set)."""
        return self.image_token_id is not None


_DEFAULT_OPTIONS = PackOptions()


class PackedBatch(Mapping[str, Any]):
    """The output of :func:`pack_batch`: a read-only mapping of field name -> tensor / int / list.

    Works with ``model(**batch)``; fields are also attributes (``batch.cu_seqlens``). ``.to(device)`` and
    ``.pin_memory()`` return a new PackedBatch and move a tensor shared by several keys (``cu_seqlens``
    and ``cu_seq_lens_q``/``_k``) once, keeping it shared. Pickles as its dict of fields.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = dict(fields)

    @classmethod
    def _wrap(cls, fields: dict[str, Any]) -> PackedBatch:
        batch = object.__new__(cls)
        batch._fields = fields
        return batch

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_fields":
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"PackedBatch has no field {name!r}") from None

    def __reduce__(self) -> tuple[Callable[..., PackedBatch], tuple[dict[str, Any]]]:
        return (PackedBatch, (self._fields,))

    def __repr__(self) -> str:
        parts = []
        for key, value in self._fields.items():
            if isinstance(value, torch.Tensor):
                parts.append(f"{key}: {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
            elif isinstance(value, (list, tuple)):
                parts.append(f"{key}: {type(value).__name__}[{len(value)}]")
            else:
                parts.append(f"{key}: {value!r}")
        return "PackedBatch(" + ", ".join(parts) + ")"

    def to_dict(self) -> dict[str, Any]:
        """A shallow copy of the fields as a plain dict."""
        return dict(self._fields)

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> PackedBatch:
        done: dict[int, torch.Tensor] = {}

        def apply(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                out = done.get(id(value))
                if out is None:
                    out = done[id(value)] = fn(value)
                return out
            if isinstance(value, list):
                return [apply(v) for v in value]
            if isinstance(value, tuple):
                return tuple(apply(v) for v in value)
            return value

        return PackedBatch._wrap({key: apply(value) for key, value in self._fields.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """Every tensor (also inside list fields) moved to ``device``; ints and other values as they are."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> PackedBatch:
        """Every CPU tensor copied to pinned memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map_tensors(lambda t: t.pin_memory() if t.device.type == "cpu" else t)


# ---------------------------------------------------------------------------------------------------------
# validation (slow path: runs only to convert non-tensor input or to name the sample behind a failure)


def _as_sequence(value: Any, index: int, field: str) -> torch.Tensor:
    """One sample's ``field`` as a 1-D integer tensor, or a TypeError/ValueError naming the sample.

    Unsigned tensors come back as int64 (torch cannot concatenate them with int64 ones), numpy arrays as
    contiguous int64 (a reversed view is copied); values above the int64 range are a ValueError.
    """
    if isinstance(value, torch.Tensor):
        tensor = value
        if tensor.dtype is _UINT64 and tensor.dim() == 1 and tensor.is_cpu:
            _check_int64_range(tensor.view(_INT64).numpy(), index, field)
        if tensor.dtype in _UNPROMOTABLE:
            tensor = tensor.to(_INT64)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"sample {index}: {field} must hold integers, got numpy dtype {value.dtype}")
        if value.dtype.kind == "u" and value.dtype.itemsize == 8 and value.ndim == 1:
            _check_int64_range(value.view(np.int64), index, field)
        tensor = torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64))
    elif isinstance(value, (list, tuple, range)):
        if len(value) == 0:
            tensor = torch.empty(0, dtype=_INT64)
        else:
            try:
                tensor = _int_list_tensor(value)
            except (TypeError, ValueError, RuntimeError, OverflowError) as err:
                outside = [j for j, v in enumerate(value) if _is_int(v) and not -_INT64_MAX - 1 <= v <= _INT64_MAX]
                if outside:
                    j = outside[0]
                    raise ValueError(f"sample {index}: {field}[{j}] = {value[j]} does not fit in int64 (token "
                                     f"ids and labels are int64)") from None
                raise TypeError(f"sample {index}: {field} must be a list of ints ({err})") from None
    else:
        raise TypeError(
            f"sample {index}: {field} must be a 1-D torch tensor, numpy array or list of ints, "
            f"got {type(value).__name__}"
        )
    if tensor.dim() != 1:
        raise ValueError(f"sample {index}: {field} must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"sample {index}: {field} must hold integers, got {tensor.dtype}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"sample {index}: {field} is on {tensor.device}; pack_batch packs CPU tensors "
            "(move the packed batch with .to(device))"
        )
    return tensor


def _check_int64_range(signed_view: np.ndarray, index: int, field: str) -> None:
    """uint64 values seen as int64: a negative one was >= 2**63 and would wrap around."""
    wrapped = np.flatnonzero(signed_view < 0)
    if wrapped.size:
        j = int(wrapped[0])
        raise ValueError(
            f"sample {index}: {field}[{j}] = {int(signed_view[j]) + 2**64} does not fit in int64 "
            f"(token ids and labels are int64, at most {_INT64_MAX})"
        )


def _as_int64_parts(parts: Sequence[Any], field: str) -> list[torch.Tensor]:
    """Every sample's ``field`` as an int64 tensor, or the error naming the first bad sample."""
    return [_as_sequence(x, i, field).to(_INT64) for i, x in enumerate(parts)]


def _check_each(ids: Sequence[Any], labels: Sequence[Any] | None) -> None:
    """Raise the error of the first bad sample, if any."""
    for i, x in enumerate(ids):
        x = _as_sequence(x, i, "input_ids")
        if labels is not None and labels[i] is not ids[i]:
            y = _as_sequence(labels[i], i, "labels")
            if y.numel() != x.numel():
                raise ValueError(
                    f"sample {i}: labels has {y.numel()} tokens but input_ids has {x.numel()}"
                )


# ---------------------------------------------------------------------------------------------------------
# the text core

_numba_fill: Callable[..., int] | None = None


def _resolve_backend(backend: str) -> str:
    """The backend that runs: "numba" if asked (ImportError if missing) or auto and importable."""
    global _numba_fill
    if backend == "torch":
        return "torch"
    if _numba_fill is None:
        try:
            from .cpu.collate import varlen_fields_into
        except ImportError:
            if backend == "numba":
                raise
            return "torch"
        _numba_fill = varlen_fields_into
    return "numba"


def warmup(backend: str = "auto") -> None:
    """Import and compile (or load from numba's cache) the packing kernel in this process.

    The first ``pack_batch`` in a process otherwise pays this (about a second to compile, tens of
    milliseconds from cache). Call it in the main process before DataLoader workers fork, so they
    inherit the compiled kernel; :class:`PackCollator` does it on construction.
    """
    if _resolve_backend(backend) == "numba":
        from .cpu.collate import warmup as warmup_kernel

        warmup_kernel()


_warmup = warmup


def _fill_torch(
    seg_lens: list[int],
    num_samples: int,
    mask_first_label: bool,
    ignore_index: int,
    labels: torch.Tensor,
    position_ids: torch.Tensor,
    seq_idx: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
) -> int:
    """Vectorized torch twin of ``cpu.collate.varlen_fields_into`` (same arguments, as tensors)."""
    num_segments = len(seg_lens)
    total = labels.shape[0]
    lens = torch.tensor(seg_lens, dtype=_INT64)
    seq_lens.zero_()
    seq_lens[:num_segments] = lens
    cu_seqlens[0] = 0
    cu_seqlens[1:] = torch.cumsum(seq_lens, 0)
    starts = cu_seqlens[:num_segments].to(_INT64)
    position_ids.copy_(torch.arange(total) - starts.repeat_interleave(lens, output_size=total))
    seq_idx.copy_(
        torch.arange(num_segments, dtype=torch.int32).repeat_interleave(lens, output_size=total)
    )
    if mask_first_label:
        first = starts[:num_samples][lens[:num_samples] > 0]
        labels[first] = ignore_index
    return max(seg_lens)


def _round_max_seqlen(max_seqlen: int, buckets: int | tuple[int, ...]) -> int:
    if isinstance(buckets, tuple):
        for bucket in buckets:
            if bucket >= max_seqlen:
                return bucket
        raise ValueError(
            f"max_seqlen {max_seqlen} is longer than the largest of max_seqlen_buckets ({buckets[-1]})"
        )
    return -(-max_seqlen // buckets) * buckets


def _shared_buffers(total: int, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, total) int64 and (total + 2 * num_slots + 1,) int32 views of one shared-memory storage.

    Allocated directly in shared memory (as default_collate does in workers), so sending the batch to the
    main process copies nothing and passes one storage: each storage costs a shared-memory segment and
    a file descriptor (measured: packing plus pickling 16 samples for a worker queue takes about 2 ms
    this way against 9 to 10 ms with separately allocated fields).
    """
    numel32 = total + 2 * num_slots + 1
    storage = torch.UntypedStorage._new_shared(8 * 3 * total + 4 * numel32)
    buf64 = torch.empty(0, dtype=_INT64).set_(storage, 0, (3, total), (total, 1))
    buf32 = torch.empty(0, dtype=torch.int32).set_(storage, 2 * 3 * total, (numel32,), (1,))
    return buf64, buf32


def pack_sequences(
    input_ids: Sequence[Any],
    labels: Sequence[Any] | None = None,
    *,
    options: PackOptions | None = None,
    shared: bool | None = None,
) -> dict[str, Any]:
    """Pack token sequences into the text fields of a :class:`PackedBatch` (as a plain dict).

    input_ids: B sequences, each a 1-D integer torch tensor, numpy array or list of ints.
    labels: None (labels are copies of ``input_ids``) or B sequences of the same lengths; an entry may be
        None for a copy of that sample's ``input_ids``.
    options: :class:`PackOptions` (defaults if None).
    shared: allocate the outputs in shared memory; None: only inside a DataLoader worker.
    Returns the fields listed in the module docstring: ``input_ids``/``labels``/``position_ids`` ``(1, T)``
    int64, ``seq_idx`` ``(1, T)`` int32, ``cu_seqlens`` ``(S + 1,)`` int32, ``seq_lens`` ``(S,)`` int32,
    ``max_seqlen`` int, and the Hugging Face aliases.
    """
    opts = _DEFAULT_OPTIONS if options is None else options
    ids = input_ids if type(input_ids) is list else list(input_ids)
    num_samples = len(ids)
    if num_samples == 0:
        raise ValueError("pack_batch got an empty batch: there is nothing to pack")

    # Fast path: tensors. Anything else (lists, numpy arrays, None labels) is converted sample by sample.
    try:
        lens = list(map(_numel, ids))
    except TypeError:
        ids = [_as_sequence(x, i, "input_ids") for i, x in enumerate(ids)]
        lens = list(map(_numel, ids))
    if labels is None:
        labs = ids
    else:
        labs = labels if type(labels) is list else list(labels)
        if len(labs) != num_samples:
            raise ValueError(f"got {len(labs)} labels for {num_samples} input_ids")
        try:
            label_lens = list(map(_numel, labs))
        except TypeError:
            labs = [
                ids[i] if y is None else _as_sequence(y, i, "labels") for i, y in enumerate(labs)
            ]
            label_lens = list(map(_numel, labs))
        if label_lens != lens:
            _check_each(ids, labs)
            raise ValueError("labels and input_ids have different lengths")

    if not opts.allow_empty and 0 in lens:
        _check_each(ids, labs)
        raise ValueError(
            f"sample {lens.index(0)}: input_ids is empty (pass allow_empty=True to keep empty samples "
            "as zero-length segments)"
        )
    total = sum(lens)
    if opts.pad_to_length is None and opts.pad_to_multiple_of is None:
        padded = total
    elif opts.pad_to_length is not None:
        if total > opts.pad_to_length:
            raise ValueError(f"the batch has {total} tokens, more than pad_to_length={opts.pad_to_length}")
        padded = opts.pad_to_length
    elif opts.pad_to_multiple_of is not None:
        padded = -(-total // opts.pad_to_multiple_of) * opts.pad_to_multiple_of
    if padded > _INT32_MAX:
        _check_each(ids, labs)
        raise ValueError(
            f"the batch has {padded} tokens (after padding), more than int32 cu_seqlens can hold "
            f"({_INT32_MAX}); pack fewer samples"
        )
    pad = padded - total
    seg_lens = lens
    ids_in, labs_in = ids, labs
    if pad:
        seg_lens = lens + [pad]
        ids_in = ids + [torch.full((pad,), opts.pad_token_id, dtype=_INT64)]
        labs_in = labs + [torch.full((pad,), opts.ignore_index, dtype=_INT64)]
    num_segments = len(seg_lens)
    num_slots = num_segments
    if opts.max_num_seqs is not None:
        if num_segments > opts.max_num_seqs:
            raise ValueError(
                f"the batch has {num_segments} segments ({num_samples} samples"
                f"{' + padding' if pad else ''}), more than max_num_seqs={opts.max_num_seqs}"
            )
        num_slots = opts.max_num_seqs
    if shared is None:
        shared = torch.utils.data.get_worker_info() is not None

    if shared:
        # Validate first: cat(out=) would resize the shared buffer on a bad shape instead of failing.
        _check_each(ids, labs)
        buf64, buf32 = _shared_buffers(padded, num_slots)
        flat_ids, flat_labels, positions = buf64[0], buf64[1], buf64[2]
        try:
            torch.cat(ids_in, out=flat_ids)
            torch.cat(labs_in, out=flat_labels)
        except RuntimeError:  # unsigned tensors beside int64 ones: torch does not promote them
            torch.cat(_as_int64_parts(ids_in, "input_ids"), out=flat_ids)
            torch.cat(_as_int64_parts(labs_in, "labels"), out=flat_labels)
        seq_idx, cu_seqlens, seq_lens = buf32.split([padded, num_slots + 1, num_slots])
        positions_t, seq_idx_t = buf64[2:3], seq_idx.view(1, padded)
    else:
        try:
            flat_ids = torch.cat(ids_in)
            flat_labels = torch.cat(labs_in)
        except (RuntimeError, TypeError):
            _check_each(ids, labs)
            # every sample is fine alone: unsigned tensors beside int64 ones, which torch does not promote
            flat_ids = torch.cat(_as_int64_parts(ids_in, "input_ids"))
            flat_labels = torch.cat(_as_int64_parts(labs_in, "labels"))
        if not (
            flat_ids.dtype is _INT64
            and flat_labels.dtype is _INT64
            and flat_ids.dim() == 1
            and flat_labels.dim() == 1
            and flat_ids.is_cpu
            and flat_labels.is_cpu
        ):
            if flat_ids.dim() != 1 or flat_ids.dtype not in _INTEGER_DTYPES or not flat_ids.is_cpu:
                _check_each(ids, None)
            if flat_labels.dim() != 1 or flat_labels.dtype not in _INTEGER_DTYPES or not flat_labels.is_cpu:
                _check_each(ids, labs)
            if flat_ids.dtype is _UINT64 or flat_labels.dtype is _UINT64:
                _check_each(ids, labs)  # values >= 2**63 would wrap around in the int64 batch
            if flat_ids.dim() != 1 or flat_labels.dim() != 1:
                raise ValueError("input_ids and labels must be 1-D per sample")
            flat_ids = flat_ids.to(_INT64)
            flat_labels = flat_labels.to(_INT64)
        positions = None

    if _resolve_backend(opts.backend) == "numba":
        if shared:
            pos_np, seq_idx_np = positions.numpy(), seq_idx.numpy()
            cu_np, seq_lens_np = cu_seqlens.numpy(), seq_lens.numpy()
        else:
            # numpy allocates and torch wraps: measured 0.6 us less per call than letting the kernel
            # allocate and return its arrays (numba boxes every array it returns).
            pos_np = _np_empty((1, padded), np.int64)
            seq_idx_np = _np_empty((1, padded), np.int32)
            cu_np = _np_empty(num_slots + 1, np.int32)
            seq_lens_np = _np_empty(num_slots, np.int32)
        max_seqlen = _numba_fill(  # type: ignore[misc]
            np.array(seg_lens, dtype=np.int64),
            num_samples,
            opts.mask_first_label,
            opts.ignore_index,
            flat_labels.numpy(),
            pos_np.reshape(-1),
            seq_idx_np.reshape(-1),
            cu_np,
            seq_lens_np,
        )
        if not shared:
            positions_t = _from_numpy(pos_np)
            seq_idx_t = _from_numpy(seq_idx_np)
            cu_seqlens = _from_numpy(cu_np)
            seq_lens = _from_numpy(seq_lens_np)
    else:
        if not shared:
            positions_t = torch.empty((1, padded), dtype=_INT64)
            seq_idx_t = torch.empty((1, padded), dtype=torch.int32)
            cu_seqlens = torch.empty(num_slots + 1, dtype=torch.int32)
            seq_lens = torch.empty(num_slots, dtype=torch.int32)
        max_seqlen = _fill_torch(
            seg_lens,
            num_samples,
            opts.mask_first_label,
            opts.ignore_index,
            flat_labels,
            positions_t[0],
            seq_idx_t[0],
            cu_seqlens,
            seq_lens,
        )
    if opts.max_seqlen_buckets is not None:
        max_seqlen = _round_max_seqlen(max_seqlen, opts.max_seqlen_buckets)
    return {
        "input_ids": flat_ids[None],
        "labels": flat_labels[None],
        "position_ids": positions_t,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "seq_lens": seq_lens,
        "seq_idx": seq_idx_t,
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


# ---------------------------------------------------------------------------------------------------------
# samples -> PackedBatch


def _sample_error(samples: Sequence[Any]) -> None:
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"sample {i} must be a mapping with an 'input_ids' field, got {type(sample).__name__}"
            )
        if "input_ids" not in sample:
            raise ValueError(f"sample {i} has no 'input_ids' field (fields: {sorted(map(str, sample))})")


def _collect_per_sample(values: list[Any]) -> Any:
    """Numbers and 0-d tensors (all present) stack into a (B,) tensor; anything else stays a list."""
    if all(isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, complex) for v in values):
        return torch.tensor(values)
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in values):
        return torch.stack(values)
    return values


def _pack_token_field(
    samples: Sequence[Mapping[str, Any]], name: str, lens: list[int], padded: int
) -> torch.Tensor:
    parts = []
    for i, sample in enumerate(samples):
        if name not in sample:
            raise ValueError(f"sample {i} has no {name!r} field (named in token_fields)")
        value = sample[name]
        # a reversed numpy view has negative strides, which torch cannot wrap: copy it
        if isinstance(value, np.ndarray):
            tensor = torch.from_numpy(np.ascontiguousarray(value))
        else:
            tensor = torch.as_tensor(value)
        if tensor.dim() != 1 or tensor.shape[0] != lens[i]:
            raise ValueError(
                f"sample {i}: token field {name!r} must be 1-D with {lens[i]} values (one per token), "
                f"got shape {tuple(tensor.shape)}"
            )
        parts.append(tensor)
    total = sum(lens)
    if padded > total:
        parts.append(torch.zeros(padded - total, dtype=parts[0].dtype))
    return torch.cat(parts)[None]


def _resolve_packer(spec: str | Callable[..., None]) -> Callable[..., None]:
    if callable(spec):
        return spec
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module, __package__), function)


def _add_extra_fields(
    samples: Sequence[Mapping[str, Any]], fields: dict[str, Any], opts: PackOptions
) -> None:
    keys: dict[str, None] = {}
    for sample in samples:
        for key in sample:
            if key != "input_ids" and key != "labels":
                keys[key] = None
    num_samples = len(samples)
    lens = fields["seq_lens"][:num_samples].tolist()
    padded = fields["input_ids"].shape[1]
    for name in opts.token_fields:
        fields[name] = _pack_token_field(samples, name, lens, padded)
    packers: dict[Callable[..., None], None] = {}
    if opts.mrope:
        packers[_resolve_packer(_MROPE_PACKER)] = None
    for key in keys:
        if key in opts.token_fields:
            continue
        if key in _FIELD_PACKERS:
            packers[_resolve_packer(_FIELD_PACKERS[key])] = None
            continue
        if key == "attention_mask":
            # Packing drops padding-free attention masks: the segment boundaries replace them.
            for i, sample in enumerate(samples):
                if key in sample and not bool(torch.as_tensor(sample[key]).all()):
                    raise ValueError(
                        f"sample {i}: attention_mask has zeros; pack_batch packs unpadded samples, "
                        "strip the padding first"
                    )
            continue
        if key in _RESERVED:
            first = next(i for i, s in enumerate(samples) if key in s)
            raise ValueError(f"sample {first} has a {key!r} field, which pack_batch produces itself")
        fields[key] = _collect_per_sample([sample.get(key) for sample in samples])
    for packer in packers:
        packer(samples, fields, opts)


def _pack_samples(samples: Sequence[Mapping[str, Any]], opts: PackOptions) -> PackedBatch:
    if type(samples) is not list and type(samples) is not tuple:
        if isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Sequence):
            raise TypeError(
                f"pack_batch expects a list of samples (mappings), got {type(samples).__name__}"
            )
    try:
        ids = [s["input_ids"] for s in samples]
    except (KeyError, TypeError, IndexError):
        _sample_error(samples)
        raise
    num_samples = len(ids)
    try:
        labs: list[Any] | None = [s["labels"] for s in samples]
        num_keys = 2 * num_samples
    except KeyError:
        labs = [s.get("labels") for s in samples]
        num_keys = num_samples + sum("labels" in s for s in samples)
        if all(y is None for y in labs):
            labs = None
    fields = pack_sequences(ids, labs, options=opts)
    if opts.token_fields or opts.mrope or sum(map(len, samples)) != num_keys:
        _add_extra_fields(samples, fields, opts)
    return PackedBatch._wrap(fields)


def pack_batch(samples: Sequence[Mapping[str, Any]], **options: Any) -> PackedBatch:
    """Pack samples into one varlen batch; usable directly as a DataLoader ``collate_fn``.

    samples: B mappings, each with ``input_ids`` (1-D integer torch tensor, numpy array or list of ints,
        length ``n_i``) and optionally ``labels`` (same length; default a copy of ``input_ids``). Any integer
        dtype is packed as int64; a strided or reversed numpy view is copied.
    options: see :class:`PackOptions` (``pad_to_multiple_of``, ``max_num_seqs``, ...).

    Returns a :class:`PackedBatch` with the fields of the module docstring; ``T = sum(n_i)`` plus padding.
    Extra sample fields: names in ``token_fields`` are concatenated to ``(1, T)``; an ``attention_mask``
    without zeros is dropped (one with zeros raises, packing needs unpadded samples); a field that every
    sample holds as a number or 0-d tensor becomes a ``(B,)`` tensor; any other field becomes a list of
    its B per-sample values (None where a sample lacks it); a field named like an output raises. Vision
    fields (``pixel_values``, ``image_grid_thw``, videos) are packed as the module docstring says, with
    mRoPE ``position_ids`` when ``image_token_id`` is set.

    Errors (ValueError/TypeError naming the sample): empty batch, a sample that is not a mapping or has
    no ``input_ids``, input_ids or labels that are not 1-D or not integers or hold values outside int64
    (uint64 ids >= 2**63 never wrap around), labels of another length, an
    empty sample (unless ``allow_empty=True``: a zero-length segment), more than 2**31 - 1 tokens; for
    vision: pixels of mixed layouts or dtypes, grids that do not cover the pixels, placeholder runs that
    do not match their grid (mRoPE), a ``video_grid_thw`` without ``video_token_id``.
    """
    opts = _DEFAULT_OPTIONS if not options else PackOptions(**options)
    return _pack_samples(samples, opts)




def unpack_batch(batch: Mapping[str, Any], num_samples: int | None = None) -> list[dict[str, Any]]:
    """Split a packed batch back into its samples: the inverse of :func:`pack_batch`.

    batch: a :class:`PackedBatch` (or its dict) from :func:`pack_batch`.
    num_samples: ``B``; needed only when the batch has no ``num_images``/``num_videos`` field (then it
        cannot tell a trailing padding segment from a sample).

    Returns B dicts of views into the packed tensors: ``input_ids`` ``(n_i,)``, ``labels`` ``(n_i,)`` (as
    packed: the first is ``ignore_index`` when ``mask_first_label``), ``position_ids`` ``(1, n_i)`` or, with
    mRoPE, ``(3, 1, n_i)`` / ``(4, 1, n_i)`` (what packing the sample alone gives), ``text_position_ids``
    ``(1, n_i)`` when present, and the sample's vision fields (``pixel_values``, ``image_grid_thw``,
    ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``; absent for a text-only sample).
    Other fields (token fields, per-sample values) are not split.
    """
    if num_samples is None:
        for key in ("num_images", "num_videos"):
            if key in batch:
                num_samples = int(batch[key].shape[0])
                break
        else:
            raise ValueError("num_samples is needed to unpack a batch without num_images/num_videos")
    if not _is_int(num_samples) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    cu = batch["cu_seqlens"].tolist()
    if num_samples >= len(cu):
        raise ValueError(f"num_samples={num_samples} but the batch has {len(cu) - 1} segments")
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
    text_positions = batch.get("text_position_ids")
    out: list[dict[str, Any]] = []
    for i in range(num_samples):
        a, b = cu[i], cu[i + 1]
        sample = {"input_ids": ids[0, a:b], "labels": labels[0, a:b], "position_ids": positions[..., a:b]}
        if text_positions is not None:
            sample["text_position_ids"] = text_positions[:, a:b]
        out.append(sample)
    if any(key in batch for key in VISION_KEYS):
        for sample, vision in zip(out, unpack_batch_vision(batch, num_samples)):
            sample.update(vision)
    return out


class PackCollator:
    """``collate_fn`` with fixed options: ``DataLoader(ds, collate_fn=PackCollator(pad_to_multiple_of=64))``.

    options: see :class:`PackOptions`. warmup: compile the numba kernel now (in the main process, so
    forked DataLoader workers inherit it instead of each compiling on its first batch).
    """

    def __init__(self, *, warmup: bool = True, **options: Any) -> None:
        self.options = PackOptions(**options)
        self.model_inputs: ModelInputs | None = None
        if warmup:
            _warmup(self.options.backend)

    @classmethod
    def for_model(cls, model_or_config: Any, *, warmup: bool = True, **options: Any) -> PackCollator:
        """A collator whose batches a transformers model trains on packed: ``model(**batch)``.

        model_or_config: the model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen2VLForConditionalGeneration``,
            ``Qwen2_5_VLForConditionalGeneration``, ``InternVLForConditionalGeneration``, other text causal LMs)
            or its config.
        options: further :class:`PackOptions` (``pad_to_multiple_of``, ``mrope_convention``, ...); they
            override what is read from the model.

        Reads, with :func:`omnibal_kernels.model_inputs.model_inputs`: the placeholder token ids, spatial
        merge and ``tokens_per_second`` (Qwen-VL mRoPE positions as the model's ``get_rope_index`` numbers
        them, in the ``(4, 1, T)`` layout with the text positions as row 0 that transformers needs to see
        the packing), and the keys the model's ``forward`` accepts. Each batch holds only those keys (no
        ``cu_seqlens``/``max_seqlen``, which a Qwen-VL vision tower would take as its own patch boundaries;
        for Qwen-VL no flash-attention keys either, the text positions carry the boundaries) plus
        ``use_cache=False``, without which transformers skips packed-sequence detection. Samples are as for
        :func:`pack_batch`: ``input_ids``, ``labels``, ``pixel_values`` (Qwen-VL patches with
        ``image_grid_thw``; InternVL tiles ``(n, C, H, W)``), ``pixel_values_videos``, ``video_grid_thw``,
        ``second_per_grid_ts``. :func:`unpack_batch` needs the full batch of a plain :class:`PackCollator`.
        """
        from .model_inputs import model_inputs

        spec = model_inputs(model_or_config)
        collator = cls(warmup=warmup, **{**spec.options, **options})
        collator.model_inputs = spec
        return collator

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> PackedBatch:
        batch = _pack_samples(samples, self.options)
        if self.model_inputs is not None:
            batch = PackedBatch._wrap(self.model_inputs.select(batch._fields))
        return batch

    def __repr__(self) -> str:
        if self.model_inputs is not None:
            return f"PackCollator.for_model({self.model_inputs.model_type!r}, {self.options!r})"
        return f"PackCollator({self.options!r})"
