"""The collator's context-parallel side: a packed batch -> this CP rank's shard, weighted as the whole pack.

``PackCollator(context_parallel_size=C)`` packs as without it, then shards the packed batch with
:func:`~omnibal_kernels.shard_for_context_parallel` (the same layout on every rank of the group, without
communication) and returns the shard of its CP rank as a :class:`~omnibal_kernels.packing.PackedBatch`:

* the rank's tokens: ``input_ids``, ``labels``, ``shift_labels`` (each held token's target, its successor in
  its own sequence), ``position_ids`` (positions in the token's own sequence: RoPE as unsharded), the other
  per-token fields, and the local ``cu_seqlens`` / ``seq_lens`` / ``max_seqlen`` / ``seq_idx`` (one segment
  per held chunk) and ``cu_seqlens_k`` / ``max_seqlen_k`` (keys per segment), as the shard's ``batch``;
* ``context_parallel_shard``: the :class:`~omnibal_kernels.ContextParallelShard` (token indices, exchange
  plan), which the registered transformers attention reads from ``model(**batch)``;
* the vision fields and every other field that is not per token, unchanged on every rank: the ViT is not
  context-parallel, every rank of the group encodes the pack's images (its ViT load is the pack's);
* ``num_items_in_batch`` and :attr:`~omnibal_kernels.packing.PackedBatch.loss_counts` of the whole pack (its
  optimizer step's where the plan gives them, else the pack's own targets as the field), never the shard's:
  the group's ranks each sum their own targets' losses over it, so their losses add up to the pack's.

The CP rank is fixed when the collator is built (in the main process, before DataLoader workers start): the
argument, else the rank in ``context_parallel_group``, else the process's rank (torch.distributed's, or
``RANK`` / ``WORLD_SIZE`` as ``torchrun`` sets them) in groups of ``C`` consecutive ranks, as
:class:`~omnibal_kernels.BalancedBatchSampler` groups them. Without any of these it is a ValueError, never rank 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from .._checks import check_int, check_positive_int
from ..context_parallel import ContextParallelCost, shard_for_context_parallel
from ..context_parallel.strategy import check_strategy_args
from .batch import TEXT_FIELDS, PackedBatch
from .options import PackOptions

__all__ = ["ContextParallelCollate", "context_parallel_collate", "shard_packed_batch"]

SHARD_KEY = "context_parallel_shard"
# The shard's keys a model reads however its forward declares them: the targets across chunk boundaries
# (transformers' losses take shift_labels and then skip their own shift) and the attention's plan.
_ALWAYS = ("shift_labels", SHARD_KEY)


@dataclass(frozen=True)
class ContextParallelCollate:
    """How a collator shards its batches: group size, this process's CP rank, and the strategy's arguments."""

    size: int
    rank: int
    strategy: str
    cost: Optional[ContextParallelCost]
    pad_sequences: bool
    max_rank_tokens: Optional[int]


def _process_rank(size: int) -> tuple[int, int]:
    """``(world size, rank)`` of this process: torch.distributed's, else torchrun's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    world, rank = os.environ.get("WORLD_SIZE", "").strip(), os.environ.get("RANK", "").strip()
    if world.isdigit() and rank.isdigit():
        return int(world), int(rank)
    raise ValueError(
        f"PackCollator: context_parallel_size={size} but this process's CP rank is unknown: pass "
        "context_parallel_rank= (or context_parallel_group=), or build the collator after "
        "torch.distributed.init_process_group (or under torchrun, which sets RANK and WORLD_SIZE)"
    )


