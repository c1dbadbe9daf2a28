"""GPU benchmarks of the vision kernels (patch packing, patch-count bucketing, image counting), with the
baselines measured in the same run.

    python3 benchmarks/bench_vision_gpu.py --json OUT.json

Rows have the layout of ``bench_ops_gpu.py`` (median ms by ``triton.testing.do_bench``, bytes read +
written, GB/s, ``vs_copy`` = time of a device-to-device copy of the same bytes / op time, ``vs_baseline`` =
baseline time / op time):

* ``pack_patches``: images of different sizes -> Qwen2-VL patches. Bytes: the pixels read once plus the
  patches written (a still image fills both temporal frames, so it writes twice what it reads). Baseline:
  the image processor's reshape/permute per image, then ``torch.cat``. Target: ``vs_copy >= 0.8``.
* ``bucket_sort``: stable counting sort of per-image patch counts into buckets. Bytes: counts read,
  ``perm`` and ``bucket_ids`` written. Baseline: ``searchsorted`` + stable ``torch.sort`` + ``scatter_add``.
* ``internvl_tiles`` / ``smart_resize``: the counting kernels over many image sizes. Baseline: the numpy
  path of ``omnibal_kernels.vision`` on the host (what the same call does for CPU input).

Image sizes are synthetic (log-uniform sides from 64 to 4000 pixels, fixed seed): the bundled length data
holds tile counts, not image sizes. Every op is checked against its reference before it is timed. Without
CUDA the script writes ``{"skipped": ...}`` and exits 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from bench_ops_gpu import Bench, run  # noqa: E402

SEED = 0
# The target for pack_patches: at least this fraction of copy bandwidth.
PACK_PATCHES_TARGET = 0.8
# Full-size shapes (a few hundred MB to ~2 GB moved per call, so kernel time, not launch overhead, is
# measured) and tiny ones for the CPU test of this file (Triton interpreter).
SIZES = dict(
    full=dict(images=256, padded=64, videos=16, frames=8, max_pixels=28 * 28 * 1280, counts=1_000_000),
    tiny=dict(images=3, padded=2, videos=1, frames=3, max_pixels=56 * 56, counts=300),
)


def _image_sizes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (width, height) pairs, log-uniform sides in [64, 4000] pixels."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(np.log(64), np.log(4000), n)).astype(np.int64)
    h = np.exp(rng.uniform(np.log(64), np.log(4000), n)).astype(np.int64)
    return w, h


def _resized(n: int, max_pixels: int, seed: int) -> list[tuple[int, int]]:
    """Qwen2-VL ``smart_resize`` (height, width) of ``n`` synthetic images."""
    from omnibal_kernels.vision import qwen2vl_smart_resize

    w, h = _image_sizes(n, seed)
    keep = np.maximum(w, h) / np.minimum(w, h) <= 200
    hh, ww = qwen2vl_smart_resize(w[keep], h[keep], min_pixels=min(56 * 56, max_pixels), max_pixels=max_pixels)
    return list(zip(hh.tolist(), ww.tolist()))


def _count_label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 else str(n)


def _size(b: Bench) -> dict[str, int]:
    return SIZES["full" if b.device == "cuda" else "tiny"]


def _reference_patches(images: list[torch.Tensor]) -> torch.Tensor:
    from omnibal_kernels.testing import patchify_reference

    return torch.cat([patchify_reference(x)[0] for x in images])


def bench_pack_patches(b: Bench) -> None:
    from omnibal_kernels.ops.patchify import launch_patchify as pack_patches_triton

    size = _size(b)
    gen = torch.Generator(device=b.device).manual_seed(SEED)
    cases = []
    sizes = _resized(size["images"], size["max_pixels"], SEED)
    images = [torch.randn(3, h, w, device=b.device, generator=gen).bfloat16() for h, w in sizes]
    cases.append((f"img{len(images)}-bf16", images, None, images, sum(x.numel() for x in images) * 2))
    # one padded tensor plus sizes (a batch straight from a padded image loader)
    sizes = _resized(size["padded"], size["max_pixels"], SEED + 1)
    hmax, wmax = max(h for h, _ in sizes), max(w for _, w in sizes)
    padded = torch.randn(len(sizes), 3, hmax, wmax, device=b.device, generator=gen).bfloat16()
    hw = torch.tensor(sizes, dtype=torch.int64)
    views = [padded[i, :, :h, :w] for i, (h, w) in enumerate(sizes)]
    cases.append((f"pad{len(sizes)}-bf16", padded, hw, views, sum(v.numel() for v in views) * 2))
    # clips: the temporal patch takes two real frames, so reads equal writes
    sizes = _resized(size["videos"], size["max_pixels"] // 4, SEED + 2)
    clips = [torch.randn(size["frames"], 3, h, w, device=b.device, generator=gen).bfloat16() for h, w in sizes]
    cases.append((f"vid{len(clips)}x{size['frames']}-bf16", clips, None, clips, sum(x.numel() for x in clips) * 2))
    for case, images, hw, views, read_bytes in cases:
        out = pack_patches_triton(images, hw)
        if not torch.equal(out.patches, _reference_patches(views)):
            raise AssertionError(f"pack_patches differs from the reshape/permute reference on {case}")
        bytes_moved = read_bytes + out.patches.numel() * out.patches.element_size()
        info = dict(
            dtype="bfloat16",
            images=len(views),
            patches=int(out.patches.shape[0]),
            target_vs_copy=PACK_PATCHES_TARGET,
            sizes="log-uniform 64-4000 px, smart_resize",
        )
        del out
        base_ms = b.time_ms(lambda: _reference_patches(views))
        b.add(
            "pack_patches",
            case,
            "omnibal (Triton)",
            b.time_ms(lambda: pack_patches_triton(images, hw)),
            bytes_moved,
            base_ms,
            "reshape/permute + cat",
            **info,
        )
        b.add("pack_patches", case, "reshape/permute + cat (torch)", base_ms, bytes_moved, None, None, **info)


def _torch_bucket_sort(counts: torch.Tensor, boundaries: torch.Tensor):
    """The same outputs from stock torch ops (searchsorted, stable sort, scatter_add; no host sync)."""
    bucket_ids = torch.searchsorted(boundaries, counts, right=True)
    perm = torch.sort(bucket_ids, stable=True).indices
    sizes = torch.zeros(boundaries.numel() + 1, dtype=torch.int64, device=counts.device)
    sizes.scatter_add_(0, bucket_ids, torch.ones_like(bucket_ids))
    offsets = torch.nn.functional.pad(torch.cumsum(sizes, 0), (1, 0))
    return perm, offsets, bucket_ids.to(torch.int32)


def bench_bucket_sort(b: Bench) -> None:
    from omnibal_kernels.ops.bucket import bucket_sort
    from omnibal_kernels.vision import bucket_by_patches, qwen2vl_grid

    n = _size(b)["counts"]
    w, h = _image_sizes(n, SEED + 3)
    keep = np.maximum(w, h) / np.minimum(w, h) <= 200
    counts_np = qwen2vl_grid(w[keep], h[keep]).num_patches
    counts = torch.from_numpy(counts_np).to(b.device)
    n = counts.numel()
    quantiles = np.sort(counts_np)[np.arange(1, 16) * n // 16]
    label = _count_label(n)
    for case, bnd_np in ((f"{label}-16b", quantiles), (f"{label}-uniq", np.unique(counts_np)[1:])):
        bnd = torch.from_numpy(bnd_np).to(b.device)
        got = bucket_sort(counts, bnd)
        want = _torch_bucket_sort(counts, bnd)
        if not all(torch.equal(x, y) for x, y in zip(got[:3], want)):
            raise AssertionError(f"bucket_sort differs from torch's stable sort on {case}")
        bytes_moved = n * (8 + 8 + 4)  # counts read; perm (int64) and bucket_ids (int32) written
        info = dict(items=n, buckets=int(bnd.numel()) + 1)
        base_ms = b.time_ms(lambda: _torch_bucket_sort(counts, bnd))
        b.add(
            "bucket_sort",
            case,
            "omnibal (Triton)",
            b.time_ms(lambda: bucket_sort(counts, bnd)),
            bytes_moved,
            base_ms,
            "torch stable sort",
            **info,
        )
        b.add("bucket_sort", case, "torch stable sort", base_ms, bytes_moved, None, None, **info)
    # the public function: validation and boundary choice included (it syncs to check the counts)
    ms = b.time_ms(lambda: bucket_by_patches(counts, num_buckets=16))
    b.add("bucket_sort", f"{label}-16b", "bucket_by_patches (public)", ms, n * 20, None, None, items=n)


def _host_ms(fn: Callable[[], object], repeat: int = 3) -> float:
    """Median wall time of a host (numpy) call."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def bench_counts(b: Bench) -> None:
    from omnibal_kernels.ops.vision_counts import internvl_tile_grid as internvl_tile_grid_triton
    from omnibal_kernels.ops.vision_counts import smart_resize as smart_resize_triton
    from omnibal_kernels.vision import internvl_target_ratios, internvl_tile_grid, qwen2vl_smart_resize

    n = _size(b)["counts"]
    w_np, h_np = _image_sizes(n, SEED + 4)
    keep = np.maximum(w_np, h_np) / np.minimum(w_np, h_np) <= 200
    w_np, h_np = w_np[keep], h_np[keep]
    n = w_np.shape[0]
    w, h = torch.from_numpy(w_np).to(b.device), torch.from_numpy(h_np).to(b.device)
    ratios = internvl_target_ratios(1, 12)
    info = dict(images=n, baseline_device="cpu (numpy)")

    got = internvl_tile_grid_triton(w, h, ratios, 448, True)
    want = internvl_tile_grid(w_np, h_np)
    if not all(np.array_equal(x.cpu().numpy(), y) for x, y in zip(got, want)):
        raise AssertionError("internvl tile kernel differs from the numpy path")
    base_ms = _host_ms(lambda: internvl_tile_grid(w_np, h_np))
    ms = b.time_ms(lambda: internvl_tile_grid_triton(w, h, ratios, 448, True))
    b.add("internvl_tiles", _count_label(n), "omnibal (Triton)", ms, n * (16 + 24), base_ms, "numpy (host)", **info)
    b.add("internvl_tiles", _count_label(n), "numpy (host)", base_ms, n * (16 + 24), None, None, **info)

    args = (28, 56 * 56, 28 * 28 * 1280)
    got = smart_resize_triton(w, h, *args)
    want = qwen2vl_smart_resize(w_np, h_np)
    if not all(np.array_equal(x.cpu().numpy(), y) for x, y in zip(got, want)):
        raise AssertionError("smart_resize kernel differs from the numpy path")
    base_ms = _host_ms(lambda: qwen2vl_smart_resize(w_np, h_np))
    ms = b.time_ms(lambda: smart_resize_triton(w, h, *args))
    b.add("smart_resize", _count_label(n), "omnibal (Triton)", ms, n * 32, base_ms, "numpy (host)", **info)
    b.add("smart_resize", _count_label(n), "numpy (host)", base_ms, n * 32, None, None, **info)


BENCHMARKS: list[Callable[[Bench], None]] = [bench_pack_patches, bench_bucket_sort, bench_counts]


def main(argv: list[str] | None = None) -> int:
    return run("bench_vision_gpu", BENCHMARKS, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
