"""``pack_batch`` and :class:`PackCollator`: samples -> one :class:`~omnibal_kernels.packing.PackedBatch`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..context_parallel import ContextParallelCost
from ..cpu.varlen_metadata import warmup as _warmup_fill
from ..model_inputs import ModelInputs, model_inputs
from ..sampler.steps import PlannedSamples
from .batch import PackedBatch
from .context_parallel import context_parallel_collate, shard_packed_batch
from .fields import add_sample_fields
from .inputs import sample_error
from .options import PackOptions, with_keywords
from .planned import batch_counts, check_planned_loads
from .text import pack_sequences

__all__ = ["PackCollator", "pack_batch", "warmup"]

# The forward arguments of vision-language models: their forward merges every image's features into the
# placeholders of input_ids, which a context-parallel shard holds only a part of.
_VISION_INPUTS = frozenset({"pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "image_flags"})


def warmup(backend: str = "auto") -> None:
    """Import and compile (or load from numba's cache) the numba fill of ``pack_batch`` in this process.

    The first ``pack_batch`` of a process pays this otherwise (a compile, or a load from numba's on-disk
    cache). Call it in the main process before DataLoader workers fork, so they inherit the compiled
    kernel; :class:`PackCollator` does it on construction. ``backend`` as in :class:`PackOptions`.
    """
    _warmup_fill(backend)


def _pack_samples(samples: Sequence[Mapping[str, Any]], opts: PackOptions, takes_num_items: bool = True) -> PackedBatch:
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
    whole optimizer step over all ranks and micro-steps. Every batch has :attr:`PackedBatch.loss_counts`, and
    ``use_cache=False``: a transformers causal LM given ``model(**batch)`` then finds the samples from
    ``position_ids`` (sdpa, eager and flex attention; with a cache, which ``use_cache`` on builds, it would let
    them attend to each other) or reads ``cu_seq_lens_q/k`` (flash-attention), and trains each sample's loss.

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

    Its batches are :func:`pack_batch`'s: every field, ``use_cache=False`` included, so ``model(**batch)`` of a
    transformers text causal LM trains the per-sample loss (docs/guides/packing-transformers.md); the plain
    torch models and varlen attention of this library read ``cu_seqlens``/``max_seqlen``. :meth:`for_model`
    keeps only the keys a model reads; Qwen2-VL and Qwen2.5-VL need it (their vision tower would take
    ``cu_seqlens`` for its patch boundaries, their text model the plain positions for one sequence).

    options, keywords: as for :func:`pack_batch` (keywords replace the fields of ``options`` they name).
    warmup: compile the numba fill now (in the main process, so forked DataLoader workers inherit it
        instead of each compiling on its first batch).
    context_parallel_size: ranks of a context-parallel group, ``C`` (default 1: whole packs). With ``C > 1``
        every batch is this CP rank's shard of the packed batch (:mod:`omnibal_kernels.packing.context_parallel`
        lists its fields): give every rank of the group the same samples (a ``BalancedBatchSampler`` with the
        same ``context_parallel_size`` does) and each gets its part.
    context_parallel_rank: this process's rank in its CP group, in ``[0, C)``; None: the rank in
        ``context_parallel_group``, else the process's rank modulo ``C`` (torch.distributed's, or torchrun's
        ``RANK``), else a ValueError. Fixed when the collator is built.
    context_parallel_group: the CP process group (only to read this process's rank in it).
    strategy, pad_sequences, max_rank_tokens, context_parallel_cost: how packs are sharded, as
        :func:`~omnibal_kernels.shard_for_context_parallel` takes them (its ``cost``).
    """

    def __init__(
        self,
        options: PackOptions | None = None,
        *,
        warmup: bool = True,
        context_parallel_size: int = 1,
        context_parallel_rank: int | None = None,
        context_parallel_group: Any = None,
        strategy: str = "auto",
        pad_sequences: bool = False,
        max_rank_tokens: int | None = None,
        context_parallel_cost: ContextParallelCost | None = None,
        **keywords: Any,
    ) -> None:
        if isinstance(options, (list, tuple)):
            raise TypeError(
                f"PackCollator was called with a batch of {len(options)} samples: collate_fn must be an instance, "
                "collate_fn=PackCollator(...) or PackCollator.for_model(model), not the class PackCollator"
            )
        self.options = with_keywords("PackCollator", options, keywords)
        self.context_parallel = context_parallel_collate(
            context_parallel_size,
            context_parallel_rank,
            context_parallel_group,
            strategy,
            context_parallel_cost,
            pad_sequences,
            max_rank_tokens,
        )
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
        if collator.context_parallel is not None and spec.keys & _VISION_INPUTS:
            raise ValueError(
                f"PackCollator.for_model: context_parallel_size > 1 with a {spec.model_type!r} model: its forward "
                "merges the features of all the pack's images into the placeholders it is given, and a shard holds "
                "only some of them; shard text models, or use PackCollator(context_parallel_size=...) with a model "
                "that takes each rank's placeholders"
            )
        collator.model_inputs = spec
        return collator

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> PackedBatch:
        spec = self.model_inputs
        if spec is None:
            batch = _pack_samples(samples, self.options)
        else:
            batch = _pack_samples(samples, self.options, "num_items_in_batch" in spec.keys)
            selected = spec.select(batch._fields)
            if self.context_parallel is None:
                return PackedBatch._wrap(selected, batch.loss_counts)
        if self.context_parallel is None:
            return batch
        keys = None if spec is None else frozenset(spec.keys) | frozenset(spec.constants)
        shard = shard_packed_batch(batch, self.context_parallel, self.options, keys)
        if spec is not None:
            shard._fields.update(spec.constants)
        return shard

    def __repr__(self) -> str:
        cp = self.context_parallel
        extra = (
            ""
            if cp is None
            else (f", context_parallel_size={cp.size}, context_parallel_rank={cp.rank}, strategy={cp.strategy!r}")
        )
        if self.model_inputs is not None:
            return f"PackCollator.for_model({self.model_inputs.model_type!r}, {self.options!r}{extra})"
        return f"PackCollator({self.options!r}{extra})"
