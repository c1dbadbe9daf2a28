"""Multimodal rotary positions (mRoPE) of Qwen2-VL / Qwen2.5-VL: ``(3, T)`` temporal/height/width rows."""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from .._checks import check_positive_int, is_tensor

__all__ = ["MRopePositions", "mrope_position_ids"]

class MRopePositions(NamedTuple):
    """Qwen2-VL multimodal rotary positions of a packed batch of ``B`` samples, ``T`` tokens in all."""

    position_ids: Any
    """``(3, 1, T)`` int64 temporal/height/width positions; the three rows are equal on text tokens"""
    text_position_ids: Any
    """``(1, T)`` int64 ``0..len-1`` per sample: the 1-D positions packed-sequence detection looks at"""
    rope_deltas: Any
    """``(B,)`` int64 per sample ``max position + 1 - len`` (what ``get_rope_index`` returns for generation)"""


def grid_rows(grid: Any, name: str) -> np.ndarray:
    """``(K, 3)`` int64 ``(t, h, w)`` rows of a grid (None: no rows); errors name ``name``."""
    if grid is None:
        return np.zeros((0, 3), dtype=np.int64)
    arr = np.asarray(grid.detach().cpu() if is_tensor(grid) else grid)
    if arr.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name} must be (num, 3) rows of (t, h, w), got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if (arr <= 0).any():
        raise ValueError(f"{name} row {int(np.flatnonzero((arr <= 0).any(axis=1))[0])} has a non-positive entry")
    return arr.astype(np.int64)


