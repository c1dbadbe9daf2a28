"""Planning speed as N grows, against ``numpy.argsort`` of the same token counts, and the sampler at scale.

The loads are the bundled real ones (70,706 samples) and the same resampled with a fixed seed to 1.2M and
10M samples. ``balanced`` and ``random`` include their capacity search (the default call); ``isf`` runs at
the capacities the authors' search finds on the real data (18 / 6016), since its search plans every
candidate; the baselines use the balanced capacities (16 / 5376) and micro-batches of 4 samples. Each method
is timed after a warm-up call, best of a few runs, taking turns with ``argsort`` so both see the same
machine.

Pack size: text-only loads (log-normal tokens, median 900) planned at capacities that hold 4 to 10,000 samples
per pack, 200k to 10M samples, against ``argsort`` the same way: the step refinement's work grows with the
samples, not with the square of a pack's size.

The sampler's construction (capacity search and the first epoch's plan) is measured in a fresh process:
seconds and peak resident memory above what the process held with the loads already in memory.

The wait at a new epoch: long-tailed text at many ranks, where a plan takes seconds. After a pass over epoch 0
that lasts longer than a plan (the training it stands for sleeps), the seconds from ``set_epoch(1)`` to the first
batch of epoch 1, with the next epoch planned ahead during the pass and without.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

from ..balance import named_cost_model, plan_packs
from ..balance.options import PlanOptions
from ..lengths import Lengths
from ..sampler import BalancedBatchSampler
from ..synthetic import synthetic_lengths
from .baselines import ffd_tokens_plan, length_grouped_plan, random_padded_plan
from .runner import Config, register

WORLD_SIZE = 8
FULL_SIZES = (None, 1_200_000, 10_000_000)  # None: the 70,706 bundled samples as they are
QUICK_SIZES = (None,)
SAMPLER_FULL, SAMPLER_QUICK = 10_000_000, 200_000
# (samples per pack, samples): at least 2 * WORLD_SIZE packs at every size; 200k samples at every pack size
PACK_SIZES_FULL = tuple((per_pack, 200_000) for per_pack in (4, 20, 100, 1_000, 10_000)) + (
    (4, 1_200_000),
    (20, 1_200_000),
    (100, 1_200_000),
    (1_000, 2_000_000),
    (10_000, 10_000_000),
)
PACK_SIZES_QUICK = ((4, 200_000), (1_000, 200_000))
# (samples, world size) of the wait at a new epoch
EPOCH_WAIT_FULL, EPOCH_WAIT_QUICK = (1_200_000, 1024), (100_000, 64)


def _methods(lengths: Any, seed: int) -> dict[str, Callable[[], object]]:
    return {
        "balanced": lambda: plan_packs(lengths, PlanOptions(target_batch_size=4.0, seed=seed), world_size=WORLD_SIZE),
        "random": lambda: plan_packs(
            lengths, PlanOptions(method="random", target_batch_size=4.0, seed=seed), world_size=WORLD_SIZE
        ),
        "isf": lambda: plan_packs(
            lengths, PlanOptions(method="isf", vit_capacity=18, llm_capacity=6016, seed=seed), world_size=WORLD_SIZE
        ),
        "length_grouped": lambda: length_grouped_plan(lengths, world_size=WORLD_SIZE, batch_size=4, seed=seed),
        "random_padded": lambda: random_padded_plan(lengths, world_size=WORLD_SIZE, batch_size=4, seed=seed),
        "ffd_tokens": lambda: ffd_tokens_plan(
            lengths, world_size=WORLD_SIZE, llm_capacity=5376, vit_capacity=16, seed=seed
        ),
    }


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_methods(lengths: Any, seed: int, repeats: int) -> dict[str, float]:
    """Best seconds of every method and of ``numpy.argsort`` (key ``"argsort"``), interleaved rounds."""
    funcs = _methods(lengths, seed)
    funcs["argsort"] = lambda: np.argsort(lengths.llm)
    for fn in funcs.values():  # warm-up: lazy imports, compiled code, caches
        fn()
    best = {name: float("inf") for name in funcs}
    for _ in range(repeats):
        for name, fn in funcs.items():
            best[name] = min(best[name], _once(fn))
    return best


_SAMPLER_PROBE = """
import json, sys, time
from omnibal_kernels.synthetic import synthetic_lengths
from omnibal_kernels.balance import PlanOptions
from omnibal_kernels.sampler import BalancedBatchSampler

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

lengths = synthetic_lengths("bundled", int(sys.argv[1]), int(sys.argv[2]))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak resident set (VmHWM) to the current one
before = status("VmRSS")
start = time.perf_counter()
sampler = BalancedBatchSampler(lengths, PlanOptions(seed=int(sys.argv[2])), world_size=8, rank=0)
seconds = time.perf_counter() - start
print(json.dumps({"n": len(lengths), "seconds": seconds, "peak_mib": (status("VmHWM") - before) / 1024,
                  "loads_mib": (lengths.vit.nbytes + lengths.llm.nbytes) / 2**20, "steps": len(sampler)}))
