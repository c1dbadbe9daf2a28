"""The end-to-end example runs: plain python and torchrun with 2 gloo ranks, a few optimizer steps each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_tiny_vlm.py"


def _run(cmd: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _check(out: str, world_size: int, steps: int) -> None:
    lines = re.findall(
        r"^step (\d+): loss ([\d.]+)  tiles per rank \[([\d, ]+)\]  tokens per rank \[([\d, ]+)\]$", out, flags=re.M
    )
    assert [int(s) for s, *_ in lines] == list(range(steps)), out
    for _, loss, tiles, tokens in lines:
        tiles = [int(x) for x in tiles.split(",")]
        tokens = [int(x) for x in tokens.split(",")]
        assert len(tiles) == len(tokens) == world_size
        assert 0 < float(loss) < 10
        # per optimizer step the ranks' loads are within 10% of each other (ViT binds: equal tiles)
        assert max(tokens) <= 1.1 * min(tokens) and max(tiles) <= 1.1 * min(tiles), (tiles, tokens)
    assert re.search(rf"^{steps} steps, \d+ tokens in [\d.]+ s: \d+ tokens/s over {world_size} rank", out, re.M), out
    assert "balance: {" in out and f"'world_size': {world_size}" in out


@pytest.mark.slow
def test_example_plain_python():
    _check(_run([sys.executable, str(EXAMPLE), "--steps", "3"]), world_size=1, steps=3)


@pytest.mark.slow
def test_example_torchrun_two_ranks():
    out = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLE),
            "--steps",
            "3",
        ]
    )
    _check(out, world_size=2, steps=3)
