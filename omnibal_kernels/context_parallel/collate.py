"""The collator's context-parallel side: a packed batch -> this CP rank's shard, weighted as the whole pack.

``PackCollator(context_parallel=ContextParallelOptions(size=C))`` (or any collator fed by a sampler planned
with ``context_parallel.size = C``) packs as without it, then shards the packed batch with
:func:`~omnibal_kernels.context_parallel.shard_for_context_parallel` (the same layout on every rank of the
group, without communication) and returns the shard of its CP rank:

* the rank's tokens: ``input_ids``, ``labels``, ``shift_labels`` (each held token's target, its successor in
  its own sequence), ``position_ids`` (positions in the token's own sequence: RoPE as unsharded), the other
  per-token fields, and the local ``cu_seqlens`` / ``seq_lens`` / ``max_seqlen`` / ``seq_idx`` (one segment
  per held chunk) and ``cu_seqlens_k`` / ``max_seqlen_k`` (keys per segment), as the shard's ``batch``;
* ``context_parallel_shard``: the :class:`~omnibal_kernels.context_parallel.ContextParallelShard` (token
  indices, exchange plan), which the registered transformers attention reads from ``model(**batch)``;
* for a vision-language model (``PackCollator.for_model`` of Qwen2-VL, Qwen2.5-VL, InternVL): the pixels and
  grids of the images (frame groups, tiles) this rank encodes, a balanced share of the pack's ViT work, and
  ``context_parallel_shard.vision`` (a :class:`~omnibal_kernels.context_parallel.vision.VisionShard`), the
  routing of their embedding rows to the ranks holding their placeholders (:func:`shard_vision`);
* otherwise the vision fields and every other field that is not per token, unchanged on every rank (each
  rank then encodes every image of the pack);
* ``num_items_in_batch`` and the batch's loss counts of the whole pack (its optimizer step's where the plan
  gives them, else the pack's own targets as the field), never the shard's: the group's ranks each sum their
  own targets' losses over it, so their losses add up to the pack's.

The CP rank: a sampler's batch carries its own (the sampler's rank in its group); otherwise it is fixed when the
collator is built (in the main process, before DataLoader workers start): the argument, else the rank in
``context_parallel_group``, else the process's rank (torch.distributed's, or ``RANK`` / ``WORLD_SIZE`` as
``torchrun`` sets them) in groups of ``C`` consecutive ranks, as
:class:`~omnibal_kernels.BalancedBatchSampler` groups them. Without any of these it is a ValueError, never rank 0.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from .._checks import check_int
from .options import ContextParallelOptions
from .shard import ContextParallelShards, shard_for_context_parallel
from .vision import IMAGE, VIDEO, VisionUnits, patch_units, plan_vision, tile_units

__all__ = ["SHARD_KEY", "ShardedFields", "VisionTokens", "resolve_rank", "shard_fields", "shard_vision"]

SHARD_KEY = "context_parallel_shard"
# The shard's keys a model reads however its forward declares them: the targets across chunk boundaries
# (transformers' losses take shift_labels and then skip their own shift) and the attention's plan.
_ALWAYS = ("shift_labels", SHARD_KEY)


def _process_rank(size: int) -> tuple[int, int]:
    """``(world size, rank)`` of this process: torch.distributed's, else torchrun's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    world, rank = os.environ.get("WORLD_SIZE", "").strip(), os.environ.get("RANK", "").strip()
    if world and rank:
        if not all(v.isascii() and v.isdigit() for v in (world, rank)) or int(world) < 1:
            raise ValueError(
                f"PackCollator: the environment's WORLD_SIZE={world!r} and RANK={rank!r} must be a positive and a "
                "non-negative integer: check the launcher's settings"
            )
        if int(rank) >= int(world):
            raise ValueError(
                f"PackCollator: the environment's RANK={rank} is not a rank of WORLD_SIZE={world} (ranks are "
                f"0 to {int(world) - 1}): check the launcher's settings"
            )
        return int(world), int(rank)
    raise ValueError(
        f"PackCollator: context_parallel.size={size} but this process's CP rank is unknown: pass "
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
            f"PackCollator: context_parallel_group has {group_size} ranks but context_parallel.size is {size}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("PackCollator: this process is not a member of context_parallel_group")
    return int(rank)


def resolve_rank(options: ContextParallelOptions, rank: Any, group: Any) -> Optional[int]:
    """This process's rank in its CP group, as the module docstring says; ``None`` where nothing names it and
    the size is 1 (no sharding)."""
    size = options.size
    if rank is not None and group is not None:
        raise ValueError("PackCollator: give context_parallel_rank or context_parallel_group, not both")
    if rank is not None:
        rank = check_int("context_parallel_rank", rank)
        if not 0 <= rank < size:
            raise ValueError(
                f"PackCollator: context_parallel_rank must be in [0, context_parallel.size={size}), got {rank}"
            )
        return rank
    if group is not None:
        return _group_rank(size, group)
    if size == 1:
        return None
    world, process_rank = _process_rank(size)
    if world % size:
        raise ValueError(
            f"PackCollator: context_parallel.size={size} does not divide the world size {world}: the "
            "ranks must form whole context-parallel groups (or pass context_parallel_rank=)"
        )
    return process_rank % size


def _sample_targets(fields: dict[str, Any], num_samples: int, ignore_index: int) -> tuple[int, ...]:
    """Each sample's targets in the pack: its labels after its first token that are not ``ignore_index`` (what
    the shards' ``shift_labels`` hold of it, over all ranks)."""
    labels = fields["labels"][0].numpy()
    cu = fields["cu_seqlens"][: num_samples + 1].numpy().astype(np.int64)
    trained = labels != ignore_index
    trained[cu[:-1][cu[:-1] < labels.size]] = False
    owner = np.searchsorted(cu, np.flatnonzero(trained), side="right") - 1
    return tuple(np.bincount(owner[owner < num_samples], minlength=num_samples).tolist())


class ShardedFields(NamedTuple):
    """One CP rank's part of a packed batch: its ``fields`` (with ``context_parallel_shard``), each sample's
    targets over the whole pack, the pack's target count (``None`` without labels), and every rank's shard."""

    fields: dict[str, Any]
    sample_targets: tuple[int, ...]
    num_items_in_batch: Optional[int]
    shards: ContextParallelShards


def shard_fields(
    fields: dict[str, Any],
    options: ContextParallelOptions,
    rank: int,
    *,
    num_samples: int,
    replicate: Sequence[str],
    pad_token_id: int,
    ignore_index: int,
    keys: Optional[frozenset[str]] = None,
) -> ShardedFields:
    """Rank ``rank``'s shard of a packed batch's ``fields`` (``pack_batch``'s, without ``num_items_in_batch``).

    ``replicate``: the fields that are not per token, copied to every rank; ``keys``: the keys a model's forward
    takes (``PackCollator.for_model``): the shard keeps those of its fields plus ``shift_labels`` and
    ``context_parallel_shard``; None: every field.
    """
    shards = shard_for_context_parallel(
        fields, options, pad_token_id=pad_token_id, ignore_index=ignore_index, replicate=replicate
    )
    shard = shards[rank]
    out = dict(shard.batch)
    if keys is not None:
        out = {k: v for k, v in out.items() if k in keys or k in _ALWAYS}
    out[SHARD_KEY] = shard
    return ShardedFields(out, _sample_targets(fields, num_samples, ignore_index), shards.num_items_in_batch, shards)


def per_token(value: Any, total: int) -> bool:
    """Whether a batch field holds one value per token of a ``total``-token batch (``(..., 1, total)``)."""
    return isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[-2:]) == (1, total)


