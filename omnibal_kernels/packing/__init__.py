"""Pack a list of samples into one flash-attention style varlen batch, on the CPU (DataLoader collate side).

:func:`pack_batch` concatenates the samples' tokens into a single row and describes the sequence boundaries
the way flash-attention's varlen kernels and Hugging Face's packed-sequence path expect them. Every batch
(a :class:`PackedBatch`) holds::

    input_ids      (1, T) int64    the samples' tokens back to back (then any padding segment)
    labels         (1, T) int64    the samples' labels, ``ignore_index`` on the first token of every sample
    position_ids   (1, T) int64    0, 1, ... restarting at every segment
    seq_idx        (1, T) int32    segment index of every token (padding is segment ``B``)
    cu_seqlens     (S + 1,) int32  segment starts, 0 first, ``T`` last
    seq_lens       (S,) int32      segment lengths, ``cu_seqlens.diff()``
    max_seqlen     int             longest segment (rounded up to a bucket with ``max_seqlen_buckets``)
    cu_seq_lens_q, cu_seq_lens_k   the same tensor as ``cu_seqlens`` (Hugging Face flash-attention kwargs)
    max_length_q, max_length_k     ``max_seqlen``
    use_cache      False           for transformers: with a cache its sdpa/eager/flex mask ignores the
                                   boundaries in ``position_ids`` (flash-attention reads ``cu_seq_lens_q/k``)
    num_items_in_batch () int64    the optimizer step's label tokens, all ranks and micro-steps (samples of
                                   ``sampler.wrap(dataset)`` with label counts in the lengths only)

``B`` is the number of samples, ``S`` the number of segments: ``B``, plus one when a padding segment is
added, or ``max_num_seqs``. There is no ``attention_mask``: the boundaries are the mask. Multimodal samples
(``pixel_values`` as tiles ``(n, C, H, W)`` or patches ``(n_patches, D)``, optional ``image_grid_thw``
``(k, 3)``; ``pixel_values_videos``/``video_grid_thw``/``second_per_grid_ts`` for videos) add, in sample
order, text-only samples contributing nothing::

    pixel_values     (sum n, C, H, W) or (sum n_patches, D)   all samples' pixels, concatenated
    vit_cu_seqlens   (S_vit + 1,) int32   ViT segments: one per tile, or per frame group of each image grid
    vit_max_seqlen   int
    image_to_sample  (I,) int32           the sample of every image (tile)
    num_images       (B,) int32           images (tiles) per sample
    image_grid_thw   (I, 3) int64         when the samples give grids
    (videos: pixel_values_videos, video_grid_thw, video_vit_cu_seqlens, video_vit_max_seqlen,
    video_to_sample, num_videos, second_per_grid_ts)

With mRoPE on (``PackOptions.image_token_id`` set), ``position_ids`` is ``(3, 1, T)`` (or ``(4, 1, T)``) and
``text_position_ids`` ``(1, T)`` holds the 1-D positions. :func:`unpack_batch` splits a batch back into its
samples. The options are one :class:`PackOptions` (labels, static shapes, mRoPE, backend).

===================== =======================================================================================
``options``           :class:`PackOptions`
``batch``             :class:`PackedBatch`, :class:`LossCounts`, :func:`unpack_batch`
``inputs``            each sample's sequences as int64 tensors, errors naming the sample
``text``              the text core :func:`pack_sequences` (the text fields as a plain dict)
``fields``            the other sample fields: token fields, per-sample values, the vision fields
``planned``           samples of a sampler's plan: loads checked against the lengths, the step's loss counts
``collate``           :func:`pack_batch`, :class:`PackCollator` (which shards packs over context-parallel ranks
                      with :mod:`omnibal_kernels.context_parallel.collate`), :func:`warmup`
===================== =======================================================================================
"""

from __future__ import annotations

from .batch import TEXT_FIELDS, LossCounts, PackedBatch, unpack_batch
from .collate import PackCollator, pack_batch, warmup
from .options import PackOptions
from .text import pack_sequences

__all__ = [
    "TEXT_FIELDS",
    "LossCounts",
    "PackCollator",
    "PackOptions",
    "PackedBatch",
    "pack_batch",
    "pack_sequences",
    "unpack_batch",
    "warmup",
]
