"""GPU benchmarks of the Triton ops in omnibal_kernels.ops, with the baselines measured in the same run.

    python3 benchmarks/bench_ops_gpu.py --json OUT.json

Each row: the op, the case, the provider, the median time by ``triton.testing.do_bench``, the bytes the op
must move (read + written), the effective bandwidth, the ratio to a device-to-device copy of the same bytes
(``vs_copy``: copy time / op time, 1.0 = copy speed) and, where one exists, to the well-known baseline
(``vs_baseline``: baseline time / op time, > 1 = faster). Batches are drawn from the real InternVL-Chat SFT
token lengths bundled with the package. Without CUDA the script writes ``{"skipped": ...}`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# cases: (name, samples per batch, hidden size, dtype). The first moves ~1.2 GB per pack, so the kernel,
# not the Python launch path, sets its time; the second is one small micro-batch, where ~50 us of host
# work per call may show; the last packs token ids and measures latency more than bandwidth.
HIDDEN_CASES = [
    ("sft64-h4096", 64, 4096, torch.bfloat16),
    ("sft16-h2048", 16, 2048, torch.bfloat16),
    ("sft64-ids", 64, 1, torch.int64),
]
# tile alternatives for pack on the first case: (tile_bytes, row_bytes, num_warps)
TILE_SWEEP = [(8192, 4096, 4), (16384, 4096, 4), (16384, 8192, 4), (32768, 8192, 8), (65536, 8192, 8)]
SEED = 0


def _lengths(n: int, seed: int) -> tuple[list[int], str]:
    """``n`` LLM token lengths drawn from the bundled real data (synthetic if the file is missing)."""
    rng = np.random.default_rng(seed)
    try:
        from omnibal_kernels.data import DEFAULT_LENGTHS_PATH

        llm = np.load(DEFAULT_LENGTHS_PATH)["llm"]
        return [int(v) for v in rng.choice(llm, size=n, replace=False)], "internvl_sft_lengths"
    except (ImportError, OSError, KeyError):
        return [int(v) for v in rng.integers(64, 2048, size=n)], "synthetic"


class Bench:
    """Timing helpers; every number comes from ``do_bench`` medians in this process.

    ``device`` and ``time_fn`` (``fn -> ms``) exist so that the CPU test of the benchmark code can run it
    on tiny shapes with a plain timer; a real run keeps the defaults.
    """

    def __init__(self, device: str = "cuda", time_fn: Callable[[Callable[[], object]], float] | None = None) -> None:
        if time_fn is None:
            from triton.testing import do_bench

            def time_fn(fn: Callable[[], object]) -> float:
                return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

        self.device = device
        self._time_fn = time_fn
        self._copy_ms: dict[int, float] = {}
        self.rows: list[dict[str, Any]] = []

    def time_ms(self, fn: Callable[[], object]) -> float:
        return self._time_fn(fn)

    def copy_ms(self, bytes_moved: int) -> float:
        """A device-to-device copy that reads and writes ``bytes_moved`` bytes in total."""
        n = max(bytes_moved // 2, 1)
        if n not in self._copy_ms:
            src = torch.empty(n, dtype=torch.uint8, device=self.device)
            dst = torch.empty_like(src)
            self._copy_ms[n] = self.time_ms(lambda: dst.copy_(src))
            del src, dst
        return self._copy_ms[n]

    def add(
        self,
        op: str,
        case: str,
        provider: str,
        ms: float,
        bytes_moved: int,
        baseline_ms: float | None,
        baseline: str | None,
        **extra: Any,
    ) -> None:
        copy = self.copy_ms(bytes_moved)
        self.rows.append(
            dict(
                op=op,
                case=case,
                provider=provider,
                ms=round(ms, 5),
                bytes=bytes_moved,
                gbps=round(bytes_moved / ms / 1e6, 1),
                copy_ms=round(copy, 5),
                vs_copy=round(copy / ms, 3),
                baseline=baseline,
                vs_baseline=None if baseline_ms is None else round(baseline_ms / ms, 3),
                **extra,
            )
        )


def bench_pack(b: Bench) -> None:
    for case, n, hidden, dtype in HIDDEN_CASES:
        _bench_pack_case(b, case, n, hidden, dtype)
        torch.cuda.empty_cache()  # the case's tensors were freed when it returned


def _bench_pack_case(b: Bench, case: str, n: int, hidden: int, dtype: torch.dtype) -> None:
    from omnibal_kernels.ops import unpad as ops_pack
    from omnibal_kernels.testing import pad_input_reference, unpad_input_reference

    lens, source = _lengths(n, SEED)
    batch, padded_len, total = n, max(lens), sum(lens)
    shape = (batch, padded_len) if hidden == 1 else (batch, padded_len, hidden)
    if dtype.is_floating_point:
        padded = torch.randn(shape, device="cuda").to(dtype)
    else:
        padded = torch.randint(0, 150000, shape, device="cuda", dtype=dtype)
    mask = torch.arange(padded_len, device="cuda")[None, :] < torch.tensor(lens, device="cuda")[:, None]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    elem = padded.element_size() * hidden
    info = dict(
        dtype=str(dtype).replace("torch.", ""),
        batch=batch,
        padded_len=padded_len,
        tokens=total,
        hidden=hidden,
        lengths=source,
    )

    # correctness guard: a benchmark of wrong results is worthless
    ref, indices, _, _ = unpad_input_reference(padded, mask)
    packed = ops_pack.unpad(padded, lens)
    if not torch.equal(packed, ref):
        raise AssertionError(f"pack differs from unpad_input on {case}")

    unpad_ms = b.time_ms(lambda: unpad_input_reference(padded, mask))
    pack_bytes = 2 * total * elem
    b.add(
        "pack",
        case,
        "omnibal (host lengths)",
        b.time_ms(lambda: ops_pack.unpad(padded, lens)),
        pack_bytes,
        unpad_ms,
        "unpad_input",
        **info,
    )
    b.add(
        "pack",
        case,
        "omnibal (device cu_seqlens)",
        b.time_ms(lambda: ops_pack.unpad(padded, cu_seqlens=cu, total_tokens=total)),
        pack_bytes,
        unpad_ms,
        "unpad_input",
        **info,
    )
    b.add(
        "pack_from_mask",
        case,
        "omnibal",
        b.time_ms(lambda: ops_pack.unpad_from_mask(padded, mask)),
        pack_bytes,
        unpad_ms,
        "unpad_input",
        **info,
    )
    b.add("pack", case, "unpad_input (nonzero + index_select)", unpad_ms, pack_bytes, None, None, **info)

    pad_ms = b.time_ms(lambda: pad_input_reference(ref, indices, batch, padded_len))
    unpack_bytes = total * elem + batch * padded_len * elem
    b.add(
        "unpack",
        case,
        "omnibal (device cu_seqlens)",
        b.time_ms(lambda: ops_pack.pad(ref, cu_seqlens=cu, padded_len=padded_len)),
        unpack_bytes,
        pad_ms,
        "pad_input",
        **info,
    )
    b.add("unpack", case, "pad_input (zeros + index_put)", pad_ms, unpack_bytes, None, None, **info)

    if case == HIDDEN_CASES[0][0]:
        for tile_bytes, row_bytes, num_warps in TILE_SWEEP:
            ms = b.time_ms(
                lambda: ops_pack.launch_unpad(
                    padded, cu, total, tile_bytes=tile_bytes, row_bytes=row_bytes, num_warps=num_warps
                )
            )
            b.add(
                "pack",
                case,
                f"tile {tile_bytes}/{row_bytes}/w{num_warps}",
                ms,
                pack_bytes,
                unpad_ms,
                "unpad_input",
                **info,
            )


def _torch_varlen_metadata(seq_lens: torch.Tensor, labels: torch.Tensor, total: int):
    """The same outputs from stock torch ops (several launches; output_size avoids a sync)."""
    cu = torch.nn.functional.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0))
    seq_idx = torch.repeat_interleave(
        torch.arange(seq_lens.numel(), device=seq_lens.device), seq_lens, output_size=total
    )
    position_ids = torch.arange(total, device=seq_lens.device) - cu[seq_idx]
    out = labels.clone()
    out[cu[:-1].long()] = -100
    return cu, position_ids, seq_idx.int(), out


def bench_varlen_metadata(b: Bench) -> None:
    from omnibal_kernels.ops.varlen_metadata import varlen_metadata

    for n in (16, 256):
        lens, source = _lengths(n, SEED + 1)
        total = sum(lens)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        labels = torch.randint(0, 150000, (total,), device="cuda")
        got = varlen_metadata(seq_lens, labels=labels)
        want = _torch_varlen_metadata(seq_lens, labels, total)
        if not (
            torch.equal(got.cu_seqlens, want[0])
            and torch.equal(got.position_ids, want[1])
            and torch.equal(got.seq_idx, want[2])
            and torch.equal(got.labels, want[3])
        ):
            raise AssertionError(f"varlen_metadata differs from the torch ops for {n} sequences")
        # written: positions int64, seq_idx int32, labels int64; read: labels, lengths
        bytes_moved = total * (8 + 4 + 8 + 8) + 8 * n
        base_ms = b.time_ms(lambda: _torch_varlen_metadata(seq_lens, labels, total))
        info = dict(batch=n, tokens=total, lengths=source)
        b.add(
            "varlen_metadata",
            f"sft{n}",
            "omnibal",
            b.time_ms(lambda: varlen_metadata(seq_lens, labels=labels)),
            bytes_moved,
            base_ms,
            "torch ops",
            **info,
        )
        b.add(
            "varlen_metadata",
            f"sft{n}",
            "torch ops (cumsum, repeat_interleave)",
            base_ms,
            bytes_moved,
            None,
            None,
            **info,
        )


# Later ops add their benchmark function here.
BENCHMARKS: list[Callable[[Bench], None]] = [bench_pack, bench_varlen_metadata]


def run(script: str, benchmarks: list[Callable[[Bench], None]], description: str, argv: list[str] | None = None) -> int:
    """Command line of a GPU benchmark script: run ``benchmarks`` and write ``--json`` (rows, errors,
    environment), or ``{"skipped": ...}`` without CUDA. Exit status 1 when a benchmark raised."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    args = parser.parse_args(argv)
    result: dict[str, Any] = dict(script=script, skipped=None, rows=[], errors=[])
    if not torch.cuda.is_available():
        result["skipped"] = "no CUDA device"
        args.json.write_text(json.dumps(result, indent=1))
        print(f"{script}: skipped (no CUDA device)")
        return 0
    import triton

    result["environment"] = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
    )
    bench = Bench()
    for fn in benchmarks:
        try:
            fn(bench)
        except Exception as exc:  # one failing benchmark must not hide the others' numbers
            result["errors"].append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            print(f"{script}: {fn.__name__} failed: {exc}", file=sys.stderr)
        torch.cuda.empty_cache()
    result["rows"] = bench.rows
    args.json.write_text(json.dumps(result, indent=1))
    print(f"{script}: {len(bench.rows)} rows, {len(result['errors'])} errors -> {args.json}")
    return 1 if result["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    return run("bench_ops_gpu", BENCHMARKS, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