class VisionTokens(NamedTuple):
    """What a vision-language model's batch needs for its vision shards: the placeholder ids and the vision
    tower's geometry (``tokens_per_tile`` set: a tile model, else a patch model)."""

    image_token_id: int
    video_token_id: Optional[int] = None
    spatial_merge_size: int = 1
    tokens_per_tile: Optional[int] = None


# The pixel and grid fields of each kind in a patch model's batch.
_PATCH_FIELDS = {IMAGE: ("pixel_values", "image_grid_thw"), VIDEO: ("pixel_values_videos", "video_grid_thw")}


def _rank_patch_fields(fields: dict[str, Any], units: VisionUnits, mine: np.ndarray) -> dict[str, Any]:
    """A patch model's pixels and grids of the units ``mine`` (consecutive frame groups of a grid row merged
    back into one row), and ``second_per_grid_ts`` of its video rows."""
    out: dict[str, Any] = {}
    for kind, (pixel_key, grid_key) in _PATCH_FIELDS.items():
        if fields.get(pixel_key) is None:
            continue
        ids = mine[units.kind[mine] == kind]
        starts = np.r_[True, (np.diff(ids) != 1) | (np.diff(units.item[ids]) != 0)] if ids.size else np.zeros(0, bool)
        group = np.cumsum(starts) - 1
        frames = np.bincount(group, minlength=int(starts.sum())) if ids.size else np.zeros(0, np.int64)
        grid = units.grid[ids[starts]].copy()
        grid[:, 0] = frames
        spans = zip(units.pixel_start[ids].tolist(), units.pixel_rows[ids].tolist())
        rows = np.concatenate([np.arange(s, s + n) for s, n in spans] or [np.zeros(0, np.int64)])
        pixels = fields[pixel_key]
        out[pixel_key] = pixels.index_select(0, torch.from_numpy(rows.astype(np.int64)).to(pixels.device))
        out[grid_key] = torch.from_numpy(grid.astype(np.int64)).to(fields[grid_key].device)
        seconds = fields.get("second_per_grid_ts")
        if kind == VIDEO and isinstance(seconds, torch.Tensor):
            items = torch.from_numpy(units.item[ids[starts]].astype(np.int64)).to(seconds.device)
            out["second_per_grid_ts"] = seconds.index_select(0, items)
    return out


