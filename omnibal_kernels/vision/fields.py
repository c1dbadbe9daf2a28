"""The multimodal fields of a packed batch: flat pixels with their ``vit_cu_seqlens``, image-to-sample maps,
grids, and the hook :func:`omnibal_kernels.packing.pack_batch` calls for samples that carry images or videos."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._checks import is_tensor
from .._csr import check_int32_total, offsets_from_counts
from .._shared_memory import in_worker, shared_tensors
from .._warnings import OmnibalWarning
from .mrope import grid_rows, mrope_position_ids

__all__ = [
    "SAMPLE_KEYS",
    "VISION_KEYS",
    "pack_vision_fields",
    "unpack_vision_fields",
    "pack_batch_vision",
    "unpack_batch_vision",
]


def _pixel_layout(
    samples: Sequence[Mapping[str, Any]], pixel_key: str = "pixel_values", grid_key: str = "image_grid_thw"
) -> tuple[list[int], str | None]:
    """Indices of samples with pixels and the common layout: ``"tiles"`` (n, C, H, W) or ``"patches"`` (n, D)."""
    import torch

    with_pixels: list[int] = []
    layout: str | None = None
    ref_shape: tuple[int, ...] = ()
    ref_dtype = None
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise TypeError(f"sample {i}: expected a mapping, got {type(s).__name__}")
        pv = s.get(pixel_key)
        if pv is None:
            grid = s.get(grid_key)
            if grid is not None and (grid.numel() if isinstance(grid, torch.Tensor) else len(grid)) > 0:
                raise ValueError(f"sample {i}: {grid_key} without {pixel_key}")
            continue
        if not isinstance(pv, torch.Tensor):
            raise TypeError(f"sample {i}: {pixel_key} must be a torch tensor, got {type(pv).__name__}")
        if pv.dim() == 4:
            this = "tiles"
        elif pv.dim() == 2:
            this = "patches"
        else:
            raise ValueError(
                f"sample {i}: {pixel_key} must be (n, C, H, W) tiles or (n_patches, D) patches, "
                f"got shape {tuple(pv.shape)}"
            )
        if layout is None:
            layout, ref_shape, ref_dtype = this, tuple(pv.shape[1:]), pv.dtype
        elif this != layout or tuple(pv.shape[1:]) != ref_shape:
            raise ValueError(
                f"sample {i}: {pixel_key} shape {tuple(pv.shape)} does not match the batch's "
                f"(n, {', '.join(map(str, ref_shape))})"
            )
        elif pv.dtype != ref_dtype:
            raise ValueError(f"sample {i}: {pixel_key} dtype {pv.dtype} differs from the batch's {ref_dtype}")
        with_pixels.append(i)
    return with_pixels, layout


def pack_vision_fields(
    samples: Sequence[Mapping[str, Any]],
    *,
    spatial_merge_size: int | None = None,
    shared: bool = False,
    pixel_key: str = "pixel_values",
    grid_key: str = "image_grid_thw",
) -> dict:
    """Concatenate the vision fields of a batch of samples (the multimodal half of packing).

    A sample may carry ``pixel_values`` as InternVL-style tiles ``(n, C, H, W)`` (each tile one ViT sequence)
    or Qwen2-VL-style flat patches ``(n_patches, D)`` with optional ``image_grid_thw`` ``(k, 3)`` whose
    ``t * h * w`` add up to ``n_patches`` (without it the sample's patches are one image). Samples without
    ``pixel_values`` (text only) contribute nothing; all others share one layout and dtype.

    Returns:
        ``{}`` when no sample has pixels, else a dict with
        ``pixel_values`` (``(sum n, C, H, W)`` or ``(sum n_patches, D)``, samples in batch order);
        ``vit_cu_seqlens`` int32 ``(S + 1,)``: ViT attention segments in rows of ``pixel_values`` (one per tile;
        one per frame group of each image for grids, exactly as Qwen2-VL's vision tower segments them; one
        per image otherwise); ``vit_max_seqlen`` Python int; ``image_to_sample`` int32 ``(I,)``: sample of
        each image (tile); ``num_images`` int32 ``(B,)``: images (tiles) per sample; and ``image_grid_thw``
        int64 ``(I, 3)`` when the samples give grids.

    ``spatial_merge_size``: check that grid heights and widths are multiples of it. ``shared``: allocate
    ``pixel_values`` in shared memory (inside DataLoader workers, so handing it over copies nothing).
    ``pixel_key``/``grid_key``: read these sample keys instead (``"pixel_values_videos"``/``"video_grid_thw"``
    for videos); the output keys stay the same.

    Raises:
        ValueError/TypeError: mixed layouts or dtypes, grids that do not cover the patches, naming the sample.
    """
    import torch

    if len(samples) == 0:
        raise ValueError("empty batch: no samples")
    with_pixels, layout = _pixel_layout(samples, pixel_key, grid_key)
    if layout is None:
        return {}
    b = len(samples)
    num_images = np.zeros(b, dtype=np.int64)
    image_rows: list[np.ndarray] = []
    segment_rows: list[np.ndarray] = []
    grids: list[np.ndarray] = []
    has_grid: bool | None = None
    for i in with_pixels:
        pv = samples[i][pixel_key]
        n = int(pv.shape[0])
        grid = samples[i].get(grid_key)
        if layout == "tiles":
            if grid is not None:
                raise ValueError(f"sample {i}: {grid_key} given with (n, C, H, W) tiles")
            num_images[i] = n
            image_rows.append(np.ones(n, dtype=np.int64))
            segment_rows.append(np.ones(n, dtype=np.int64))
            continue
        this_has = grid is not None
        if has_grid is None:
            has_grid = this_has
        elif has_grid != this_has:
            raise ValueError(f"sample {i}: {grid_key} must be given for all samples with {pixel_key} or none")
        if not this_has:
            num_images[i] = 1
            image_rows.append(np.array([n], dtype=np.int64))
            segment_rows.append(np.array([n], dtype=np.int64))
            continue
        rows = grid_rows(grid, f"sample {i}: {grid_key}")
        if spatial_merge_size is not None and ((rows[:, 1:] % spatial_merge_size) != 0).any():
            raise ValueError(f"sample {i}: {grid_key} h/w must be multiples of {spatial_merge_size}")
        per_image = rows[:, 0] * rows[:, 1] * rows[:, 2]
        if int(per_image.sum()) != n:
            raise ValueError(f"sample {i}: {grid_key} covers {int(per_image.sum())} patches but {pixel_key} has {n}")
        num_images[i] = rows.shape[0]
        image_rows.append(per_image)
        segment_rows.append(np.repeat(rows[:, 1] * rows[:, 2], rows[:, 0]))
        grids.append(rows)
    seg = np.concatenate(segment_rows)
    cu = offsets_from_counts(seg)
    check_int32_total("vit_cu_seqlens", int(cu[-1]), "pixel rows")
    parts = [samples[i][pixel_key] for i in with_pixels]
    if shared:
        rows_total = sum(int(p.shape[0]) for p in parts)
        (pixels,) = shared_tensors(((rows_total, *parts[0].shape[1:]), parts[0].dtype))
        torch.cat(parts, dim=0, out=pixels)
    else:
        pixels = torch.cat(parts, dim=0)
    out = {
        "pixel_values": pixels,
        "vit_cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        "vit_max_seqlen": int(seg.max()) if seg.size else 0,
        "image_to_sample": torch.from_numpy(np.repeat(np.arange(b, dtype=np.int32), num_images)),
        "num_images": torch.from_numpy(num_images.astype(np.int32)),
    }
    if grids:
        out["image_grid_thw"] = torch.from_numpy(np.concatenate(grids, axis=0))
    return out


def unpack_vision_fields(fields: Mapping[str, Any], batch_size: int | None = None) -> list[dict]:
    """Inverse of :func:`pack_vision_fields`: one dict per sample with its ``pixel_values`` (and
    ``image_grid_thw``), empty for text-only samples. Row slices are views of the packed tensor."""
    if not fields:
        if batch_size is None:
            raise ValueError("batch_size is needed to unpack a batch without vision fields")
        return [{} for _ in range(batch_size)]
    num_images = np.asarray(fields["num_images"]).astype(np.int64)
    grid = fields.get("image_grid_thw")
    pv = fields["pixel_values"]
    if grid is not None:
        g = np.asarray(grid).astype(np.int64)
        image_rows = g[:, 0] * g[:, 1] * g[:, 2]
    elif pv.dim() == 4:
        image_rows = np.ones(int(num_images.sum()), dtype=np.int64)
    else:
        cu = np.asarray(fields["vit_cu_seqlens"]).astype(np.int64)
        image_rows = np.diff(cu)
    img_cu = np.concatenate([[0], np.cumsum(num_images)])
    row_cu = np.concatenate([[0], np.cumsum(image_rows)])
    out: list[dict] = []
    for i in range(num_images.shape[0]):
        a, b = int(img_cu[i]), int(img_cu[i + 1])
        if a == b:
            out.append({})
            continue
        d = {"pixel_values": pv[int(row_cu[a]) : int(row_cu[b])]}
        if grid is not None:
            d["image_grid_thw"] = grid[a:b]
        out.append(d)
    return out


# --------------------------------------------------------------------------------------------- pack_batch hook

# Sample keys for which pack_batch calls pack_batch_vision (once per batch, whichever of them it has).
SAMPLE_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
# Batch keys that tell unpack_batch a batch carries vision fields.
VISION_KEYS = ("num_images", "num_videos", "second_per_grid_ts")
# Keys the hook renames for videos, and the keys it adds.
_VIDEO_RENAME = {
    "pixel_values": "pixel_values_videos",
    "image_grid_thw": "video_grid_thw",
    "vit_cu_seqlens": "video_vit_cu_seqlens",
    "vit_max_seqlen": "video_vit_max_seqlen",
    "image_to_sample": "video_to_sample",
    "num_images": "num_videos",
}
_PRODUCED = frozenset(
    (
        "vit_cu_seqlens",
        "vit_max_seqlen",
        "image_to_sample",
        "num_images",
        "text_position_ids",
        *(v for k, v in _VIDEO_RENAME.items() if k not in ("pixel_values", "image_grid_thw")),
    )
)


def _sample_seconds(samples: Sequence[Mapping[str, Any]], video_rows: list[np.ndarray]) -> list[np.ndarray]:
    """Per sample ``(V_b,)`` float64 ``second_per_grid_ts``; 1.0 for videos of samples without the field."""
    out = []
    for i, (s, rows) in enumerate(zip(samples, video_rows)):
        value = s.get("second_per_grid_ts")
        if value is None:
            out.append(np.ones(rows.shape[0], dtype=np.float64))
            continue
        arr = np.asarray(value.detach().cpu() if is_tensor(value) else value, dtype=np.float64).reshape(-1)
        if arr.shape[0] != rows.shape[0]:
            raise ValueError(
                f"sample {i}: second_per_grid_ts has {arr.shape[0]} entries for {rows.shape[0]} "
                "videos (video_grid_thw rows)"
            )
        out.append(arr)
    return out


def pack_batch_vision(samples: Sequence[Mapping[str, Any]], fields: dict, options: Any) -> None:
    """``pack_batch``'s multimodal packer: adds the vision fields and, with mRoPE on, the mRoPE positions.

    Called by :func:`omnibal_kernels.packing.pack_batch` after the text fields are built (``fields`` holds
    them); ``options`` is its :class:`omnibal_kernels.packing.PackOptions` (this reads its mRoPE fields); see
    :func:`pack_vision_fields` for the fields.
    """
    import warnings

    import torch

    for key in _PRODUCED:
        for i, s in enumerate(samples):
            if key in s:
                raise ValueError(f"sample {i} has a {key!r} field, which pack_batch produces itself")
    shared = in_worker()
    merge = options.spatial_merge_size if options.mrope_enabled else None
    images = pack_vision_fields(samples, spatial_merge_size=merge, shared=shared)
    fields.update(images)
    has_videos = any(s.get("pixel_values_videos") is not None or s.get("video_grid_thw") is not None for s in samples)
    if has_videos:
        videos = pack_vision_fields(
            samples, spatial_merge_size=merge, shared=shared, pixel_key="pixel_values_videos", grid_key="video_grid_thw"
        )
        fields.update({_VIDEO_RENAME[k]: v for k, v in videos.items()})
    video_rows = [grid_rows(s.get("video_grid_thw"), f"sample {i}: video_grid_thw") for i, s in enumerate(samples)]
    if any("second_per_grid_ts" in s for s in samples):
        sample_seconds = _sample_seconds(samples, video_rows)
        fields["second_per_grid_ts"] = torch.from_numpy(np.concatenate(sample_seconds).astype(np.float32))
    if not options.mrope_enabled:
        if "image_grid_thw" in fields or "video_grid_thw" in fields:
            warnings.warn(
                "samples carry image_grid_thw/video_grid_thw but image_token_id is not set: "
                "position_ids stay 1-D text positions, not Qwen2-VL mRoPE (pass image_token_id)",
                OmnibalWarning,
                stacklevel=5,
            )
        return

    num_samples = len(samples)
    lens = fields["seq_lens"][:num_samples].tolist()
    total = sum(lens)
    text_pos = fields["position_ids"]  # (1, T), restarting per segment, padding included
    ids = fields["input_ids"][0, :total].split(lens)
    image_rows = [grid_rows(s.get("image_grid_thw"), f"sample {i}: image_grid_thw") for i, s in enumerate(samples)]
    if options.video_token_id is None:
        for i, grids in enumerate(video_rows):
            if grids.shape[0]:
                raise ValueError(f"sample {i}: has video_grid_thw but video_token_id is not set")
    seconds = None
    if options.tokens_per_second is not None and any(rows.shape[0] for rows in video_rows):
        seconds = np.concatenate(_sample_seconds(samples, video_rows))
    positions = mrope_position_ids(
        ids,
        image_rows,
        video_rows if options.video_token_id is not None else None,
        image_token_id=options.image_token_id,
        video_token_id=options.video_token_id,
        spatial_merge_size=options.spatial_merge_size,
        second_per_grid_ts=seconds,
        tokens_per_second=options.tokens_per_second if seconds is not None else None,
        convention=options.mrope_convention,
    )
    rows = 4 if options.mrope_text_row else 3
    padded = text_pos.shape[1]
    position_ids = torch.empty((rows, 1, padded), dtype=torch.int64)
    position_ids[rows - 3 :, 0, :total] = positions.position_ids[:, 0]
    position_ids[rows - 3 :, 0, total:] = text_pos[0, total:]  # padding: positions of its own segment
    if rows == 4:
        position_ids[0] = text_pos
    fields["position_ids"] = position_ids
    fields["text_position_ids"] = text_pos


def unpack_batch_vision(batch: Mapping[str, Any], num_samples: int) -> list[dict]:
    """Per-sample vision fields of a packed batch (images, videos, ``second_per_grid_ts``); see ``unpack_batch``."""
    out: list[dict] = [{} for _ in range(num_samples)]
    if "num_images" in batch:
        images = {k: batch[k] for k in ("pixel_values", "num_images", "image_grid_thw", "vit_cu_seqlens") if k in batch}
        for d, u in zip(out, unpack_vision_fields(images)):
            d.update(u)
    if "num_videos" in batch:
        videos = {
            k: batch[v]
            for k, v in _VIDEO_RENAME.items()
            if k in ("pixel_values", "num_images", "image_grid_thw", "vit_cu_seqlens") and v in batch
        }
        for d, u in zip(out, unpack_vision_fields(videos)):
            d.update({_VIDEO_RENAME[k]: v for k, v in u.items()})
    if "second_per_grid_ts" in batch:
        counts = [0 if "video_grid_thw" not in d else int(d["video_grid_thw"].shape[0]) for d in out]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        seconds = batch["second_per_grid_ts"]
        for i, d in enumerate(out):
            if counts[i]:
                d["second_per_grid_ts"] = seconds[int(bounds[i]) : int(bounds[i + 1])]
    return out
