"""Context-parallel layouts: the ``cp`` provider of ``omnibal_kernels.bench`` as pytest-benchmark groups.

    python -m pytest benchmarks/bench_context_parallel.py --benchmark-only   # groups: cp layout <mix>, CP <c>
    python benchmarks/bench_context_parallel.py [--quick]                     # the suite's table for this part

Group "cp layout <mix>, CP <c>": the time to plan one pack's layout (``context_parallel_rank_times``) for every
strategy, on the first pack of each long-context mix; the strategy's row of the suite (balance, K/V exchanged,
padding, step time over contiguous, on that pack) in ``extra_info``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

if __name__ == "__main__":  # run as a script from a checkout: import the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnibal_kernels.bench import environment, run_suite
from omnibal_kernels.bench.context_parallel import CP_SIZES, MIXES, STRATEGIES, cp_rows, mix_packs
from omnibal_kernels.bench.markdown import to_markdown
from omnibal_kernels.context_parallel import ContextParallelOptions, context_parallel_rank_times


@pytest.mark.parametrize("context_parallel_size", CP_SIZES)
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_layout(benchmark, mix: str, context_parallel_size: int, name: str) -> None:
    packs = mix_packs(mix, 1)
    strategy, pad, slack = STRATEGIES[name]
    cap = None if slack is None else int(np.ceil(slack * int(packs[0].sum()) / context_parallel_size))
    row = next(r for r in cp_rows(mix, packs, context_parallel_size) if r["strategy"] == name)
    benchmark.group = f"cp layout {mix}, CP {context_parallel_size}"
    benchmark.extra_info.update(row, sequences=len(packs[0]), **environment()["versions"])
    benchmark(
        lambda: context_parallel_rank_times(
            packs[0],
            ContextParallelOptions(
                size=context_parallel_size, strategy=strategy, pad_sequences=pad, max_rank_tokens=cap
            ),
        )
    )


def main(argv: list[str]) -> int:
    report = run_suite(["cp"], quick="--quick" in argv, log=lambda s: print(s, file=sys.stderr))
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
