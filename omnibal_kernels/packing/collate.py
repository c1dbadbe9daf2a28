"""``pack_batch`` and :class:`PackCollator`: samples -> one :class:`~omnibal_kernels.packing.PackedBatch`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._warnings import OmnibalWarning
from ..context_parallel.collate import VisionTokens, per_token, resolve_rank, shard_fields, shard_vision
from ..context_parallel.options import ContextParallelOptions
from ..cpu.varlen_metadata import warmup as _warmup_fill
from ..model_inputs import MROPE_MODEL_TYPES, TILE_MODEL_TYPES, ModelInputs, model_inputs
from ..sampler.steps import PlannedSamples
from ..streaming import StreamPack
from .batch import TEXT_FIELDS, PackedBatch
from .fields import add_sample_fields
from .inputs import sample_error
from .options import PackOptions, check_options
from .planned import batch_counts, check_planned_loads
from .text import pack_sequences

__all__ = ["PackCollator", "pack_batch", "warmup"]

# The forward arguments of vision-language models: their forward merges every image's features into the
# placeholders of input_ids, which a context-parallel shard holds only a part of.
_VISION_INPUTS = frozenset({"pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "image_flags"})


def _vision_tokens(spec: ModelInputs) -> VisionTokens | None:
    """The placeholder ids and vision geometry that shard a vision-language model's packs (Qwen2-VL,
    Qwen2.5-VL, InternVL); None for other models."""
    if spec.model_type in MROPE_MODEL_TYPES:
        options = spec.options
        return VisionTokens(
            int(options["image_token_id"]), int(options["video_token_id"]), int(options["spatial_merge_size"])
        )
    if spec.model_type in TILE_MODEL_TYPES and spec.tile_token_id is not None:
        return VisionTokens(spec.tile_token_id, None, 1, spec.tokens_per_tile)
    return None


def warmup(backend: str = "auto") -> None:
    """Import and compile (or load from numba's cache) the numba fill of ``pack_batch`` in this process.

    The first ``pack_batch`` of a process pays this otherwise (a compile, or a load from numba's on-disk
    cache). Call it in the main process before DataLoader workers fork, so they inherit the compiled
    kernel; :class:`PackCollator` does it on construction. ``backend`` as in :class:`PackOptions`.
    """
    _warmup_fill(backend)


def _warn_stream_loss() -> None:
    """A stream's batches reach the model without their step's count of label tokens (the warnings filters
    show it once per place it comes from)."""
    warnings.warn(
        "collating a BalancedPacker's packs outside omnibal_kernels.step_batches: their batches carry no count "
        "of their optimizer step's label tokens (num_items_in_batch, loss_counts), so a model's loss would be "
        "each pack's own mean, not the per-token mean of the step; iterate step_batches(loader, "
        "micro_steps_per_step=...), which counts them with one all-reduce per step",
        OmnibalWarning,
        stacklevel=4,
    )


def _pack_samples(samples: Sequence[Mapping[str, Any]], opts: PackOptions, takes_num_items: bool = True) -> PackedBatch:
    if type(samples) is not list and type(samples) is not tuple:
        if isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Sequence):
            raise TypeError(f"pack_batch expects a list of samples (mappings), got {type(samples).__name__}")
        if isinstance(samples, PlannedSamples) and samples.check_loads:
            check_planned_loads(samples)
        if isinstance(samples, StreamPack) and not samples.counted_per_step:
            _warn_stream_loss()
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
    if opts.token_fields or opts.mrope_enabled or sum(map(len, samples)) != num_keys:
        add_sample_fields(samples, fields, opts)
    counts = batch_counts(samples, fields, opts, takes_num_items)
    if takes_num_items and counts.num_items_in_batch is not None:
        fields["num_items_in_batch"] = torch.tensor(counts.num_items_in_batch, dtype=torch.int64)
    return PackedBatch._wrap(fields, counts)


def pack_batch(samples: Sequence[Mapping[str, Any]], options: PackOptions | None = None) -> PackedBatch:
    """Pack samples into one varlen batch; usable directly as a DataLoader ``collate_fn``.

    samples: B mappings, each with ``input_ids`` (1-D integer torch tensor, numpy array or list of ints,
        length ``n_i``) and optionally ``labels`` (same length; default a copy of ``input_ids``). Any integer
        dtype is packed as int64; a strided or reversed numpy view is copied. Other fields are packed as
        :mod:`omnibal_kernels.packing.fields` says (token fields, per-sample values, vision fields).
    options: a :class:`PackOptions`; None: the defaults.

    Returns a :class:`PackedBatch` with the fields listed in :mod:`omnibal_kernels.packing`;
    ``T = sum(n_i)`` plus padding. Samples of ``sampler.wrap(dataset)`` (a planned micro-step) are first checked
    against their length entries (tokens, ViT load, label tokens: :mod:`omnibal_kernels.packing.planned`), and
    with label counts in the lengths the batch gets ``num_items_in_batch`` (0-d int64): the label tokens of the
    whole optimizer step over all ranks and micro-steps. Every batch has :attr:`PackedBatch.loss_counts`, and
    ``use_cache=False``: a transformers causal LM given ``model(**batch)`` then finds the samples from
    ``position_ids`` (sdpa, eager and flex attention; with a cache, which ``use_cache`` on builds, it would let
    them attend to each other) or reads ``cu_seq_lens_q/k`` (flash-attention), and trains each sample's loss.
    ``pack_batch`` never shards: a sampler planned with context parallelism needs a :class:`PackCollator`.

    Errors (ValueError/TypeError naming the sample): empty batch, a sample that is not a mapping or has
    no ``input_ids``, input_ids or labels that are not 1-D or not integers or hold values outside int64
    (uint64 ids >= 2**63 never wrap around), negative input_ids (naming the position), labels of another
    length, an empty sample (unless ``allow_empty=True``: a zero-length segment), more than 2**31 - 1 tokens,
    a batch over the static limits; a planned sample whose loads differ from its length entry; for vision:
    pixels of mixed layouts or dtypes, grids that do not cover the pixels, placeholder runs that do not match
    their grid (mRoPE), a ``video_grid_thw`` without ``video_token_id``.
    """
    if isinstance(samples, PlannedSamples) and samples.step.context_parallel.enabled:
        raise ValueError(
            f"pack_batch: the sampler plans with context_parallel.size={samples.step.context_parallel.size}, so "
            "each rank of a group must get its shard of the pack: use collate_fn=PackCollator() (or "
            "PackCollator.for_model(model)), which shards planned batches"
        )
    return _pack_samples(samples, check_options("pack_batch", options))


class PackCollator:
    """``collate_fn`` with fixed options: ``DataLoader(ds, collate_fn=PackCollator(PackOptions(...)))``.

    Its batches are :func:`pack_batch`'s: every field, ``use_cache=False`` included, so ``model(**batch)`` of a
    transformers text causal LM trains the per-sample loss (docs/guides/packing-transformers.md); the plain
    torch models and varlen attention of this library read ``cu_seqlens``/``max_seqlen``. :meth:`for_model`
    keeps only the keys a model reads; Qwen2-VL and Qwen2.5-VL need it (their vision tower would take
    ``cu_seqlens`` for its patch boundaries, their text model the plain positions for one sequence).

    options: a :class:`PackOptions` (None: the defaults).
    context_parallel: how packs are sharded over a context-parallel group
        (:class:`~omnibal_kernels.context_parallel.ContextParallelOptions`); with ``size = C > 1`` every batch
        is this CP rank's shard of the packed batch (:mod:`omnibal_kernels.context_parallel.collate` lists its
        fields). None: the options of the sampler whose batches arrive (``sampler.wrap(dataset)``: a sampler
        planned with ``PlanOptions(context_parallel=...)`` hands its options and this rank's place in its group
        to the collator with every batch), else whole packs. Given beside such a sampler, they must be the
        sampler's.
    context_parallel_rank: this process's rank in its CP group, in ``[0, C)``; None: the sampler's (with its
        batches), else the rank in ``context_parallel_group``, else the process's rank modulo ``C``
        (torch.distributed's, or torchrun's ``RANK``), else a ValueError. Fixed when the collator is built.
    context_parallel_group: the CP process group (only to read this process's rank in it).
    warmup: compile the numba fill now (in the main process, so forked DataLoader workers inherit it
        instead of each compiling on its first batch).
    """

    def __init__(
        self,
        options: PackOptions | None = None,
        *,
        context_parallel: ContextParallelOptions | None = None,
        context_parallel_rank: int | None = None,
        context_parallel_group: Any = None,
        warmup: bool = True,
    ) -> None:
        if isinstance(options, (list, tuple)):
            raise TypeError(
                f"PackCollator was called with a batch of {len(options)} samples: collate_fn must be an instance, "
                "collate_fn=PackCollator(...) or PackCollator.for_model(model), not the class PackCollator"
            )
        self.options = check_options("PackCollator", options)
        if context_parallel is not None and not isinstance(context_parallel, ContextParallelOptions):
            raise TypeError(
                f"PackCollator: context_parallel must be a ContextParallelOptions or None, "
                f"got {type(context_parallel).__name__}"
            )
        self.context_parallel = context_parallel
        self.context_parallel_rank = resolve_rank(
            context_parallel or ContextParallelOptions(), context_parallel_rank, context_parallel_group
        )
        self.model_inputs: ModelInputs | None = None
        if warmup:
            _warmup_fill(self.options.backend)

    @classmethod
    def for_model(
        cls,
        model_or_config: Any,
        options: PackOptions | None = None,
        *,
        context_parallel: ContextParallelOptions | None = None,
        context_parallel_rank: int | None = None,
        context_parallel_group: Any = None,
        warmup: bool = True,
    ) -> PackCollator:
        """A collator whose batches a transformers model trains on packed: ``model(**batch)``.

        model_or_config: the model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen2VLForConditionalGeneration``,
            ``Qwen2_5_VLForConditionalGeneration``, ``InternVLForConditionalGeneration``, other text causal LMs)
            or its config.
        options: further options (a :class:`PackOptions`); what is read from the model replaces the fields of
            ``options`` it names.
        context_parallel, context_parallel_rank, context_parallel_group, warmup: as for :class:`PackCollator`.

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

        With ``context_parallel.size > 1`` each batch is this CP rank's shard; for Qwen2-VL, Qwen2.5-VL and
        InternVL it holds the pixels and grids of the rank's share of the pack's images and their embedding
        routing (:mod:`omnibal_kernels.context_parallel.collate`), which a model prepared by
        :func:`omnibal_kernels.context_parallel.apply_context_parallel` reads (docs/guides/vlm-context-parallel.md).
        """
        spec = model_inputs(model_or_config)
        options = check_options("PackCollator.for_model", options).replace(**spec.options)
        collator = cls(
            options,
            context_parallel=context_parallel,
            context_parallel_rank=context_parallel_rank,
            context_parallel_group=context_parallel_group,
            warmup=warmup,
        )
        collator.model_inputs = spec
        if context_parallel is not None and context_parallel.enabled:
            collator._check_model_shards(context_parallel)
        return collator

    def _check_model_shards(self, context_parallel: ContextParallelOptions) -> None:
        spec = self.model_inputs
        if spec is not None and spec.keys & _VISION_INPUTS and _vision_tokens(spec) is None:
            raise ValueError(
                f"PackCollator.for_model: context_parallel.size={context_parallel.size} with a {spec.model_type!r} "
                "model: its forward merges the features of all the pack's images into the placeholders it is "
                "given, and a shard holds only some of them; shard text models, or use "
                "PackCollator(context_parallel=...) with a model that takes each rank's placeholders"
            )

    def _shards_of(self, samples: Sequence[Any]) -> tuple[ContextParallelOptions, int] | None:
        """The CP options and rank this batch is sharded with (None: a whole pack), from the sampler's plan
        where the samples carry one, checked against the collator's own."""
        own = self.context_parallel
        step = samples.step if isinstance(samples, PlannedSamples) else None
        if step is None:
            if own is None or not own.enabled:
                return None
            assert self.context_parallel_rank is not None
            return own, self.context_parallel_rank
        planned = step.context_parallel
        if own is not None and own != planned:
            raise ValueError(
                f"PackCollator: the collator shards with {own} but the sampler planned its batches with {planned}; "
                "pass the sampler's options (PackCollator(context_parallel=sampler.context_parallel)) or none"
            )
        if not planned.enabled:
            return None
        rank = self.context_parallel_rank
        if rank is not None and rank != step.context_parallel_rank:
            raise ValueError(
                f"PackCollator: context_parallel_rank {rank} but the sampler's batches are for CP rank "
                f"{step.context_parallel_rank} of its group; build both with the same process rank"
            )
        self._check_model_shards(planned)
        return planned, step.context_parallel_rank

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> PackedBatch:
        spec = self.model_inputs
        takes_num_items = spec is None or "num_items_in_batch" in spec.keys
        batch = _pack_samples(samples, self.options, takes_num_items)
        sharding = self._shards_of(samples)
        if sharding is None:
            return batch if spec is None else PackedBatch._wrap(spec.select(batch._fields), batch.loss_counts)
        shard = self._shard(batch, *sharding)
        if spec is not None:
            shard._fields.update(spec.constants)
        return shard

    def _shard(self, batch: PackedBatch, context_parallel: ContextParallelOptions, rank: int) -> PackedBatch:
        """This CP rank's shard of ``batch``, weighted as the whole pack (see ``context_parallel.collate``)."""
        spec = self.model_inputs
        keys = None if spec is None else frozenset(spec.keys) | frozenset(spec.constants)
        fields = batch.to_dict()
        fields.pop("num_items_in_batch", None)
        total = int(fields["input_ids"].shape[1])
        scalar = (type(None), bool, int, float, str)
        replicate = [
            k
            for k, v in fields.items()
            if k not in TEXT_FIELDS and not isinstance(v, scalar) and not per_token(v, total)
        ]
        counts = batch.loss_counts
        assert counts is not None, "the collators' batches carry their loss counts"
        sharded = shard_fields(
            fields,
            context_parallel,
            rank,
            num_samples=len(counts.sample_lens),
            replicate=replicate,
            pad_token_id=self.options.pad_token_id,
            ignore_index=self.options.ignore_index,
            keys=keys,
        )
        counts = counts._replace(sample_targets=sharded.sample_targets)
        items = counts.num_items_in_batch if counts.num_items_in_batch is not None else sharded.num_items_in_batch
        tokens = None if spec is None else _vision_tokens(spec)
        out = sharded.fields if tokens is None else shard_vision(fields, sharded, rank, tokens, context_parallel)
        if counts.takes_num_items and items is not None:
            out["num_items_in_batch"] = torch.tensor(items, dtype=torch.int64)
        return PackedBatch._wrap(out, counts)

    def __repr__(self) -> str:
        cp = self.context_parallel
        extra = "" if cp is None else f", context_parallel={cp!r}, context_parallel_rank={self.context_parallel_rank}"
        if self.model_inputs is not None:
            return f"PackCollator.for_model({self.model_inputs.model_type!r}, {self.options!r}{extra})"
        return f"PackCollator({self.options!r}{extra})"
