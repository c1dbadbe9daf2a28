"""Plain, slow, obviously correct references of every fast path, shared by tests and benchmarks.

One naming scheme: ``<what>_reference``. They favour clarity over speed (Python loops, numpy and plain torch)
and call none of the code they check; the grouping references reuse only the engine's seeded shuffle (the
same random streams, ``_C.STREAMS``), so their outputs match the C++ engine exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .. import _ext

# ---------------------------------------------------------------------------------------------------------
# Balance: grouping references (the C++ engine's shuffles are reused, so outputs match exactly)
# ---------------------------------------------------------------------------------------------------------


def next_fit_reference(
    order: Sequence[int] | np.ndarray, vit: np.ndarray, llm: np.ndarray, vit_capacity: int, llm_capacity: int
) -> list[list[int]]:
    """Next-fit over ``order``: a new pack whenever the next sample would overflow a capacity."""
    packs: list[list[int]] = []
    current: list[int] = []
    v_sum = t_sum = 0
    for i in order:
        v, t = int(vit[i]), int(llm[i])
        if current and (v_sum + v > vit_capacity or t_sum + t > llm_capacity):
            packs.append(current)
            current, v_sum, t_sum = [], 0, 0
        current.append(int(i))
        v_sum += v
        t_sum += t
    if current:
        packs.append(current)
    return packs


def isf_reference(
    vit: np.ndarray,
    llm: np.ndarray,
    items: np.ndarray,
    vit_capacity: int,
    llm_capacity: int,
    vit_threshold: int,
    llm_threshold: int,
    iterations: int,
    seed: int,
) -> list[list[int]]:
    """The OmniBal Iterative Sampling and Filtering, step by step, with the engine's shuffles."""
    C = _ext.load()

    def shuffled(ids: Sequence[int] | np.ndarray, round_index: int) -> np.ndarray:
        return C.shuffle(np.asarray(ids, dtype=np.int64), C.derive_seed(seed, C.STREAMS["isf_round"], round_index))

    out: list[list[int]] = []
    groups = next_fit_reference(shuffled(items, 0), vit, llm, vit_capacity, llm_capacity)
    for r in range(1, iterations):
        pool: list[int] = []
        for g in groups:
            if sum(int(vit[i]) for i in g) >= vit_threshold or sum(int(llm[i]) for i in g) >= llm_threshold:
                out.append(g)
            else:
                pool.extend(g)
        if not pool:
            groups = []
            break
        groups = next_fit_reference(shuffled(pool, r), vit, llm, vit_capacity, llm_capacity)
    out.extend(groups)
    return out


def random_next_fit_reference(
    vit: np.ndarray, llm: np.ndarray, items: np.ndarray, vit_capacity: int, llm_capacity: int, seed: int
) -> list[list[int]]:
    """Random next-fit with the engine's shuffle."""
    C = _ext.load()
    order = C.shuffle(np.asarray(items, dtype=np.int64), C.derive_seed(seed, C.STREAMS["next_fit"], 0))
    return next_fit_reference(order, vit, llm, vit_capacity, llm_capacity)


def dist_ratio_reference(step_loads: Sequence[Sequence[float]], min_denominator: float = 0.0) -> float:
    """The paper's Dist Ratio, loop by loop as the authors' script computes it."""
    ratios = []
    for loads in step_loads:
        peak = max(loads)
        waste = sum(peak - x for x in loads)
        denom = max(peak * len(loads), min_denominator)
        ratios.append(waste / denom if denom > 0 else 0.0)
    return sum(ratios) / len(ratios) if ratios else 0.0


# ------------------------------------------------------------------------------------ pack / unpack