def shard_vision(
    fields: dict[str, Any],
    sharded: ShardedFields,
    rank: int,
    tokens: VisionTokens,
    options: ContextParallelOptions,
) -> dict[str, Any]:
    """Rank ``rank``'s batch of a vision-language pack: ``sharded.fields`` with the pixels and grids of the
    units it encodes in place of the pack's, and ``context_parallel_shard.vision`` set; ``sharded.fields``
    unchanged for a pack without images.

    ``fields``: the whole packed batch (``pack_batch``'s fields).

    Raises:
        ValueError: placeholders that do not match the images' embedding rows.
    """
    out = dict(sharded.fields)
    pixels = fields.get("pixel_values")
    videos = fields.get("pixel_values_videos")
    if pixels is None and videos is None:
        return out
    if tokens.tokens_per_tile is not None:
        units = tile_units(0 if pixels is None else int(pixels.shape[0]), tokens.tokens_per_tile, options.cost)
    else:
        units = patch_units(
            fields.get("image_grid_thw"), fields.get("video_grid_thw"), tokens.spatial_merge_size, options.cost
        )
    ids = fields["input_ids"][0].cpu().numpy()
    indices = [s.indices.cpu().numpy() for s in sharded.shards]
    vision = plan_vision(ids, indices, units, (tokens.image_token_id, tokens.video_token_id), ranks=[rank])[0]
    if tokens.tokens_per_tile is not None:
        assert pixels is not None
        rank_fields = {"pixel_values": pixels.index_select(0, vision.units.to(pixels.device))}
    else:
        rank_fields = _rank_patch_fields(fields, units, vision.units.numpy())
    shard = out[SHARD_KEY]
    # the shard's own batch drops the pack's pixels too, so that moving it moves only this rank's
    batch: Any = type(shard.batch)({k: rank_fields.get(k, v) for k, v in shard.batch.items()})
    out.update({k: v for k, v in rank_fields.items() if k in out})
    out[SHARD_KEY] = dataclasses.replace(shard, batch=batch, vision=vision)
    return out