def _as_ids(x: Any, i: int) -> np.ndarray:
    arr = np.asarray(x.detach().cpu() if is_tensor(x) else x)
    if arr.ndim != 1:
        raise ValueError(f"sample {i}: input_ids must be 1-D, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"sample {i}: input_ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def mrope_position_ids(input_ids: Sequence[Any], image_grid_thw: Any = None, video_grid_thw: Any = None, *,
                       image_token_id: int, video_token_id: int | None = None, spatial_merge_size: int = 2,
                       second_per_grid_ts: Any = None, tokens_per_second: float | None = None) -> MRopePositions:
    """Qwen2-VL / Qwen2.5-VL mRoPE ``position_ids`` for samples packed into one row, restarting per sample.

    Each sample follows ``get_rope_index``: text tokens advance all three positions by one; an image or video
    is a run of ``t * (h / m) * (w / m)`` placeholder tokens (``m = spatial_merge_size``) in ``(t, h, w)``
    row-major order whose positions are ``start + (t_index, h_index, w_index)``, where ``start`` is the
    position the first placeholder would have had as text; the text after it continues from the largest
    position used plus one. ``t_index`` is ``0..t-1``, or for Qwen2.5-VL videos (``second_per_grid_ts`` and
    ``tokens_per_second`` given) ``floor(k * second_per_grid_t * tokens_per_second)``.

    Args:
        input_ids: ``B`` per-sample 1-D token sequences (tensors, arrays or lists).
        image_grid_thw: ``(I, 3)`` rows for all images of the batch in order of appearance (as a Hugging Face
            processor returns them), or a list with one ``(I_b, 3)`` entry per sample.
        video_grid_thw: the same for videos (needs ``video_token_id``).
        image_token_id, video_token_id: the placeholder tokens (``<|image_pad|>``, ``<|video_pad|>``).
        second_per_grid_ts: ``(V,)`` seconds per temporal grid step of each video (Qwen2.5-VL).
        tokens_per_second: the vision config's ``tokens_per_second`` (Qwen2.5-VL; 2 for the released models).

    Returns:
        :class:`MRopePositions` of torch tensors.

    Raises:
        ValueError: a placeholder run that does not match its grid, grids left over or missing, naming the sample.
    """
    import torch

    m = check_positive_int("spatial_merge_size", spatial_merge_size)
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        raise TypeError("input_ids must be a sequence of per-sample token sequences")
    if len(input_ids) == 0:
        raise ValueError("input_ids is empty: no samples")
    if (second_per_grid_ts is None) != (tokens_per_second is None):
        raise ValueError("second_per_grid_ts and tokens_per_second go together (Qwen2.5-VL videos)")
    ids_list = [_as_ids(x, i) for i, x in enumerate(input_ids)]
    kinds = [("image", image_grid_thw, image_token_id)]
    if video_grid_thw is not None:
        if video_token_id is None:
            raise ValueError("video_grid_thw needs video_token_id")
        kinds.append(("video", video_grid_thw, video_token_id))
    # per sample, per kind: the grid rows of that sample
    per_sample: dict[str, list[np.ndarray]] = {}
    for kind, grid, token in kinds:
        if isinstance(grid, (list, tuple)) and len(grid) == len(ids_list) and all(
                g is None or np.ndim(g.detach().cpu() if is_tensor(g) else g) == 2 for g in grid):
            per_sample[kind] = [grid_rows(g, f"{kind}_grid_thw[{i}]") for i, g in enumerate(grid)]
            continue
        rows = grid_rows(grid, f"{kind}_grid_thw")
        tokens_per_item = rows[:, 0] * (rows[:, 1] // m) * (rows[:, 2] // m)
        splits, k = [], 0
        for i, ids in enumerate(ids_list):
            need = int((ids == token).sum())
            start = k
            while need > 0 and k < rows.shape[0]:
                need -= int(tokens_per_item[k])
                k += 1
            if need != 0:
                raise ValueError(f"sample {i}: its {kind} placeholder tokens do not add up to whole "
                                 f"{kind}_grid_thw rows (rows {start}..{k - 1})")
            splits.append(rows[start:k])
        if k != rows.shape[0]:
            raise ValueError(f"{kind}_grid_thw has {rows.shape[0]} rows but the samples use {k}")
        per_sample[kind] = splits
    seconds = None
    if second_per_grid_ts is not None:
        seconds = np.asarray(second_per_grid_ts.detach().cpu() if is_tensor(second_per_grid_ts)
                             else second_per_grid_ts, dtype=np.float64).reshape(-1)
    video_counter = 0
    pieces, text_pieces, deltas = [], [], []
    for i, ids in enumerate(ids_list):
        n = ids.shape[0]
        tokens = {kind: tok for kind, _, tok in kinds}
        is_visual = np.zeros(n, dtype=bool)
        for tok in tokens.values():
            is_visual |= ids == tok
        visual_pos = np.flatnonzero(is_visual)
        queues = {kind: list(per_sample[kind][i]) for kind in tokens}
        used = {kind: 0 for kind in tokens}
        pos = np.zeros((3, n), dtype=np.int64)
        shift = np.zeros(n + 1, dtype=np.int64)  # text position = index + cumulative shift
        items = []
        st, acc = 0, 0
        while True:
            j = np.searchsorted(visual_pos, st)
            if j >= visual_pos.shape[0]:
                break
            p = int(visual_pos[j])
            kind = "image" if ids[p] == image_token_id else "video"
            if used[kind] >= len(queues[kind]):
                raise ValueError(f"sample {i}: more {kind} placeholders than {kind}_grid_thw rows")
            t, h, w = (int(v) for v in queues[kind][used[kind]])
            used[kind] += 1
            if h % m or w % m:
                raise ValueError(f"sample {i}: {kind} grid {(t, h, w)} is not divisible by spatial_merge_size {m}")
            gh, gw = h // m, w // m
            length = t * gh * gw
            if p + length > n or not (ids[p:p + length] == tokens[kind]).all():
                raise ValueError(f"sample {i}: {kind} at token {p} needs {length} consecutive placeholders "
                                 f"for grid {(t, h, w)}")
            if kind == "video" and seconds is not None:
                if video_counter >= seconds.shape[0]:
                    raise ValueError("second_per_grid_ts has fewer entries than videos")
                t_steps = np.floor(np.arange(t) * seconds[video_counter] * float(tokens_per_second)).astype(np.int64)
            else:
                t_steps = np.arange(t, dtype=np.int64)
            if kind == "video":
                video_counter += 1
            start = p + acc
            tt = np.repeat(t_steps, gh * gw)
            hh = np.tile(np.repeat(np.arange(gh, dtype=np.int64), gw), t)
            ww = np.tile(np.arange(gw, dtype=np.int64), t * gh)
            pos[0, p:p + length] = start + tt
            pos[1, p:p + length] = start + hh
            pos[2, p:p + length] = start + ww
            span = max(int(t_steps[-1]), gh - 1, gw - 1) + 1
            acc += span - length
            shift[p + length] += span - length
            items.append((p, length))
            st = p + length
        for kind in tokens:
            if used[kind] != len(queues[kind]):
                raise ValueError(f"sample {i}: {len(queues[kind])} {kind}_grid_thw rows but {used[kind]} "
                                 f"{kind} placeholder runs")
        text_pos = np.arange(n, dtype=np.int64) + np.cumsum(shift)[:n]
        text_mask = np.ones(n, dtype=bool)
        for p, length in items:
            text_mask[p:p + length] = False
        pos[:, text_mask] = text_pos[text_mask]
        pieces.append(pos)
        text_pieces.append(np.arange(n, dtype=np.int64))
        deltas.append((int(pos.max()) + 1 - n) if n else 0)
    if seconds is not None and video_counter != seconds.shape[0]:
        raise ValueError(f"second_per_grid_ts has {seconds.shape[0]} entries for {video_counter} videos")
    position_ids = torch.from_numpy(np.concatenate(pieces, axis=1)).reshape(3, 1, -1)
    text_position_ids = torch.from_numpy(np.concatenate(text_pieces)).reshape(1, -1)
    return MRopePositions(position_ids, text_position_ids, torch.tensor(deltas, dtype=torch.int64))