def unpad_reference(padded: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
    """``padded (B, S, *rest)`` -> ``(sum(seq_lens), *rest)``: the first ``seq_lens[b]`` rows of each ``b``."""
    rows = [padded[b, : int(n)] for b, n in enumerate(seq_lens)]
    if not rows:
        return padded.new_empty((0, *padded.shape[2:]))
    return torch.cat(rows, dim=0)


def pad_reference(
    packed: torch.Tensor, seq_lens: Sequence[int], padded_len: int, fill_value: float | int | bool = 0
) -> torch.Tensor:
    """``packed (T, *rest)`` -> ``(B, padded_len, *rest)`` with ``fill_value`` after each sequence."""
    out = torch.full((len(seq_lens), padded_len, *packed.shape[1:]), fill_value, dtype=packed.dtype)
    start = 0
    for b, n in enumerate(seq_lens):
        out[b, : int(n)] = packed[start : start + int(n)]
        start += int(n)
    return out


def unpad_input_reference(
    hidden: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """flash-attention's ``unpad_input`` way: ``(packed, indices, cu_seqlens, max_seqlen)``.

    ``indices`` come from ``nonzero`` and ``max_seqlen`` from ``.item()``: both wait for the device. The
    benchmarks use this as the baseline that ``pack`` must beat.
    """
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden.reshape(hidden.shape[0] * hidden.shape[1], *hidden.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen


def pad_input_reference(packed: torch.Tensor, indices: torch.Tensor, batch: int, padded_len: int) -> torch.Tensor:
    """flash-attention's ``pad_input`` way: scatter ``packed`` rows to ``indices`` of a zero ``(B * S, ...)``."""
    out = packed.new_zeros((batch * padded_len, *packed.shape[1:]))
    out[indices] = packed
    return out.view(batch, padded_len, *packed.shape[1:])


# ---------------------------------------------------------------------------------- varlen metadata


def varlen_metadata_reference(
    seq_lens: Sequence[int], labels: torch.Tensor | None = None, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(cu_seqlens int32, position_ids int64, seq_idx int32, labels)`` by a loop over sequences.

    ``labels`` (any shape holding ``sum(seq_lens)`` values) comes back with ``ignore_index`` on the first
    token of every non-empty sequence.
    """
    cu = [0]
    positions: list[int] = []
    seq_idx: list[int] = []
    for b, n in enumerate(seq_lens):
        n = int(n)
        positions.extend(range(n))
        seq_idx.extend([b] * n)
        cu.append(cu[-1] + n)
    labels_out = None
    if labels is not None:
        labels_out = labels.clone()
        flat = labels_out.view(-1)
        for b, n in enumerate(seq_lens):
            if int(n) > 0:
                flat[cu[b]] = ignore_index
    return (
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(seq_idx, dtype=torch.int32),
        labels_out,
    )


# ------------------------------------------------------------------------------------------- vision


def internvl_tiles_reference(
    width: int, height: int, min_num: int = 1, max_num: int = 12, image_size: int = 448, use_thumbnail: bool = True
) -> tuple[int, int, int]:
    """``(cols, rows, num_tiles)`` of one image by InternVL's published dynamic-resolution scan."""
    if width <= 0 or height <= 0:
        raise ValueError("image sides must be positive")
    candidates = set()
    for n in range(min_num, max_num + 1):
        for i in range(1, n + 1):
            for j in range(1, n + 1):
                if min_num <= i * j <= max_num:
                    candidates.add((i, j))
    ranked = sorted(candidates, key=lambda c: c[0] * c[1])
    aspect = width / height
    area = width * height
    best_diff = float("inf")
    best = (1, 1)
    for cand in ranked:
        diff = abs(aspect - cand[0] / cand[1])
        if diff < best_diff:
            best_diff = diff
            best = cand
        elif diff == best_diff and area > 0.5 * image_size * image_size * cand[0] * cand[1]:
            best = cand
    tiles = best[0] * best[1]
    if use_thumbnail and tiles != 1:
        tiles += 1
    return best[0], best[1], tiles


def smart_resize_reference(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """Qwen2-VL ``smart_resize`` of one image, as transformers publishes it: ``(h, w)``."""
    if height <= 0 or width <= 0:
        raise ValueError("image sides must be positive")
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be at most 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen2vl_counts_reference(
    height: int,
    width: int,
    frames: int = 1,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
) -> tuple[tuple[int, int, int], int, int]:
    """``((t, h, w), num_patches, num_tokens)`` of one image or video for Qwen2-VL."""
    h, w = smart_resize_reference(height, width, patch_size * merge_size, min_pixels, max_pixels)
    t = -(-frames // temporal_patch_size)
    patches = t * (h // patch_size) * (w // patch_size)
    return (t, h // patch_size, w // patch_size), patches, patches // merge_size**2


def bucket_sort_reference(counts: Any, boundaries: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(perm, offsets, bucket_ids)`` of a stable sort of items by bucket (``searchsorted`` + ``argsort``)."""
    counts = np.asarray(counts, dtype=np.int64)
    boundaries = np.asarray(boundaries, dtype=np.int64)
    bucket_ids = np.searchsorted(boundaries, counts, side="right")
    perm = np.argsort(bucket_ids, kind="stable")
    sizes = np.bincount(bucket_ids, minlength=boundaries.shape[0] + 1)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return perm.astype(np.int64), offsets.astype(np.int64), bucket_ids.astype(np.int32)


def mrope_positions_reference(
    input_ids: Sequence[int],
    image_grids: Sequence[Sequence[int]],
    video_grids: Sequence[Sequence[int]] = (),
    image_token_id: int = -1,
    video_token_id: int = -2,
    spatial_merge_size: int = 2,
    video_seconds: Sequence[float] | None = None,
    tokens_per_second: float | None = None,
    convention: str | None = None,
) -> list[tuple[int, int, int]]:
    """One sample's Qwen2-VL mRoPE positions, token by token: ``[(t, h, w), ...]``.

    Video time steps are ``floor(k * (tokens_per_second * seconds))`` with every product rounded to float32
    (as transformers computes them); ``convention`` is ``"max_position"`` (text after an image or video goes
    on at its largest position + 1), ``"max_hw"`` (at its start + ``max(h, w) / spatial_merge_size``) or None
    (the one the installed transformers computes).
    """
    from ..vision.mrope import check_mrope_convention

    convention = check_mrope_convention(convention)
    out: list[tuple[int, int, int]] = []
    next_pos = 0
    i = 0
    images, videos = list(image_grids), list(video_grids)
    n_img = n_vid = 0
    while i < len(input_ids):
        tok = input_ids[i]
        if tok == image_token_id or tok == video_token_id:
            if tok == image_token_id:
                t, h, w = images[n_img]
                n_img += 1
                seconds = None
            else:
                t, h, w = videos[n_vid]
                seconds = None if video_seconds is None else video_seconds[n_vid]
                n_vid += 1
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            block = []
            for ti in range(t):
                tv = (
                    ti
                    if seconds is None
                    else int(np.float32(ti) * (np.float32(tokens_per_second) * np.float32(seconds)))
                )
                for hi in range(gh):
                    for wi in range(gw):
                        block.append((next_pos + tv, next_pos + hi, next_pos + wi))
            out.extend(block)
            if convention == "max_hw":
                next_pos += max(gh, gw)
            else:
                next_pos = max(max(p) for p in block) + 1
            i += len(block)
        else:
            out.append((next_pos, next_pos, next_pos))
            next_pos += 1
            i += 1
    return out


def patchify_reference(image: Any, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2):
    """Qwen2-VL patches of one ``(C, H, W)`` or ``(T, C, H, W)`` tensor by the image processor's
    reshape/permute; returns ``(patches (n, C*t*p*p), positions (n, 2) (row, col), (t, h, w))``."""
    import torch

    frames = image.unsqueeze(0) if image.dim() == 3 else image
    if frames.shape[0] % temporal_patch_size:
        pad = temporal_patch_size - frames.shape[0] % temporal_patch_size
        frames = torch.cat([frames, frames[-1:].expand(pad, *frames.shape[1:])], dim=0)
    t_len, c, h, w = frames.shape
    gt, gh, gw = t_len // temporal_patch_size, h // patch_size, w // patch_size
    x = frames.reshape(
        gt, temporal_patch_size, c, gh // merge_size, merge_size, patch_size, gw // merge_size, merge_size, patch_size
    )
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    patches = x.reshape(gt * gh * gw, c * temporal_patch_size * patch_size * patch_size)
    rows = torch.arange(gh).unsqueeze(1).expand(gh, gw)
    cols = torch.arange(gw).unsqueeze(0).expand(gh, gw)

    def merge_order(a):
        return a.reshape(gh // merge_size, merge_size, gw // merge_size, merge_size).permute(0, 2, 1, 3).flatten()

    positions = torch.stack([merge_order(rows), merge_order(cols)], dim=1).repeat(gt, 1)
    return patches, positions, (gt, gh, gw)


# ----------------------------------------------------------------------------------------------------
# attention


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool = True,
    softmax_scale: float | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every sequence on its own, one sequence at a time, by an explicit softmax.

    q: ``(total_tokens, heads, head_dim)``; k, v: ``(total_tokens_k, kv_heads, head_dim)`` with
    ``heads % kv_heads == 0``; cu_seqlens (and cu_seqlens_k, default cu_seqlens): ``(batch + 1,)``.
    Causal masking is bottom-right aligned (query ``i`` of ``Lq`` sees keys ``j <= i + Lk - Lq``) and a
    query that sees no key gets zeros, the flash-attention conventions. Computes in float64, returns
    ``(total_tokens, heads, head_dim)`` in q's dtype.
    """
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    group = q.shape[1] // k.shape[1]
    bounds_q = cu_seqlens.tolist()
    bounds_k = cu_seqlens_k.tolist()
    outputs = []
    for b in range(len(bounds_q) - 1):
        qs = q[bounds_q[b] : bounds_q[b + 1]].double()
        ks = k[bounds_k[b] : bounds_k[b + 1]].double().repeat_interleave(group, dim=1)
        vs = v[bounds_k[b] : bounds_k[b + 1]].double().repeat_interleave(group, dim=1)
        len_q, len_k = qs.shape[0], ks.shape[0]
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale  # (heads, len_q, len_k)
        allowed = torch.ones(len_q, len_k, dtype=torch.bool, device=q.device)
        if causal:
            i = torch.arange(len_q, device=q.device)[:, None]
            j = torch.arange(len_k, device=q.device)[None, :]
            allowed = j <= i + (len_k - len_q)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)  # rows with no allowed key: all -inf -> NaN -> 0
        outputs.append(torch.einsum("hij,jhd->ihd", weights, vs))
    return torch.cat(outputs).to(q.dtype)


# ---------------------------------------------------------------------------------------------------------
# packing (collate side)
# ---------------------------------------------------------------------------------------------------------


def _as_list(value: Any) -> list[int]:
    return [int(v) for v in value.tolist()] if hasattr(value, "tolist") else [int(v) for v in value]


def pack_batch_reference(
    samples: Sequence[Mapping[str, Any]],
    *,
    mask_first_label: bool = True,
    ignore_index: int = -100,
    pad_to_multiple_of: int | None = None,
    pad_to_length: int | None = None,
    pad_token_id: int = 0,
    max_num_seqs: int | None = None,
    max_seqlen_buckets: int | Sequence[int] | None = None,
) -> dict[str, Any]:
    """Reference of ``omnibal_kernels.pack_batch``'s text fields, built sample by sample in Python lists
    (the way Hugging Face's ``DataCollatorWithFlattening`` does it), then turned into tensors."""
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    seq_idx: list[int] = []
    seq_lens: list[int] = []
    for index, sample in enumerate(samples):
        ids = _as_list(sample["input_ids"])
        labs = _as_list(sample["labels"]) if sample.get("labels") is not None else list(ids)
        if mask_first_label and ids:
            labs[0] = ignore_index
        input_ids += ids
        labels += labs
        position_ids += list(range(len(ids)))
        seq_idx += [index] * len(ids)
        seq_lens.append(len(ids))
    total = len(input_ids)
    padded = total
    if pad_to_multiple_of is not None:
        padded = -(-total // pad_to_multiple_of) * pad_to_multiple_of
    if pad_to_length is not None:
        padded = pad_to_length
    pad = padded - total
    if pad:
        input_ids += [pad_token_id] * pad
        labels += [ignore_index] * pad
        position_ids += list(range(pad))
        seq_idx += [len(samples)] * pad
        seq_lens.append(pad)
    if max_num_seqs is not None:
        seq_lens += [0] * (max_num_seqs - len(seq_lens))
    cu_seqlens = [0]
    for n in seq_lens:
        cu_seqlens.append(cu_seqlens[-1] + n)
    max_seqlen = max(seq_lens)
    if isinstance(max_seqlen_buckets, int):
        max_seqlen = -(-max_seqlen // max_seqlen_buckets) * max_seqlen_buckets
    elif max_seqlen_buckets is not None:
        max_seqlen = min(b for b in max_seqlen_buckets if b >= max_seqlen)
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    return {
        "input_ids": torch.tensor([input_ids], dtype=torch.int64),
        "labels": torch.tensor([labels], dtype=torch.int64),
        "position_ids": torch.tensor([position_ids], dtype=torch.int64),
        "cu_seqlens": cu,
        "max_seqlen": max_seqlen,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "seq_idx": torch.tensor([seq_idx], dtype=torch.int32),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }
