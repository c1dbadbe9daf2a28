"""Measured training speed-up: the ``ddp`` provider of ``omnibal_kernels.bench`` under pytest-benchmark.

    python -m pytest benchmarks/bench_train.py --benchmark-only
    python benchmarks/bench_train.py [--quick]

A tiny VLM trained with DDP over 2 CPU processes (gloo, one thread each), random padded batches against
balanced packs (``pack_batch`` + ``varlen_attention``), the same samples, beside the cost model calibrated in
the same run: the whole run is timed once and its report (busy seconds per epoch and per rank, measured and
predicted, tokens/s, all-reduce share, speed-up measured and predicted, the fit) goes to ``extra_info``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.bench import Config, environment, run_suite
from omnibal_kernels.bench.markdown import to_markdown
from omnibal_kernels.bench.runner import provider


def test_ddp_tiny_vlm(benchmark: Any) -> None:
    benchmark.group = "DDP tiny VLM, 2 CPU processes"
    result = benchmark.pedantic(lambda: provider("ddp")(Config())["measured_ddp"], rounds=1, iterations=1)
    benchmark.extra_info.update(environment()["versions"], **result)


def main(argv: list[str]) -> int:
    report = run_suite(["ddp"], quick="--quick" in argv, log=lambda s: print(s, file=sys.stderr))
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
