"""The vision work of a context-parallel group: who encodes which image, and where its embedding rows go.

A vision-language pack sharded over ``C`` CP ranks has its placeholder tokens spread over the ranks by the text
layout, but its images are encoded once, by one rank each: the pack's ViT units (an image's frame group for
patch models such as Qwen2-VL, a video frame group likewise, a tile for tile models such as InternVL; the ViT
attends within a unit, so a unit's features do not depend on the others) are divided among the ranks by ViT
cost (:class:`~.cost.ContextParallelCost`'s ``vit_linear * load + vit_quadratic * s**2``), whole units per
rank, balanced before anything else: longest processing time first (a unit stays with the rank holding its
placeholders while that rank keeps within its share), then moves and swaps off the slowest rank while they
shorten it. A unit costlier than a rank's share (``1 / C`` of the pack's ViT work) is never split;
:attr:`VisionWork.oversize` names it.

Each rank encodes its units (images first, then videos, each kind in pack order) and one all-to-all
(:func:`exchange_vision_rows`) delivers every embedding row to the rank whose shard holds its placeholder; a
rank keeps the rows of its own placeholders without sending them. The backward pass returns the rows'
gradients by the reverse all-to-all. Every rank computes every rank's part from the pack alone (the same on
all of them), without communication.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from .cost import ContextParallelCost
from .exchange import exchange_rows

__all__ = [
    "VisionShard",
    "VisionUnits",
    "VisionWork",
    "divide_vision_units",
    "exchange_vision_rows",
    "patch_units",
    "plan_vision",
    "sample_unit_costs",
    "tile_units",
]

IMAGE, VIDEO = 0, 1
# Bounds the improvement passes after the greedy division (each pass moves or swaps one unit).
_MAX_PASSES = 256
# Swaps compare every unit of the slowest rank with every unit of another; beyond this many pairs only moves.
_MAX_SWAP_PAIRS = 1 << 20


@dataclass(frozen=True)
class VisionUnits:
    """The ViT units of one pack, images before videos, each kind in pack order (frame groups in order).

    Attributes (each ``(U,)``):
        kind: ``0`` image, ``1`` video.
        item: the image's (video's, tile's) index within its kind: its row of ``image_grid_thw`` /
            ``video_grid_thw``, or its tile of ``pixel_values``.
        pixel_start, pixel_rows: the unit's rows of its kind's pixel tensor.
        feature_start, feature_rows: the unit's embedding rows within its kind's features, which fill the
            kind's placeholders in packed order.
        grid: ``(U, 3)`` the unit's own grid ``(1, h, w)`` (zeros for tiles).
        cost: float64 predicted ViT time of the unit.
    """

    kind: np.ndarray
    item: np.ndarray
    pixel_start: np.ndarray
    pixel_rows: np.ndarray
    feature_start: np.ndarray
    feature_rows: np.ndarray
    grid: np.ndarray
    cost: np.ndarray

    @property
    def num_units(self) -> int:
        """``U``."""
        return int(self.kind.size)


def _unit_cost(load: np.ndarray, seq: np.ndarray, cost: ContextParallelCost) -> np.ndarray:
    load, seq = load.astype(np.float64), seq.astype(np.float64)
    if cost.vit_linear == 0 and cost.vit_quadratic == 0:
        return load
    return cost.vit_linear * load + cost.vit_quadratic * seq * seq


def _grid_array(grid: Any, name: str) -> np.ndarray:
    if grid is None:
        return np.zeros((0, 3), np.int64)
    rows = np.asarray(grid.detach().cpu() if isinstance(grid, torch.Tensor) else grid, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != 3 or (rows < 0).any():
        raise ValueError(f"{name} must be (n, 3) non-negative (t, h, w) rows, got shape {rows.shape}")
    return rows


def patch_units(
    image_grid_thw: Any, video_grid_thw: Any, spatial_merge_size: int, cost: ContextParallelCost
) -> VisionUnits:
    """The units of a patch model's pack (Qwen2-VL, Qwen2.5-VL): every ``(t, h, w)`` grid row is ``t`` frame
    groups of ``h * w`` patches and ``h * w / spatial_merge_size**2`` embedding rows each, which attend alone.

    Args:
        image_grid_thw, video_grid_thw: ``(n, 3)`` grids of the pack (or None).
        spatial_merge_size: patches per embedding row along each side.
        cost: the cost terms (load and ``s`` of a unit: its patches).
    """
    parts = []
    for kind, grid, name in ((IMAGE, image_grid_thw, "image_grid_thw"), (VIDEO, video_grid_thw, "video_grid_thw")):
        rows = _grid_array(grid, name)
        frames = rows[:, 0]
        item = np.repeat(np.arange(rows.shape[0]), frames)
        patches = np.repeat(rows[:, 1] * rows[:, 2], frames)
        features = patches // (spatial_merge_size**2)
        unit_grid = np.stack([np.ones_like(item), rows[item, 1], rows[item, 2]], axis=1).reshape(-1, 3)
        parts.append((np.full(item.size, kind), item, patches, features, unit_grid))
    return _units(parts, lambda patches: _unit_cost(patches, patches, cost))


def tile_units(num_tiles: int, tokens_per_tile: int, cost: ContextParallelCost) -> VisionUnits:
    """The units of a tile model's pack (InternVL): each of its ``num_tiles`` tiles (one row of
    ``pixel_values``), ``tokens_per_tile`` embedding rows each; a tile's load is 1 (the cost model's tiles)."""
    item = np.arange(num_tiles)
    ones = np.ones(num_tiles, np.int64)
    parts = [(np.full(num_tiles, IMAGE), item, ones, ones * tokens_per_tile, np.zeros((num_tiles, 3), np.int64))]
    return _units(parts, lambda rows: _unit_cost(rows, np.zeros_like(rows), cost))


def _units(parts: Sequence[tuple[np.ndarray, ...]], unit_cost: Callable[[np.ndarray], np.ndarray]) -> VisionUnits:
    kind, item, rows, features, grid, pixel_start, feature_start = [], [], [], [], [], [], []
    for k, i, r, f, g in parts:
        kind.append(k)
        item.append(i)
        rows.append(r)
        features.append(f)
        grid.append(g)
        pixel_start.append(np.cumsum(r) - r)
        feature_start.append(np.cumsum(f) - f)
    cat = [np.concatenate(x).astype(np.int64) for x in (kind, item, pixel_start, rows, feature_start, features)]
    grids = np.concatenate(grid).astype(np.int64).reshape(-1, 3)
    kind_, item_, pixel_start_, rows_, feature_start_, features_ = cat
    return VisionUnits(kind_, item_, pixel_start_, rows_, feature_start_, features_, grids, unit_cost(rows_))


def sample_unit_costs(
    vit: np.ndarray,
    ids: np.ndarray,
    cost: ContextParallelCost,
    vit_seqlens: Optional[np.ndarray] = None,
    vit_seqlens_offsets: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The ViT cost of every unit of the samples ``ids`` from their loads alone (a length file's): each ViT
    sequence of ``vit_seqlens`` is a unit of ``s`` rows; without them a sample's whole ViT load ``vit[i]`` is one
    unit (as :class:`~omnibal_kernels.CostModel` counts it)."""
    ids = np.asarray(ids, dtype=np.int64)
    if vit_seqlens is not None and vit_seqlens_offsets is not None:
        starts, ends = vit_seqlens_offsets[ids], vit_seqlens_offsets[ids + 1]
        spans = [vit_seqlens[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        seq = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    else:
        seq = vit[ids]
    seq = seq[seq > 0]
    return _unit_cost(seq, seq, cost)


def divide_vision_units(costs: np.ndarray, size: int, prefer: Optional[np.ndarray] = None) -> np.ndarray:
    """The rank that encodes each unit: ``(U,)`` int64 in ``[0, size)``.

    Longest processing time first, except that a unit goes to ``prefer[u]`` (the rank holding its
    placeholders, whose rows then need no exchange) while that rank stays within its share of the total or
    ties the least loaded; then single moves and pairwise swaps off the slowest rank while they shorten it.
    Deterministic: the same costs give the same division on every rank.
    """
    costs = np.asarray(costs, dtype=np.float64)
    assign = np.zeros(costs.size, np.int64)
    load = np.zeros(size)
    share = float(costs.sum()) / size * (1 + 1e-12)
    for u in np.lexsort((np.arange(costs.size), -costs)).tolist():
        r = int(np.argmin(load))
        if prefer is not None and load[int(prefer[u])] + costs[u] <= max(share, load[r] + costs[u]):
            r = int(prefer[u])
        assign[u] = r
        load[r] += costs[u]
    for _ in range(_MAX_PASSES):
        if not _improve(costs, assign, load):
            break
    return assign


def _improve(costs: np.ndarray, assign: np.ndarray, load: np.ndarray) -> bool:
    """One move or swap that lowers the slowest rank below its time (in place); False when there is none."""
    slow = int(np.argmax(load))
    mine = np.flatnonzero(assign == slow)
    best, choice = load[slow] * (1 - 1e-12), None
    for r in range(load.size):
        if r == slow or mine.size == 0:
            continue
        moved = np.maximum(load[slow] - costs[mine], load[r] + costs[mine])
        i = int(np.argmin(moved))
        if moved[i] < best:
            best, choice = moved[i], (mine[i], None, r)
        other = np.flatnonzero(assign == r)
        if other.size == 0 or other.size * mine.size > _MAX_SWAP_PAIRS:
            continue
        delta = costs[mine][:, None] - costs[other][None, :]
        swapped = np.where(delta > 0, np.maximum(load[slow] - delta, load[r] + delta), np.inf)
        i, j = (int(x) for x in np.unravel_index(int(np.argmin(swapped)), swapped.shape))
        if swapped[i, j] < best:
            best, choice = swapped[i, j], (mine[i], other[j], r)
    if choice is None:
        return False
    u, v, r = choice
    assign[u] = r
    load[slow] -= costs[u]
    load[r] += costs[u]
    if v is not None:
        assign[v] = slow
        load[r] -= costs[v]
        load[slow] += costs[v]
    return True


@dataclass(frozen=True)
class VisionWork:
    """The vision work of one pack over a CP group (the same on every rank).

    Attributes:
        units: the pack's :class:`VisionUnits`.
        assignment: ``(U,)`` int64, the rank that encodes each unit.
        times: ``(C,)`` float64 predicted ViT time of every rank.
        oversize: the units costlier than a rank's share of the pack's ViT work (``times.sum() / C``): no
            division can balance them.
        rows_exchanged: embedding rows sent between ranks (each to the rank holding its placeholder).
        rows_all_gather: rows an all-gather of every rank's features would deliver (each rank receiving the
            others' rows), what a rank would get if every rank needed every row.
    """

    units: VisionUnits
    assignment: np.ndarray
    times: np.ndarray
    oversize: tuple[int, ...]
    rows_exchanged: int
    rows_all_gather: int

    @property
    def imbalance(self) -> float:
        """Slowest rank's ViT time over the mean (1.0: balanced or no images)."""
        mean = float(self.times.mean()) if self.times.size else 0.0
        return float(self.times.max()) / mean if mean > 0 else 1.0


@dataclass(frozen=True)
class VisionShard:
    """One CP rank's vision work and its embedding rows' routing (``ContextParallelShard.vision``).

    Attributes:
        rank, context_parallel_size: this rank and the group size.
        units: int64 ids (into ``work.units``) of the units this rank encodes, images then videos, pack order.
        encoded_image_rows, encoded_video_rows: embedding rows its encoder gives for its images, its videos
            (its features are their concatenation, images first).
        image_rows, video_rows: image / video placeholders its shard holds (the rows it must end up with).
        send_index: int64 rows of its features sent to the other ranks, grouped by destination rank.
        send_counts, recv_counts: rows sent to / received from each rank (its own entry 0).
        gather_index: ``(image_rows + video_rows,)`` int64 row of ``cat(own features, received)`` for each of
            its image placeholders then video placeholders, in local token order.
        group_exchanges: whether any rank of the group sends a row (every rank skips the collective when none does).
        work: the group's :class:`VisionWork`.
    """

    rank: int
    context_parallel_size: int
    units: torch.Tensor
    encoded_image_rows: int
    encoded_video_rows: int
    image_rows: int
    video_rows: int
    send_index: torch.Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    gather_index: torch.Tensor
    group_exchanges: bool
    work: VisionWork

    def __repr__(self) -> str:
        return (
            f"VisionShard(rank={self.rank}, context_parallel_size={self.context_parallel_size}, "
            f"units={self.units.numel()}, rows=({self.image_rows}, {self.video_rows}), sent={sum(self.send_counts)}, "
            f"received={sum(self.recv_counts)}, vit_imbalance={self.work.imbalance:.4f})"
        )

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> VisionShard:
        return dataclasses.replace(
            self, units=fn(self.units), send_index=fn(self.send_index), gather_index=fn(self.gather_index)
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> VisionShard:
        """A copy with its tensors on ``device``."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))


def _placeholders(input_ids: np.ndarray, token_ids: Sequence[Optional[int]], units: VisionUnits) -> list[np.ndarray]:
    """Each kind's placeholder positions in packed order, checked against the units' embedding rows."""
    out = []
    for kind, token in enumerate(token_ids):
        want = int(units.feature_rows[units.kind == kind].sum())
        where = np.flatnonzero(input_ids == token) if token is not None else np.zeros(0, np.int64)
        if where.size != want:
            name = ("image", "video")[kind]
            raise ValueError(
                f"the pack holds {where.size} {name} placeholder tokens (id {token}) but its {name}s give {want} "
                "embedding rows"
            )
        out.append(where)
    return out


def plan_vision(
    input_ids: np.ndarray,
    rank_indices: Sequence[np.ndarray],
    units: VisionUnits,
    token_ids: tuple[Optional[int], Optional[int]],
    ranks: Optional[Sequence[int]] = None,
) -> list[VisionShard]:
    """Every CP rank's :class:`VisionShard` for one pack (or those of ``ranks``: a collator needs its own).

    Args:
        input_ids: ``(T,)`` the packed tokens.
        rank_indices: per rank, the packed position of each token it holds in local order (``-1``: padding),
            the shards' ``indices``.
        units: the pack's units (:func:`patch_units`, :func:`tile_units`).
        token_ids: the image and the video placeholder ids (None: no such kind).
        ranks: the ranks whose shards to build (None: all, in rank order).

    Raises:
        ValueError: placeholders that do not match the units' embedding rows.
    """
    size = len(rank_indices)
    holder = np.full(input_ids.size, -1, np.int64)
    local = np.zeros(input_ids.size, np.int64)
    for r, idx in enumerate(rank_indices):
        real = idx >= 0
        holder[idx[real]] = r
        local[idx[real]] = np.flatnonzero(real)
    where = _placeholders(input_ids, token_ids, units)
    # the feature row (within its kind) of each placeholder, and the unit of each feature row
    row_unit = [np.repeat(np.flatnonzero(units.kind == k), units.feature_rows[units.kind == k]) for k in (0, 1)]
    prefer = np.zeros(units.num_units, np.int64)
    for k in (0, 1):
        if where[k].size:
            counts = np.zeros((units.num_units, size), np.int64)
            np.add.at(counts, (row_unit[k], holder[where[k]]), 1)
            ids = np.flatnonzero(units.kind == k)
            prefer[ids] = np.argmax(counts[ids], axis=1)
    assign = divide_vision_units(units.cost, size, prefer)
    times = np.bincount(assign, weights=units.cost, minlength=size).astype(np.float64)
    share = float(units.cost.sum()) / size
    oversize = tuple(np.flatnonzero(units.cost > share * (1 + 1e-12)).tolist())
    # each rank's own features: its image units' rows, then its video units' rows, in pack order
    own_row = np.zeros(units.num_units, np.int64)
    encoded = np.zeros((size, 2), np.int64)
    for r in range(size):
        offset = 0
        for k in (0, 1):
            ids = np.flatnonzero((assign == r) & (units.kind == k))
            own_row[ids] = offset + np.cumsum(units.feature_rows[ids]) - units.feature_rows[ids]
            encoded[r, k] = int(units.feature_rows[ids].sum())
            offset += encoded[r, k]
    # per destination rank: (source rank, source row) of each of its placeholders, images then videos
    sources: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    counts_kind = np.zeros((size, 2), np.int64)
    for r in range(size):
        src, row = [], []
        for k in (0, 1):
            mine = where[k][holder[where[k]] == r]
            mine = mine[np.argsort(local[mine], kind="stable")]
            feature = np.searchsorted(where[k], mine)
            unit = row_unit[k][feature]
            src.append(assign[unit])
            row.append(own_row[unit] + feature - units.feature_start[unit])
            counts_kind[r, k] = mine.size
        sources.append(np.concatenate(src).astype(np.int64))
        rows.append(np.concatenate(row).astype(np.int64))
    sent = np.zeros((size, size), np.int64)  # sent[s, r]: rows rank s sends rank r
    for r in range(size):
        np.add.at(sent[:, r], sources[r][sources[r] != r], 1)
    exchanged = int(sent.sum())
    work = VisionWork(
        units, assign, times, oversize, exchanged, int((size - 1) * units.feature_rows.sum()) if size > 1 else 0
    )
    return [
        _rank_shard(r, size, assign, encoded, counts_kind, sources, rows, sent, work, exchanged > 0)
        for r in (range(size) if ranks is None else ranks)
    ]


def _rank_shard(
    r: int,
    size: int,
    assign: np.ndarray,
    encoded: np.ndarray,
    counts_kind: np.ndarray,
    sources: list[np.ndarray],
    rows: list[np.ndarray],
    sent: np.ndarray,
    work: VisionWork,
    exchanges: bool,
) -> VisionShard:
    """Rank ``r``'s routing: what it sends (to each other rank, in that rank's placeholder order) and where each
    of its placeholders finds its row in ``cat(own features, received)``."""
    send = [rows[d][sources[d] == r] for d in range(size) if d != r]
    send_index = np.concatenate(send) if send else np.zeros(0, np.int64)
    own = int(encoded[r].sum())
    src = sources[r]
    gather = rows[r].copy()
    away = np.flatnonzero(src != r)
    # received rows arrive grouped by source rank, each group in this rank's placeholder order
    order = away[np.argsort(src[away], kind="stable")]
    gather[order] = own + np.arange(order.size)
    return VisionShard(
        rank=r,
        context_parallel_size=size,
        units=torch.from_numpy(np.flatnonzero(assign == r).astype(np.int64)),
        encoded_image_rows=int(encoded[r, 0]),
        encoded_video_rows=int(encoded[r, 1]),
        image_rows=int(counts_kind[r, 0]),
        video_rows=int(counts_kind[r, 1]),
        send_index=torch.from_numpy(send_index.astype(np.int64)),
        send_counts=tuple(int(x) for x in sent[r]),
        recv_counts=tuple(int(x) for x in sent[:, r]),
        gather_index=torch.from_numpy(gather.astype(np.int64)),
        group_exchanges=exchanges,
        work=work,
    )


def exchange_vision_rows(features: torch.Tensor, shard: VisionShard, group: Any = None) -> torch.Tensor:
    """The embedding rows of a rank's placeholders, from the ranks that encoded them (differentiable).

    Collective: every rank of ``group`` calls it with its own shard of the same pack (no collective runs on any
    rank when no row leaves its encoder).

    Args:
        features: ``(encoded_image_rows + encoded_video_rows, hidden)`` this rank's encoder output, its images'
            rows then its videos' rows. A rank that encodes nothing passes an empty tensor that requires grad
            (so that the backward all-to-all runs on it too).
        shard: this rank's :class:`VisionShard`, its tensors on ``features``' device.
        group: the CP process group (None: the world).

    Returns:
        ``(image_rows + video_rows, hidden)``: the rows of its image placeholders then its video placeholders,
        in local token order. Gradients go back to the encoding ranks' ``features``.
    """
    want = shard.encoded_image_rows + shard.encoded_video_rows
    if features.dim() != 2 or features.shape[0] != want:
        raise ValueError(
            f"features must be ({want}, hidden): the rows of the units this rank encodes, got {tuple(features.shape)}"
        )
    if shard.gather_index.device != features.device:
        raise ValueError(
            f"the vision shard's tensors are on {shard.gather_index.device} but features on {features.device}"
        )
    rows = features
    if shard.group_exchanges:
        sent = features.index_select(0, shard.send_index)
        got = exchange_rows(sent, shard.send_counts, shard.recv_counts, group)
        rows = torch.cat([features, got], dim=0)
    return rows.index_select(0, shard.gather_index)