"""


def sampler_cost(n: int, seed: int) -> dict[str, Any]:
    """Construction seconds and peak memory (MiB above the loads) of ``BalancedBatchSampler`` on ``n``
    resampled real samples, 8 ranks, measured in a fresh process (Linux: the peak resident set is reset
    through ``/proc/self/clear_refs`` before construction and read from ``VmHWM`` after)."""
    if not sys.platform.startswith("linux"):
        return {"n": n, "skipped": "peak memory is read from Linux /proc"}
    out = subprocess.run(
        [sys.executable, "-c", _SAMPLER_PROBE, str(n), str(seed)], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"sampler probe failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def epoch_start_wait(n: int, world_size: int, seed: int) -> dict[str, Any]:
    """Seconds from ``set_epoch(1)`` to epoch 1's first batch of ``BalancedBatchSampler`` (rank 0 of
    ``world_size``, ``n`` ``text_long_tail`` samples under ``llama_7b``), after a pass over epoch 0 that lasts
    twice a plan, with ``plan_ahead`` off and on; and the sampler's construction seconds (a plan with its
    capacity search)."""
    lengths = synthetic_lengths("text_long_tail", n, seed)
    options = PlanOptions(seed=seed, cost_model=named_cost_model("llama_7b"))
    row: dict[str, Any] = {"n": n, "world_size": world_size}
    for ahead in (False, True):
        start = time.perf_counter()
        sampler = BalancedBatchSampler(lengths, options, world_size=world_size, rank=0, plan_ahead=ahead)
        built = time.perf_counter() - start
        pass_seconds = 2.0 * built
        steps = len(sampler)
        for _ in sampler:
            time.sleep(pass_seconds / steps)
        sampler.set_epoch(1)
        start = time.perf_counter()
        next(iter(sampler))
        row["wait_ahead" if ahead else "wait"] = time.perf_counter() - start
        if ahead:
            sampler.fingerprint(epoch=2)  # waits for epoch 2, planned ahead meanwhile: not into what runs next
        else:
            row["built"] = built
    return row


def pack_size_row(per_pack: int, n: int, seed: int) -> dict[str, Any]:
    """``balanced`` on ``n`` text samples at an LLM capacity of ``per_pack`` mean samples (longer samples in
    packs of their own), against argsort."""
    rng = np.random.default_rng([seed, per_pack])
    tokens = np.clip(np.round(rng.lognormal(np.log(900), 1.0, n)), 16, 32_768).astype(np.int64)
    lengths = Lengths(np.zeros(n, np.int64), tokens)
    capacity = int(np.ceil(per_pack * tokens.mean()))
    options = PlanOptions(vit_capacity=0, llm_capacity=capacity, oversize="single")
    funcs = {
        "balanced": lambda: plan_packs(lengths, options, world_size=WORLD_SIZE),
        "argsort": lambda: np.argsort(tokens),
    }
    plan = plan_packs(lengths, options, world_size=WORLD_SIZE)  # also the warm-up
    funcs["argsort"]()
    best = {name: float("inf") for name in funcs}
    for _ in range(2 if n >= 5_000_000 else 5):
        for name, fn in funcs.items():
            best[name] = min(best[name], _once(fn))
    return {
        "per_pack": per_pack,
        "samples_per_pack": n / plan.num_packs,
        "n": n,
        "seconds": best["balanced"],
        "argsort_ratio": best["balanced"] / best["argsort"],
    }


@register("planning")
def run(config: Config) -> dict[str, Any]:
    """Planning seconds per method and N, their ratio to ``numpy.argsort``, and the sampler's cost."""
    rows = []
    for n in QUICK_SIZES if config.quick else FULL_SIZES:
        lengths = synthetic_lengths("bundled", n, config.seed)
        repeats = 2 if len(lengths) >= 5_000_000 else (3 if config.quick else 5)
        best = time_methods(lengths, config.seed, repeats)
        for method, seconds in best.items():
            if method != "argsort":
                rows.append(
                    {
                        "method": method,
                        "n": len(lengths),
                        "seconds": seconds,
                        "argsort_ratio": seconds / best["argsort"],
                    }
                )
        config.say(
            f"  {len(lengths):,} samples: balanced {best['balanced'] * 1e3:.1f} ms, "
            f"argsort {best['argsort'] * 1e3:.1f} ms"
        )
    pack_sizes = []
    for per_pack, n in PACK_SIZES_QUICK if config.quick else PACK_SIZES_FULL:
        pack_sizes.append(pack_size_row(per_pack, n, config.seed))
        config.say(f"  {per_pack} samples per pack, {n:,} samples: {pack_sizes[-1]['argsort_ratio']:.1f}x argsort")
    sampler = sampler_cost(SAMPLER_QUICK if config.quick else SAMPLER_FULL, config.seed)
    if "seconds" in sampler:
        config.say(
            f"  sampler on {sampler['n']:,} samples: {sampler['seconds']:.2f} s, peak +{sampler['peak_mib']:.0f} MiB"
        )
    wait = epoch_start_wait(*(EPOCH_WAIT_QUICK if config.quick else EPOCH_WAIT_FULL), config.seed)
    config.say(
        f"  a new epoch at {wait['world_size']} ranks waits {wait['wait']:.2f} s for its plan, "
        f"{wait['wait_ahead']:.3f} s planned ahead"
    )
    return {"planning": rows, "planning_pack_sizes": pack_sizes, "sampler": sampler, "epoch_start_wait": wait}
