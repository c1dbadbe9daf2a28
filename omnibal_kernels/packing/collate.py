"""``pack_batch`` and :class:`PackCollator`: samples -> one :class:`~omnibal_kernels.packing.PackedBatch`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..cpu.varlen_metadata import warmup as _warmup_fill
from ..model_inputs import ModelInputs, model_inputs
from ..sampler.steps import PlannedSamples
from .batch import PackedBatch
from .fields import add_sample_fields
from .inputs import sample_error
from .options import PackOptions, with_keywords
from .planned import batch_counts, check_planned_loads
from .text import pack_sequences

__all__ = ["PackCollator", "pack_batch", "warmup"]


def warmup(backend: str = "auto") -> None:
    """Import and compile (or load from numba's cache) the numba fill of ``pack_batch`` in this process.

    The first ``pack_batch`` of a process pays this otherwise (a compile, or a load from numba's on-disk
    cache). Call it in the main process before DataLoader workers fork, so they inherit the compiled
    kernel; :class:`PackCollator` does it on construction. ``backend`` as in :class:`PackOptions`.
    """
    _warmup_fill(backend)


def _pack_samples(samples: Sequence[Mapping[str, Any]], opts: PackOptions,
                  takes_num_items: bool = True) -> PackedBatch:
    if type(samples) is not list and type(samples) is not tuple:
        if isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Sequence):
            raise TypeError(f"pack_batch expects a list of samples (mappings), got {type(samples).__name__}")
        if isinstance(samples, PlannedSamples) and samples.check_loads:
            check_planned_loads(samples)
    try:
        ids = [s["input_ids"] for s in samples]
    except (KeyError, TypeError, IndexError):
        sample_error(samples)
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
    if opts.token_fields or opts.mrope.enabled or sum(map(len, samples)) != num_keys:
        add_sample_fields(samples, fields, opts)
    counts = batch_counts(samples, fields, opts, takes_num_items)
    if takes_num_items and counts.num_items_in_batch is not None:
        fields["num_items_in_batch"] = torch.tensor(counts.num_items_in_batch, dtype=torch.int64)
    return PackedBatch._wrap(fields, counts)


def pack_batch(
    samples: Sequence[Mapping[str, Any]], options: PackOptions | None = None, **keywords: Any
) -> PackedBatch:
    """Pack samples into one varlen batch; usable directly as a DataLoader ``collate_fn``.

    samples: B mappings, each with ``input_ids`` (1-D integer torch tensor, numpy array or list of ints,
        length ``n_i``) and optionally ``labels`` (same length; default a copy of ``input_ids``). Any integer
        dtype is packed as int64; a strided or reversed numpy view is copied. Other fields are packed as
        :mod:`omnibal_kernels.packing.fields` says (token fields, per-sample values, vision fields).
    options: a :class:`PackOptions`; None: the defaults.
    keywords: options by name (``pad_to_multiple_of=64``, ``image_token_id=...``: any field of
        :class:`PackOptions` or of its parts); beside ``options`` they replace the fields they name.

    Returns a :class:`PackedBatch` with the fields listed in :mod:`omnibal_kernels.packing`;
    ``T = sum(n_i)`` plus padding. Samples of ``sampler.wrap(dataset)`` (a planned micro-step) are first checked
    against their length entries (tokens, ViT load, label tokens: :mod:`omnibal_kernels.packing.planned`), and
    with label counts in the lengths the batch gets ``num_items_in_batch`` (0-d int64): the label tokens of the
    whole optimizer step over all ranks and micro-steps. Every batch has :attr:`PackedBatch.loss_counts`.

    Errors (ValueError/TypeError naming the sample): empty batch, a sample that is not a mapping or has
    no ``input_ids``, input_ids or labels that are not 1-D or not integers or hold values outside int64
    (uint64 ids >= 2**63 never wrap around), negative input_ids (naming the position), labels of another
    length, an empty sample (unless ``allow_empty=True``: a zero-length segment), more than 2**31 - 1 tokens,
    a batch over the static limits; a planned sample whose loads differ from its length entry; for vision:
    pixels of mixed layouts or dtypes, grids that do not cover the pixels, placeholder runs that do not match
    their grid (mRoPE), a ``video_grid_thw`` without ``video_token_id``.
    """
    return _pack_samples(samples, with_keywords("pack_batch", options, keywords))


class PackCollator:
    """``collate_fn`` with fixed options: ``DataLoader(ds, collate_fn=PackCollator(pad_to_multiple_of=64))``.

    options, keywords: as for :func:`pack_batch` (keywords replace the fields of ``options`` they name).
    warmup: compile the numba fill now (in the main process, so forked DataLoader workers inherit it
        instead of each compiling on its first batch).
    """

    def __init__(self, options: PackOptions | None = None, *, warmup: bool = True, **keywords: Any) -> None:
        if isinstance(options, (list, tuple)):
            raise TypeError(
                f"PackCollator was called with a batch of {len(options)} samples: collate_fn must be an instance, "
                "collate_fn=PackCollator(...) or PackCollator.for_model(model), not the class PackCollator")
        self.options = with_keywords("PackCollator", options, keywords)
        self.model_inputs: ModelInputs | None = None
        if warmup:
            _warmup_fill(self.options.backend)

    @classmethod
    def for_model(
        cls, model_or_config: Any, options: PackOptions | None = None, *, warmup: bool = True, **keywords: Any
    ) -> PackCollator:
        """A collator whose batches a transformers model trains on packed: ``model(**batch)``.

        model_or_config: the model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen2VLForConditionalGeneration``,
            ``Qwen2_5_VLForConditionalGeneration``, ``InternVLForConditionalGeneration``, other text causal LMs)
            or its config.
        options, keywords: further options, as for :func:`pack_batch`; what is read from the model replaces
            the fields of ``options`` it names, and ``keywords`` replace both.

        Reads, with :func:`omnibal_kernels.model_inputs.model_inputs`: the placeholder token ids, spatial
        merge and ``tokens_per_second`` (Qwen-VL mRoPE positions as the model's ``get_rope_index`` numbers
        them, in the ``(4, 1, T)`` layout with the text positions as row 0 that transformers needs to see
        the packing), and the keys the model's ``forward`` accepts. Each batch holds only those keys (no
        ``cu_seqlens``/``max_seqlen``, which a Qwen-VL vision tower would take as its own patch boundaries;
        for Qwen-VL no flash-attention keys either, the text positions carry the boundaries) plus
        ``use_cache=False``, without which transformers skips packed-sequence detection. Samples are as for
        :func:`pack_batch`: ``input_ids``, ``labels``, ``pixel_values`` (Qwen-VL patches with
        ``image_grid_thw``; InternVL tiles ``(n, C, H, W)``), ``pixel_values_videos``, ``video_grid_thw``,
        ``second_per_grid_ts``. :func:`~omnibal_kernels.packing.unpack_batch` needs the full batch of a plain
        :class:`PackCollator`.
        """
        spec = model_inputs(model_or_config)
        collator = cls(options, warmup=warmup, **{**spec.options, **keywords})
        collator.model_inputs = spec
        return collator

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> PackedBatch:
        if self.model_inputs is None:
            return _pack_samples(samples, self.options)
        batch = _pack_samples(samples, self.options, "num_items_in_batch" in self.model_inputs.keys)
        return PackedBatch._wrap(self.model_inputs.select(batch._fields), batch.loss_counts)

    def __repr__(self) -> str:
        if self.model_inputs is not None:
            return f"PackCollator.for_model({self.model_inputs.model_type!r}, {self.options!r})"
        return f"PackCollator({self.options!r})"
