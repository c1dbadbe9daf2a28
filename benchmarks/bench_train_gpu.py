"""Measured training steps on one GPU: the suite's DDP measurement (:mod:`omnibal_kernels.bench.training`) with
every rank in turn on one CUDA device, balanced packs against random padded batches, beside the cost model
calibrated in the same run.

    python3 benchmarks/bench_train_gpu.py --json OUT.json

The workload, the schedule of turns, the calibration and the report are the CPU run's code
(:func:`omnibal_kernels.bench.training.measure_on_device`); only the sizes, the device and the clock differ:
busy times are CUDA events around a whole step (forward under bfloat16 autocast, backward, fused AdamW), and
the ranks of a step train one after another on the same device, so no all-reduce is timed. The JSON holds the
report under ``training`` (speed-up measured and predicted, each rank's busy time measured and predicted, the
fit and its held-out error) and no kernel rows. Without CUDA the script writes ``{"skipped": ...}`` and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from omnibal_kernels.bench.training import Sizes, measure_on_device

# Wider than the CPU run's (width 256) so that a step is not only kernel launches; 8 ranks share the device.
# Sized to finish within gpu_check.sh's limit for this script.
SIZES = Sizes(samples=2048, batch=16, hidden=1024, layers=4, rounds=2, calibration_packs=64, world_size=8)
SEED = 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    args = parser.parse_args(argv)
    result: dict[str, Any] = dict(script="bench_train_gpu", skipped=None, rows=[], errors=[])
    if not torch.cuda.is_available():
        result["skipped"] = "no CUDA device"
        args.json.write_text(json.dumps(result, indent=1))
        print("bench_train_gpu: skipped (no CUDA device)")
        return 0
    result["environment"] = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
    )
    start = time.perf_counter()
    try:
        training = measure_on_device(SIZES, SEED, torch.device("cuda"), progress=False)
        training.update(sizes=dataclasses.asdict(SIZES), seconds=time.perf_counter() - start)
        result["training"] = training
    except Exception as exc:  # the report says what failed; the other scripts' numbers stand
        result["errors"].append(f"measure_on_device: {type(exc).__name__}: {exc}")
    args.json.write_text(json.dumps(result, indent=1))
    if result["errors"]:
        print(f"bench_train_gpu: {result['errors'][0]}", file=sys.stderr)
        return 1
    t = result["training"]
    print(
        f"bench_train_gpu: {t['speedup']:.2f}x measured, {t['speedup_predicted']:.2f}x predicted, "
        f"busy error at most {t['busy_error_max']:.1%} -> {args.json}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
