"""Multimodal rotary positions (mRoPE) of Qwen2-VL / Qwen2.5-VL: ``(3, T)`` temporal/height/width rows.

Two numberings of the text that follows an image or video are in use (``convention=``):

- ``"max_position"``: the text continues at the largest position the image or video used, plus one. This is
  Qwen's original ``get_rope_index`` and what transformers computed up to version 5.2.
- ``"max_hw"``: the text continues at the image's or video's start plus ``max(h, w) / spatial_merge_size``,
  what transformers computes from version 5.3 on. The two differ only after a long video, one whose last time
  position is past ``start + max(h, w) / spatial_merge_size - 1`` (more grid time steps than
  ``max(h, w) / spatial_merge_size``; for Qwen2.5-VL, whose time positions advance ``tokens_per_second`` per
  second, a video longer than about ``max(h, w) / spatial_merge_size / tokens_per_second`` seconds): the
  text after it then reuses positions of the video's last frames.

The default (None) is the one the installed transformers computes (``"max_position"`` without transformers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .._checks import check_positive_int, is_tensor

__all__ = [
    "MROPE_CONVENTIONS",
    "MRopePositions",
    "check_mrope_convention",
    "installed_mrope_convention",
    "mrope_position_ids",
    "video_time_positions",
]

# The numberings of the text after an image or video (see the module docstring).
MROPE_CONVENTIONS = ("max_hw", "max_position")
# The first transformers release that continues text at start + max(h, w) / merge.
_MAX_HW_SINCE = (5, 3)


@functools.cache
def installed_mrope_convention() -> str:
    """The convention the installed transformers computes: ``"max_hw"`` from 5.3 on, else ``"max_position"``.

    Reads the installed version from the package metadata (transformers is not imported); without
    transformers, ``"max_position"`` (Qwen's original numbering).
    """
    from importlib import metadata

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "max_position"
    numbers = [int(x) for x in re.findall(r"\d+", version)[:2]]
    return "max_hw" if tuple(numbers) >= _MAX_HW_SINCE else "max_position"


def check_mrope_convention(convention: object) -> str:
    """``convention`` itself when it is one of :data:`MROPE_CONVENTIONS`, the installed one when None."""
    if convention is None:
        return installed_mrope_convention()
    if convention not in MROPE_CONVENTIONS:
        raise ValueError(f"mrope_convention must be one of {MROPE_CONVENTIONS} or None, got {convention!r}")
    return convention


def video_time_positions(num_steps: int, second_per_grid_t: float, tokens_per_second: float) -> np.ndarray:
    """Qwen2.5-VL time positions ``floor(k * (tokens_per_second * second_per_grid_t))``, ``k = 0..num_steps-1``.

    Computed in float32 as transformers does (``second_per_grid_ts`` is a float32 tensor there, and every
    product is rounded to float32): at 25 frames per second (0.08 s per grid step, 2 tokens per second),
    ``25 * float32(0.16)`` rounds to 4.0 in float32, while float64 arithmetic gives 3.9999999 and position 3.
    This is the product order of transformers 5.24; Qwen's original code multiplies ``(k * second_per_grid_t)
    * tokens_per_second``, the same numbers whenever ``tokens_per_second`` is a power of two (2 in the
    released models). transformers 5.2 and 5.3 truncate ``second_per_grid_t`` to an integer first (all time
    positions 0 below one second per grid step); that is not reproduced.
    """
    interval = np.float32(tokens_per_second) * np.float32(second_per_grid_t)
    return (np.arange(num_steps, dtype=np.float32) * interval).astype(np.int64)


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


def mrope_position_ids(
    input_ids: Sequence[Any],
    image_grid_thw: Any = None,
    video_grid_thw: Any = None,
    *,
    image_token_id: int,
    video_token_id: int | None = None,
    spatial_merge_size: int = 2,
    second_per_grid_ts: Any = None,
    tokens_per_second: float | None = None,
    convention: str | None = None,
) -> MRopePositions:
    """Qwen2-VL / Qwen2.5-VL mRoPE ``position_ids`` for samples packed into one row, restarting per sample.

    Each sample follows ``get_rope_index``: text tokens advance all three positions by one; an image or video
    is a run of ``t * (h / m) * (w / m)`` placeholder tokens (``m = spatial_merge_size``) in ``(t, h, w)``
    row-major order whose positions are ``start + (t_index, h_index, w_index)``, where ``start`` is the
    position the first placeholder would have had as text; the text after it continues as ``convention``
    says (the module docstring). ``t_index`` is ``0..t-1``, or for Qwen2.5-VL videos (``second_per_grid_ts``
    and ``tokens_per_second`` given) ``floor(k * (tokens_per_second * second_per_grid_t))`` in float32, as
    transformers computes it (:func:`video_time_positions`).

    Args:
        input_ids: ``B`` per-sample 1-D token sequences (tensors, arrays or lists).
        image_grid_thw: ``(I, 3)`` rows for all images of the batch in order of appearance (as a Hugging Face
            processor returns them), or a list with one ``(I_b, 3)`` entry per sample.
        video_grid_thw: the same for videos (needs ``video_token_id``).
        image_token_id, video_token_id: the placeholder tokens (``<|image_pad|>``, ``<|video_pad|>``).
        second_per_grid_ts: ``(V,)`` seconds per temporal grid step of each video (Qwen2.5-VL).
        tokens_per_second: the vision config's ``tokens_per_second`` (Qwen2.5-VL; 2 for the released models).
        convention: ``"max_hw"`` or ``"max_position"``, the numbering of text after a long video; None: the one
            the installed transformers computes (:func:`installed_mrope_convention`).

    Returns:
        :class:`MRopePositions` of torch tensors.

    Raises:
        ValueError: a placeholder run that does not match its grid, grids left over or missing, naming the sample.
    """
    import torch

    m = check_positive_int("spatial_merge_size", spatial_merge_size)
    convention = check_mrope_convention(convention)
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
    tokens = {kind: token for kind, _, token in kinds}
    grids = {kind: _rows_per_sample(kind, grid, token, ids_list, m) for kind, grid, token in kinds}
    seconds = None
    if second_per_grid_ts is not None:
        seconds = np.asarray(
            second_per_grid_ts.detach().cpu() if is_tensor(second_per_grid_ts) else second_per_grid_ts, dtype=np.float32
        ).reshape(-1)
    clock = _VideoClock(seconds, tokens_per_second)
    pieces = []
    for i, ids in enumerate(ids_list):
        sample_grids = {kind: list(rows[i]) for kind, rows in grids.items()}
        pieces.append(_sample_positions(i, ids, sample_grids, tokens, m, clock, convention))
    if seconds is not None and clock.videos != seconds.shape[0]:
        raise ValueError(f"second_per_grid_ts has {seconds.shape[0]} entries for {clock.videos} videos")
    deltas = [(int(pos.max()) + 1 - pos.shape[1]) if pos.shape[1] else 0 for pos in pieces]
    position_ids = torch.from_numpy(np.concatenate(pieces, axis=1)).reshape(3, 1, -1)
    text_position_ids = torch.from_numpy(
        np.concatenate([np.arange(ids.shape[0], dtype=np.int64) for ids in ids_list])
    ).reshape(1, -1)
    return MRopePositions(position_ids, text_position_ids, torch.tensor(deltas, dtype=torch.int64))


def _rows_per_sample(kind: str, grid: Any, token: int, ids_list: list[np.ndarray], m: int) -> list[np.ndarray]:
    """The ``(k_i, 3)`` grid rows of every sample: given per sample, or one table split by the samples'
    placeholder counts (each image or video takes ``t * (h / m) * (w / m)`` placeholders)."""
    if (
        isinstance(grid, (list, tuple))
        and len(grid) == len(ids_list)
        and all(g is None or np.ndim(g.detach().cpu() if is_tensor(g) else g) == 2 for g in grid)
    ):
        return [grid_rows(g, f"{kind}_grid_thw[{i}]") for i, g in enumerate(grid)]
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
            raise ValueError(
                f"sample {i}: its {kind} placeholder tokens do not add up to whole "
                f"{kind}_grid_thw rows (rows {start}..{k - 1})"
            )
        splits.append(rows[start:k])
    if k != rows.shape[0]:
        raise ValueError(f"{kind}_grid_thw has {rows.shape[0]} rows but the samples use {k}")
    return splits


class _VideoClock:
    """Time positions of the batch's videos in order: ``0..t-1``, or Qwen2.5-VL's from ``second_per_grid_ts``."""

    def __init__(self, seconds: np.ndarray | None, tokens_per_second: float | None) -> None:
        self.seconds = seconds
        self.tokens_per_second = tokens_per_second
        self.videos = 0  # videos numbered so far

    def steps(self, t: int) -> np.ndarray:
        """The ``t`` time positions of the next video."""
        video = self.videos
        self.videos += 1
        if self.seconds is None:
            return np.arange(t, dtype=np.int64)
        if video >= self.seconds.shape[0]:
            raise ValueError("second_per_grid_ts has fewer entries than videos")
        return video_time_positions(t, self.seconds[video], self.tokens_per_second)  # type: ignore[arg-type]


def _sample_positions(
    i: int,
    ids: np.ndarray,
    grids: dict[str, list[np.ndarray]],
    tokens: dict[str, int],
    m: int,
    clock: _VideoClock,
    convention: str,
) -> np.ndarray:
    """``(3, n)`` positions of sample ``i``: text advances all three by one, each placeholder run gets its
    grid's ``start + (t, h, w)`` and moves the text after it on as ``convention`` says."""
    n = ids.shape[0]
    is_visual = np.zeros(n, dtype=bool)
    for tok in tokens.values():
        is_visual |= ids == tok
    visual_pos = np.flatnonzero(is_visual)
    used = {kind: 0 for kind in tokens}
    pos = np.zeros((3, n), dtype=np.int64)
    shift = np.zeros(n + 1, dtype=np.int64)  # text position = index + cumulative shift
    text_mask = np.ones(n, dtype=bool)
    st, acc = 0, 0
    while True:
        j = np.searchsorted(visual_pos, st)
        if j >= visual_pos.shape[0]:
            break
        p = int(visual_pos[j])
        kind = "image" if ids[p] == tokens["image"] else "video"
        if used[kind] >= len(grids[kind]):
            raise ValueError(f"sample {i}: more {kind} placeholders than {kind}_grid_thw rows")
        t, h, w = (int(v) for v in grids[kind][used[kind]])
        used[kind] += 1
        if h % m or w % m:
            raise ValueError(f"sample {i}: {kind} grid {(t, h, w)} is not divisible by spatial_merge_size {m}")
        gh, gw = h // m, w // m
        length = t * gh * gw
        if p + length > n or not (ids[p : p + length] == tokens[kind]).all():
            raise ValueError(
                f"sample {i}: {kind} at token {p} needs {length} consecutive placeholders for grid {(t, h, w)}"
            )
        t_steps = clock.steps(t) if kind == "video" else np.arange(t, dtype=np.int64)
        start = p + acc
        pos[0, p : p + length] = start + np.repeat(t_steps, gh * gw)
        pos[1, p : p + length] = start + np.tile(np.repeat(np.arange(gh, dtype=np.int64), gw), t)
        pos[2, p : p + length] = start + np.tile(np.arange(gw, dtype=np.int64), t * gh)
        span = max(gh, gw) if convention == "max_hw" else max(int(t_steps[-1]), gh - 1, gw - 1) + 1
        acc += span - length
        shift[p + length] += span - length
        text_mask[p : p + length] = False
        st = p + length
    for kind in tokens:
        if used[kind] != len(grids[kind]):
            raise ValueError(
                f"sample {i}: {len(grids[kind])} {kind}_grid_thw rows but {used[kind]} {kind} placeholder runs"
            )
    text_pos = np.arange(n, dtype=np.int64) + np.cumsum(shift)[:n]
    pos[:, text_mask] = text_pos[text_mask]
    return pos
