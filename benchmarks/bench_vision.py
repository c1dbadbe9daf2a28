"""Vision benchmarks: counting, bucketing and patch packing, ours next to the plain reference.

Run: ``python -m pytest benchmarks/bench_vision.py --benchmark-only``. Image sizes are drawn once from a fixed
seed (log-uniform sides, like web images); patch counts for bucketing are the Qwen2-VL patches of those sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnibal_kernels import testing
from omnibal_kernels.vision import bucket_by_patches, internvl_num_tiles, qwen2vl_grid

N_IMAGES = 20_000


def _sizes(n: int = N_IMAGES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = np.exp(rng.uniform(np.log(64), np.log(4000), n)).astype(np.int64)
    h = np.exp(rng.uniform(np.log(64), np.log(4000), n)).astype(np.int64)
    return w, h


def _info(benchmark, **kw) -> None:
    benchmark.extra_info.update({"torch": torch.__version__, "numpy": np.__version__, "device": "cpu", **kw})


@pytest.mark.parametrize("provider", ["ours", "reference"])
def test_internvl_tiles(benchmark, provider: str) -> None:
    benchmark.group = "internvl_tiles"
    w, h = _sizes()
    if provider == "ours":
        fn = lambda: internvl_num_tiles(w, h)  # noqa: E731
    else:
        ws, hs = w[:2000].tolist(), h[:2000].tolist()  # per-image Python loop on a tenth of the images
        fn = lambda: [testing.internvl_tiles_reference(a, b) for a, b in zip(ws, hs)]  # noqa: E731
    benchmark(fn)
    _info(benchmark, images=N_IMAGES if provider == "ours" else 2000)


@pytest.mark.parametrize("provider", ["ours", "reference"])
def test_qwen2vl_grid(benchmark, provider: str) -> None:
    benchmark.group = "qwen2vl_grid"
    w, h = _sizes()
    if provider == "ours":
        fn = lambda: qwen2vl_grid(w, h)  # noqa: E731
    else:
        ws, hs = w[:2000].tolist(), h[:2000].tolist()
        fn = lambda: [testing.qwen2vl_counts_reference(b, a) for a, b in zip(ws, hs)]  # noqa: E731
    benchmark(fn)
    _info(benchmark, images=N_IMAGES if provider == "ours" else 2000)


@pytest.mark.parametrize("provider", ["ours", "numpy_argsort"])
def test_bucket(benchmark, provider: str) -> None:
    benchmark.group = "bucket_by_patches"
    w, h = _sizes(200_000 // 10 * 10)
    counts = qwen2vl_grid(w, h).num_patches
    bnd = np.unique(counts)[1:]
    bucket_by_patches(counts)  # compile
    if provider == "ours":
        fn = lambda: bucket_by_patches(counts, bnd)  # noqa: E731
    else:
        fn = lambda: testing.bucket_sort_reference(counts, bnd)  # noqa: E731
    benchmark(fn)
    _info(benchmark, images=counts.size, buckets=bnd.size + 1)


@pytest.mark.parametrize("provider", ["ours", "reshape_permute", "copy_floor"])
def test_pack_patches_cpu(benchmark, provider: str) -> None:
    from omnibal_kernels.cpu.patchify import patchify as pack_patches

    benchmark.group = "pack_patches_cpu"
    rng = np.random.default_rng(1)
    images = [torch.randn(3, 28 * int(rng.integers(4, 20)), 28 * int(rng.integers(4, 20))) for _ in range(8)]
    pack_patches(images[:1])  # compile
    if provider == "ours":
        fn = lambda: pack_patches(images)  # noqa: E731
    elif provider == "reshape_permute":
        fn = lambda: torch.cat([testing.patchify_reference(x)[0] for x in images])  # noqa: E731
    else:
        # the same bytes written once: the temporal patch doubles the output
        fn = lambda: torch.cat([torch.cat([x.flatten(), x.flatten()]) for x in images])  # noqa: E731
    benchmark(fn)
    _info(benchmark, bytes_written=sum(2 * x.numel() * 4 for x in images))