def _group_rank(size: int, group: Any) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "PackCollator: context_parallel_group given but no torch.distributed process group is initialized"
        )
    group_size = dist.get_world_size(group)
    if group_size != size:
        raise ValueError(
            f"PackCollator: context_parallel_group has {group_size} ranks but context_parallel_size is {size}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("PackCollator: this process is not a member of context_parallel_group")
    return int(rank)


def _resolve_rank(size: int, rank: Any, group: Any) -> int:
    if rank is not None and group is not None:
        raise ValueError("PackCollator: give context_parallel_rank or context_parallel_group, not both")
    if rank is not None:
        rank = check_int("context_parallel_rank", rank)
        if not 0 <= rank < size:
            raise ValueError(
                f"PackCollator: context_parallel_rank must be in [0, context_parallel_size={size}), got {rank}"
            )
        return rank
    if group is not None:
        return _group_rank(size, group)
    world, process_rank = _process_rank(size)
    if world % size:
        raise ValueError(
            f"PackCollator: context_parallel_size={size} does not divide the world size {world}: the "
            "ranks must form whole context-parallel groups (or pass context_parallel_rank=)"
        )
    return process_rank % size


def context_parallel_collate(
    size: Any, rank: Any, group: Any, strategy: Any, cost: Any, pad_sequences: Any, max_rank_tokens: Any
) -> Optional[ContextParallelCollate]:
    """The checked settings (None for ``size`` 1 without a rank other than 0: no sharding)."""
    size = check_positive_int("context_parallel_size", size)
    check_strategy_args(size, strategy, cost, pad_sequences, max_rank_tokens)
    if size == 1:
        if rank is not None:
            _resolve_rank(1, rank, None)
        return None
    return ContextParallelCollate(
        size, _resolve_rank(size, rank, group), strategy, cost, pad_sequences, max_rank_tokens
    )


def _per_token(value: Any, total: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[-2:]) == (1, total)


def _sample_targets(fields: dict[str, Any], num_samples: int, ignore_index: int) -> tuple[int, ...]:
    """Each sample's targets in the pack: its labels after its first token that are not ``ignore_index`` (what
    the shards' ``shift_labels`` hold of it, over all ranks)."""
    labels = fields["labels"][0].numpy()
    cu = fields["cu_seqlens"][: num_samples + 1].numpy().astype(np.int64)
    trained = labels != ignore_index
    trained[cu[:-1][cu[:-1] < labels.size]] = False
    owner = np.searchsorted(cu, np.flatnonzero(trained), side="right") - 1
    return tuple(np.bincount(owner[owner < num_samples], minlength=num_samples).tolist())


def shard_packed_batch(
    batch: PackedBatch, settings: ContextParallelCollate, options: PackOptions, keys: Optional[frozenset[str]] = None
) -> PackedBatch:
    """The CP rank's shard of ``batch`` (``pack_batch``'s, with every field), as the module docstring says.

    ``keys``: the keys a model's forward takes (``PackCollator.for_model``); the shard keeps those of its
    fields plus ``shift_labels`` and ``context_parallel_shard``. None: every field.
    """
    fields = batch.to_dict()
    fields.pop("num_items_in_batch", None)
    total = int(fields["input_ids"].shape[1])
    scalar = (type(None), bool, int, float, str)
    replicate = [
        k for k, v in fields.items() if k not in TEXT_FIELDS and not isinstance(v, scalar) and not _per_token(v, total)
    ]
    ignore_index = options.labels.ignore_index
    shards = shard_for_context_parallel(
        fields,
        settings.size,
        settings.strategy,
        cost=settings.cost,
        pad_sequences=settings.pad_sequences,
        max_rank_tokens=settings.max_rank_tokens,
        pad_token_id=options.static.pad_token_id,
        ignore_index=ignore_index,
        replicate=replicate,
    )
    shard = shards[settings.rank]
    out = dict(shard.batch)
    if keys is not None:
        out = {k: v for k, v in out.items() if k in keys or k in _ALWAYS}
    out[SHARD_KEY] = shard
    counts = batch.loss_counts
    assert counts is not None, "the collators' batches carry their loss counts"
    counts = counts._replace(sample_targets=_sample_targets(fields, len(counts.sample_lens), ignore_index))
    items = counts.num_items_in_batch if counts.num_items_in_batch is not None else shards.num_items_in_batch
    if counts.takes_num_items and items is not None:
        out["num_items_in_batch"] = torch.tensor(items, dtype=torch.int64)
    return PackedBatch._wrap(out, counts)
