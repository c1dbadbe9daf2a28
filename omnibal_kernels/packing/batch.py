"""The batch type of :func:`~omnibal_kernels.packing.pack_batch` (:class:`PackedBatch`, the fields the text core
produces) and its inverse, :func:`unpack_batch`."""
from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch

from ..vision.fields import VISION_KEYS, unpack_batch_vision

__all__ = ["TEXT_FIELDS", "PackedBatch", "unpack_batch"]

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
)


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
