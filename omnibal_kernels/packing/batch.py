"""The batch type of :func:`~omnibal_kernels.packing.pack_batch` (:class:`PackedBatch`, the fields the text core
produces) and its inverse, :func:`unpack_batch`."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Callable, NamedTuple, Optional

import torch

from ..vision.fields import VISION_KEYS, unpack_batch_vision

__all__ = ["TEXT_FIELDS", "LossCounts", "PackedBatch", "unpack_batch"]

# The fields of every packed batch (see omnibal_kernels.packing); a sample may not carry one of these, it
# would be silently overwritten.
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
    "use_cache",
)


class LossCounts(NamedTuple):
    """What weights one packed batch's loss within its optimizer step (:attr:`PackedBatch.loss_counts`).

    Attributes:
        sample_lens: each sample's tokens, in batch order (padding not included).
        num_items_in_batch: label tokens (targets after the causal shift) of the whole optimizer step over all
            ranks and micro-steps; None where not known (lengths without label counts, batches outside a plan).
        num_samples_in_batch: samples with at least one target in the optimizer step, counted the same way.
        epoch, step, micro_step, micro_steps_per_step, world_size: the batch's place in a sampler's plan (None
            for a batch outside a plan).
        takes_num_items: the batch hands ``num_items_in_batch`` to the model as a field (every batch of a
            plain collator; with ``for_model``, where the model's forward takes it).
        sample_targets: for a context-parallel shard (which holds a part of each sample's tokens), each
            sample's targets over the whole pack; None for a whole pack (its labels give them).
    """

    sample_lens: tuple[int, ...]
    num_items_in_batch: Optional[int] = None
    num_samples_in_batch: Optional[int] = None
    epoch: Optional[int] = None
    step: Optional[int] = None
    micro_step: Optional[int] = None
    micro_steps_per_step: Optional[int] = None
    world_size: Optional[int] = None
    takes_num_items: bool = True
    sample_targets: Optional[tuple[int, ...]] = None


class PackedBatch(Mapping[str, Any]):
    """The output of :func:`pack_batch`: a read-only mapping of field name -> tensor / int / list.

    Works with ``model(**batch)``; fields are also attributes (``batch.cu_seqlens``). ``.to(device)`` and
    ``.pin_memory()`` return a new PackedBatch and move a tensor shared by several keys (``cu_seqlens``
    and ``cu_seq_lens_q``/``_k``) once, keeping it shared. Pickles as its dict of fields and its
    :attr:`loss_counts`.
    """

    __slots__ = ("_fields", "_loss_counts")

    def __init__(self, fields: Mapping[str, Any], loss_counts: Optional[LossCounts] = None) -> None:
        self._fields = dict(fields)
        self._loss_counts = loss_counts

    @classmethod
    def _wrap(cls, fields: dict[str, Any], loss_counts: Optional[LossCounts] = None) -> PackedBatch:
        batch = object.__new__(cls)
        batch._fields = fields
        batch._loss_counts = loss_counts
        return batch

    @property
    def loss_counts(self) -> Optional[LossCounts]:
        """How this batch's loss is weighted in its optimizer step (:class:`LossCounts`; not a field, so
        ``model(**batch)`` never sees it); None for a batch not made by the collators."""
        return self._loss_counts

    def with_counts(self, counts: LossCounts) -> PackedBatch:
        """A copy with :attr:`loss_counts` ``counts`` and, where ``counts.takes_num_items``, the field
        ``num_items_in_batch`` (a 0-d int64 tensor) set from it."""
        fields = dict(self._fields)
        if counts.takes_num_items and counts.num_items_in_batch is not None:
            fields["num_items_in_batch"] = torch.tensor(counts.num_items_in_batch, dtype=torch.int64)
        return PackedBatch._wrap(fields, counts)

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_fields", "_loss_counts"):
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"PackedBatch has no field {name!r}") from None

    def __reduce__(self) -> tuple[Callable[..., PackedBatch], tuple[dict[str, Any], Optional[LossCounts]]]:
        return (PackedBatch, (self._fields, self._loss_counts))

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
            if hasattr(type(value), "_map_tensors"):
                # a context-parallel shard: its batch's tensors are this batch's, moved once and kept shared
                return value._map_tensors(apply)
            if isinstance(value, list):
                return [apply(v) for v in value]
            if isinstance(value, tuple):
                return tuple(apply(v) for v in value)
            return value

        return PackedBatch._wrap({key: apply(value) for key, value in self._fields.items()}, self._loss_counts)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """Every tensor (also inside list fields) moved to ``device``; ints and other values as they are."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> PackedBatch:
        """Every CPU tensor copied to pinned memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map_tensors(lambda t: t.pin_memory() if t.device.type == "cpu" else t)


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
    if not isinstance(num_samples, numbers.Integral) or isinstance(num_samples, bool) or num_samples < 1:
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
