"""The options of :func:`~omnibal_kernels.packing.pack_batch` and :class:`~omnibal_kernels.packing.PackCollator`:
one frozen :class:`PackOptions`, checked once, where it is built.

Its fields come in four groups (the docstring lists them): the labels, static shapes (padding, fixed segment
slots and ``max_seqlen`` buckets, so that torch.compile and CUDA graphs see few distinct batches), Qwen2-VL /
Qwen2.5-VL multimodal rotary positions, and how samples are read and packed.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Optional, Union

from .._checks import check_backend
from ..vision.mrope import check_mrope_convention
from .batch import TEXT_FIELDS

__all__ = ["DEFAULT_OPTIONS", "PackOptions", "check_options"]


def is_int(value: object) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_bools(options: object, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(options, name), bool):
            raise TypeError(f"{name} must be a bool, got {getattr(options, name)!r}")


@dataclass(frozen=True)
class PackOptions:
    """How samples become one packed batch. Built once, checked once: a wrong type is a ``TypeError``, a wrong
    value a ``ValueError``, naming the field; :meth:`replace` makes a checked copy.

    Labels:
        mask_first_label: put ``ignore_index`` on the first label of every sample, so that with the usual
            shift-by-one loss no sample learns to predict its first token from the previous sample.
        ignore_index: the label value the loss skips (also the label of padding tokens).

    Static shapes:
        pad_to_multiple_of: pad the total length ``T`` up to a multiple of this (tensor cores, sequence or
            context parallel splits). The padding is its own segment (``pad_token_id``, labels
            ``ignore_index``, positions from 0), never glued onto a sample; attention over it costs like a
            sample of that length.
        pad_to_length: pad ``T`` to exactly this; a batch with more tokens raises ValueError. Choose it close
            to the planned pack capacity.
        pad_token_id: the ``input_ids`` value of padding tokens.
        max_num_seqs: ``cu_seqlens`` always has ``max_num_seqs + 1`` entries (``seq_lens`` ``max_num_seqs``), the
            unused ones describing zero-length segments at the end; a batch with more segments (padding
            segment included) raises ValueError.
        max_seqlen_buckets: round ``max_seqlen`` up to a multiple of this int, or to the smallest of these
            increasing ints that holds it (ValueError if none does).

    Multimodal rotary positions (Qwen2-VL, Qwen2.5-VL; numbered by :mod:`omnibal_kernels.vision.mrope`):
        image_token_id: the image placeholder token (Qwen2-VL's ``<|image_pad|>``). Setting it turns on mRoPE
            for every batch, text-only ones included, so the shape of ``position_ids`` never changes between
            batches: ``position_ids`` becomes ``(3, 1, T)`` (each sample as ``get_rope_index`` numbers it,
            restarting per sample; padding like text) and ``text_position_ids`` ``(1, T)`` keeps the 1-D
            positions that packed-sequence detection reads. None: no mRoPE, ``position_ids`` ``(1, T)``.
        video_token_id: the video placeholder token (``<|video_pad|>``); needs ``image_token_id``.
        spatial_merge_size: the vision tower's spatial merge (2 for Qwen2-VL/2.5-VL): an image of grid
            ``(t, h, w)`` takes ``t * h * w / merge**2`` placeholder tokens.
        tokens_per_second: Qwen2.5-VL videos: temporal positions ``floor(k * (tokens_per_second *
            second_per_grid_t))`` in float32, as transformers computes them, from the samples'
            ``second_per_grid_ts`` (missing ones count as 1.0, as transformers does); None: Qwen2-VL's ``0..t-1``.
        mrope_text_row: make ``position_ids`` ``(4, 1, T)`` with ``text_position_ids`` as row 0, the layout in
            which recent transformers Qwen-VL text models take the text positions for packed sequences.
        mrope_convention: where text continues after a long video: ``"max_hw"`` or ``"max_position"`` (see
            :mod:`omnibal_kernels.vision.mrope`). None: the one the installed transformers computes
            (``"max_position"`` without transformers), resolved when mRoPE is on.

    Samples:
        allow_empty: keep empty samples as zero-length segments; by default an empty sample raises ValueError.
        token_fields: names of extra per-sample fields that hold one value per token; they are concatenated
            like ``input_ids`` into ``(1, T)`` (padding 0) instead of being collected per sample.
        backend: how the per-token fields are filled, a ``"packing"`` backend of
            :data:`omnibal_kernels._checks.BACKENDS`: ``"auto"`` (numba when it imports), ``"numba"`` (fused
            one-pass kernel) or ``"torch"`` (vectorized torch ops); benchmarks/bench_pack.py times them.

    :meth:`PackCollator.for_model <omnibal_kernels.packing.PackCollator.for_model>` sets the mRoPE fields from a
    transformers model.
    """

    mask_first_label: bool = True
    ignore_index: int = -100
    pad_to_multiple_of: Optional[int] = None
    pad_to_length: Optional[int] = None
    pad_token_id: int = 0
    max_num_seqs: Optional[int] = None
    max_seqlen_buckets: Union[int, tuple[int, ...], None] = None
    image_token_id: Optional[int] = None
    video_token_id: Optional[int] = None
    spatial_merge_size: int = 2
    tokens_per_second: Optional[float] = None
    mrope_text_row: bool = False
    mrope_convention: Optional[str] = None
    allow_empty: bool = False
    token_fields: tuple[str, ...] = ()
    backend: str = "auto"

    def __post_init__(self) -> None:
        _check_bools(self, "mask_first_label", "mrope_text_row", "allow_empty")
        if not is_int(self.ignore_index):
            raise TypeError(f"ignore_index must be an int, got {self.ignore_index!r}")
        self._check_static()
        self._check_mrope()
        object.__setattr__(self, "token_fields", _check_token_fields(self.token_fields))
        object.__setattr__(self, "backend", check_backend("PackOptions", self.backend, "packing"))

    def _check_static(self) -> None:
        if not is_int(self.pad_token_id):
            raise TypeError(f"pad_token_id must be an int, got {self.pad_token_id!r}")
        for name in ("pad_to_multiple_of", "pad_to_length", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.pad_to_length is not None and self.pad_to_multiple_of is not None:
            if self.pad_to_length % self.pad_to_multiple_of:
                raise ValueError(
                    f"pad_to_length={self.pad_to_length} is not a multiple of "
                    f"pad_to_multiple_of={self.pad_to_multiple_of}"
                )
        buckets: Any = self.max_seqlen_buckets  # whatever the caller passed, checked here
        if buckets is None:
            return
        if is_int(buckets):
            if buckets < 1:
                raise ValueError(f"max_seqlen_buckets must be positive, got {buckets}")
            return
        try:
            buckets = tuple(buckets)
        except TypeError:
            raise TypeError(f"max_seqlen_buckets must be an int or a sequence of ints, got {buckets!r}") from None
        if not buckets or not all(is_int(b) and b >= 1 for b in buckets):
            raise ValueError(f"max_seqlen_buckets must be positive ints, got {buckets!r}")
        if any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise ValueError(f"max_seqlen_buckets must be strictly increasing, got {buckets!r}")
        object.__setattr__(self, "max_seqlen_buckets", buckets)

    def _check_mrope(self) -> None:
        for name in ("image_token_id", "video_token_id"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise TypeError(f"{name} must be an int or None, got {value!r}")
        if self.video_token_id is not None and self.image_token_id is None:
            raise ValueError("video_token_id needs image_token_id (mRoPE numbers images and videos together)")
        if not is_int(self.spatial_merge_size) or self.spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size must be a positive int, got {self.spatial_merge_size!r}")
        tps = self.tokens_per_second
        if tps is not None and (isinstance(tps, bool) or not isinstance(tps, numbers.Real) or not tps > 0):
            raise ValueError(f"tokens_per_second must be a positive number or None, got {tps!r}")
        if self.mrope_convention is not None or self.mrope_enabled:
            object.__setattr__(self, "mrope_convention", check_mrope_convention(self.mrope_convention))

    @property
    def mrope_enabled(self) -> bool:
        """Whether batches get mRoPE ``position_ids`` (``image_token_id`` is set)."""
        return self.image_token_id is not None

    def round_max_seqlen(self, max_seqlen: int) -> int:
        """``max_seqlen`` rounded up to its bucket (itself without ``max_seqlen_buckets``)."""
        buckets = self.max_seqlen_buckets
        if buckets is None:
            return max_seqlen
        if isinstance(buckets, tuple):
            for bucket in buckets:
                if bucket >= max_seqlen:
                    return bucket
            raise ValueError(
                f"max_seqlen {max_seqlen} is longer than the largest of max_seqlen_buckets ({buckets[-1]})"
            )
        return -(-max_seqlen // buckets) * buckets

    def replace(self, **changes: Any) -> PackOptions:
        """A copy with the fields named in ``changes`` replaced, checked again."""
        return dataclasses.replace(self, **changes)


def _check_token_fields(token_fields: object) -> tuple[str, ...]:
    if isinstance(token_fields, str):
        raise TypeError("token_fields must be a sequence of field names, not a str")
    names: tuple[Any, ...] = tuple(token_fields)  # type: ignore[arg-type]  # tuple() raises the TypeError
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"token_fields must hold str names, got {name!r}")
        if name in TEXT_FIELDS or name == "attention_mask":
            raise ValueError(f"token_fields may not name {name!r}: pack_batch handles it itself")
    return names


DEFAULT_OPTIONS = PackOptions()


def check_options(fn: str, options: object) -> PackOptions:
    """``options`` when it is a ``PackOptions`` (``None``: :data:`DEFAULT_OPTIONS`), else a ``TypeError`` naming
    ``fn``, the function that takes it."""
    if options is None:
        return DEFAULT_OPTIONS
    if not isinstance(options, PackOptions):
        raise TypeError(f"{fn}: options must be a PackOptions or None, got {type(options).__name__}")
    return options
