"""GPU kernels, only where CUDA is present: the Triton op benchmarks of ``benchmarks/`` in a subprocess.

``benchmarks/bench_ops_gpu.py`` and ``benchmarks/bench_vision_gpu.py`` (the scripts ``gpu_check.sh`` runs)
time every op with ``triton.testing.do_bench`` medians and report GB/s, the ratio to a device copy of the
same bytes and to the torch baseline. They live in a source checkout, next to the package; an installed
package without them, or a machine without CUDA, gets ``{"skipped": why}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .runner import Config, register

SCRIPTS = ("bench_ops_gpu.py", "bench_vision_gpu.py")
TIMEOUT_S = 300


def benchmarks_dir() -> Path:
    """The ``benchmarks/`` folder of the source checkout this package runs from (it may not exist)."""
    return Path(__file__).resolve().parents[2] / "benchmarks"


@register("gpu")
def run(config: Config) -> dict[str, Any]:
    """Rows of the GPU benchmark scripts, or why they were skipped."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": {"skipped": "no CUDA device"}}
    folder = benchmarks_dir()
    missing = [s for s in SCRIPTS if not (folder / s).exists()]
    if missing:
        return {"gpu": {"skipped": f"{', '.join(missing)} not found: run from a source checkout"}}
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # real kernels on the GPU
    out: dict[str, Any] = {"skipped": None, "rows": [], "errors": []}
    with tempfile.TemporaryDirectory() as tmp:
        for script in SCRIPTS:
            path = Path(tmp) / f"{script}.json"
            config.say(f"  {script} ...")
            proc = subprocess.run(
                [sys.executable, str(folder / script), "--json", str(path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
            if not path.exists():
                out["errors"].append(f"{script}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
                continue
            result = json.loads(path.read_text())
            out["rows"] += result.get("rows", [])
            out["errors"] += [f"{script}: {e}" for e in result.get("errors", [])]
            out.setdefault("environment", result.get("environment"))
    return {"gpu": out}
