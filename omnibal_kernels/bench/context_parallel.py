"""Context parallelism (the ``cp`` part): per-rank balance, K/V exchanged, padding and step time of each strategy.

Long-context mixes (seeded draws, packed by ``plan_packs`` at the mix's capacity, so packs are full):

==========================  ==================================================================================
``text_128k``               long documents only, log-uniform 4k-128k tokens, packs of 128k
``long_and_short_128k``     10% long documents (16k-128k) among short ones (log-normal, median 800), packs of 128k
``text_long_tail_64k``      ``synthetic.text_long_tail`` (median about 900, tail to 32k), packs of 64k
``long_video_128k``         40% long videos (128-1024 frames of 360p-720p, Qwen2-VL tokens) among image and
                            text samples (``synthetic.patch_multires``), packs of 128k
``video_mix_64k``           ``synthetic.video_mix`` (30% videos of 8-64 frames), packs of 64k
``bundled_32k``             the bundled InternVL SFT lengths (all short), packs of 32k
==========================  ==================================================================================

Every pack is laid out at CP 2, 4 and 8 by each strategy, and priced by the same cost model
(``ContextParallelCost.llama3_8b``: tokens, attention pairs in 128-wide kernel tiles, K/V rows received):

* ``contiguous``: the packed tokens cut into equal ranges (no balancing);
* ``zigzag_megatron``: zigzag with every sequence padded to a multiple of 2 x CP (Megatron THD,
  ring-flash-attention);
* ``zigzag``: zigzag with the remainder dealt, no padding;
* ``per_document``: torch's per-document head-tail;
* ``hybrid`` and ``auto``: ours; ``auto_tokens_1.1``: ``auto`` with ``max_rank_tokens`` at 1.1x the mean
  tokens per rank (activation memory held within 10%).

Per row, over the packs: per-rank predicted time max / mean (mean and worst pack), K/V rows exchanged per pack
by :func:`~omnibal_kernels.context_parallel.context_parallel_attention` for that layout (the rows each rank
needs) and its ratio to ``zigzag_megatron``'s, padding tokens per real token, and the predicted step time (the
slowest rank, summed over the packs) over ``contiguous``'s. ``ring_kv`` is what ring or all-gather attention
moves for the Megatron layout, ``(CP - 1)`` times the padded tokens, for reference. ``ms``: milliseconds to
plan one pack's layout (``context_parallel_rank_times``); ``token_imbalance``: the most tokens a rank holds over
the mean, worst pack (activation memory grows with it). Targets: hybrid and auto max / mean <= 1.02 on every pack; on
mixes with short sequences auto exchanges at most a quarter of ``zigzag_megatron``'s K/V; on every pack auto
exchanges no more K/V than ``zigzag`` and is never predicted slower than the best fixed strategy that exchanges no
more. Misses are listed, never dropped.

Vision-language mixes (``cp_vision``: each pack's images divided among the CP ranks, their embedding rows
routed) are described in :mod:`.context_parallel_vision`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np

from ..balance import plan_packs
from ..balance.options import PlanOptions
from ..context_parallel import context_parallel_rank_times
from ..context_parallel.options import ContextParallelOptions, Strategy
from ..lengths import Lengths, default_lengths
from ..synthetic import synthetic_lengths
from ..vision import qwen2vl_grid
from .context_parallel_vision import VISION_MIXES, cp_vision_rows, vision_packs
from .runner import Config, register

CP_SIZES = (2, 4, 8)
STRATEGIES: dict[
    str, tuple[Strategy, bool, Optional[float]]
] = {  # row name -> (strategy, pad_sequences, most tokens per rank over the mean or None)
    "contiguous": ("contiguous", False, None),
    "zigzag_megatron": ("zigzag", True, None),
    "zigzag": ("zigzag", False, None),
    "per_document": ("per_document", False, None),
    "hybrid": ("hybrid", False, None),
    "auto": ("auto", False, None),
    "auto_tokens_1.1": ("auto", False, 1.1),
}
FIXED = ("contiguous", "zigzag_megatron", "zigzag", "per_document", "hybrid")
FULL: dict[str, Any] = dict(packs=32, cp_sizes=CP_SIZES)
QUICK: dict[str, Any] = dict(packs=2, cp_sizes=(2, 8))


def _log_uniform(rng: np.random.Generator, n: int, low: float, high: float) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), n)).astype(np.int64)


def _long_and_short(rng: np.random.Generator, n: int) -> np.ndarray:
    short = np.clip(rng.lognormal(np.log(800), 1.0, n), 16, 8192).astype(np.int64)
    return np.where(rng.random(n) < 0.1, _log_uniform(rng, n, 16_384, 131_072), short)


def _long_video(rng: np.random.Generator, n: int) -> np.ndarray:
    frames = rng.integers(128, 1025, n)
    width = rng.choice(np.array([640, 854, 1280]), size=n)
    patches = np.asarray(qwen2vl_grid(width, (width * 9) // 16, frames, max_pixels=360 * 420).num_patches)
    video = patches // 4 + np.clip(rng.lognormal(np.log(150), 0.9, n), 4, 4096).astype(np.int64)
    images = synthetic_lengths("patch_multires", n, seed=int(rng.integers(1 << 31))).llm
    return np.where(rng.random(n) < 0.4, np.minimum(video, 131_072), images)


def _synthetic(kind: str) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: synthetic_lengths(kind, n, seed=int(rng.integers(1 << 31))).llm


def _bundled(rng: np.random.Generator, n: int) -> np.ndarray:
    real = default_lengths().llm
    return real[rng.integers(0, real.size, n)]


# mix -> (draw of n token counts, pack capacity, whether it has short sequences)
MIXES: dict[str, tuple[Callable[[np.random.Generator, int], np.ndarray], int, bool]] = {
    "text_128k": (lambda rng, n: _log_uniform(rng, n, 4096, 131_072), 131_072, False),
    "long_and_short_128k": (_long_and_short, 131_072, True),
    "text_long_tail_64k": (_synthetic("text_long_tail"), 65_536, True),
    "long_video_128k": (_long_video, 131_072, True),
    "video_mix_64k": (_synthetic("video_mix"), 65_536, True),
    "bundled_32k": (_bundled, 32_768, True),
}


def mix_packs(mix: str, packs: int, seed: int = 0) -> list[np.ndarray]:
    """``packs`` packs (sequence lengths in packed order) of ``mix``, planned by ``plan_packs``."""
    draw, capacity, _ = MIXES[mix]
    rng = np.random.default_rng([seed, sorted(MIXES).index(mix)])
    probe = draw(rng, 4096)
    n = int(np.ceil(packs * capacity / probe.mean() * 1.3)) + 64
    llm = np.minimum(draw(rng, n), capacity)
    plan = plan_packs(
        Lengths(np.zeros(n, np.int64), llm), PlanOptions(vit_capacity=1, llm_capacity=capacity, seed=seed), world_size=1
    )
    return [llm[plan.pack(p)] for p in range(min(packs, plan.num_packs))]


def cp_rows(mix: str, packs: list[np.ndarray], context_parallel_size: int) -> list[dict[str, Any]]:
    """One row per strategy for the packs of ``mix`` at ``context_parallel_size``, and the targets it misses."""
    times: dict[str, list] = {name: [] for name in STRATEGIES}
    seconds = dict.fromkeys(STRATEGIES, 0.0)
    for lengths in packs:
        for name, (strategy, pad, slack) in STRATEGIES.items():
            cap = None if slack is None else int(np.ceil(slack * int(lengths.sum()) / context_parallel_size))
            start = time.perf_counter()
            times[name].append(
                context_parallel_rank_times(
                    lengths,
                    ContextParallelOptions(
                        size=context_parallel_size, strategy=strategy, pad_sequences=pad, max_rank_tokens=cap
                    ),
                )
            )
            seconds[name] += time.perf_counter() - start
    tokens = float(sum(int(x.sum()) for x in packs))

    def total(name: str, key: str) -> float:
        return float(sum(getattr(t, key) for t in times[name]))

    rows = []
    for name in STRATEGIES:
        imbalance = [t.imbalance for t in times[name]]
        row: dict[str, Any] = dict(
            mix=mix,
            context_parallel_size=context_parallel_size,
            strategy=name,
            packs=len(packs),
            imbalance=float(np.mean(imbalance)),
            worst_imbalance=float(max(imbalance)),
            token_imbalance=float(max(t.tokens.max() / t.tokens.mean() for t in times[name])),
            kv_per_pack=total(name, "kv_exchanged") / len(packs),
            kv_vs_zigzag=total(name, "kv_exchanged") / max(total("zigzag_megatron", "kv_exchanged"), 1.0),
            padding=total(name, "padding") / tokens,
            step_vs_contiguous=total(name, "step_time") / total("contiguous", "step_time"),
            chosen=sorted({t.strategy for t in times[name]}),
            ms=seconds[name] / len(packs) * 1e3,
        )
        if name == "zigzag_megatron":
            row["ring_kv"] = (context_parallel_size - 1) * (tokens + total(name, "padding")) / len(packs)
        rows.append(row)
    misses = _misses(mix, context_parallel_size, times, rows)
    for row in rows:
        row["misses"] = misses.get(row["strategy"], [])
    return rows


def _misses(
    mix: str, context_parallel_size: int, times: dict[str, list], rows: list[dict[str, Any]]
) -> dict[str, list[str]]:
    by_name = {r["strategy"]: r for r in rows}
    misses: dict[str, list[str]] = {}
    for name in ("hybrid", "auto"):
        if by_name[name]["worst_imbalance"] > 1.02:
            misses.setdefault(name, []).append(f"max/mean {by_name[name]['worst_imbalance']:.4f} > 1.02")
    if MIXES[mix][2] and by_name["auto"]["kv_vs_zigzag"] > 0.25:
        misses.setdefault("auto", []).append(f"K/V {by_name['auto']['kv_vs_zigzag']:.2f}x zigzag's > 0.25x")
    slower = more = 0
    for i, a in enumerate(times["auto"]):
        zigzag = times["zigzag"][i].kv_exchanged
        frugal = [times[f][i].step_time for f in FIXED if times[f][i].kv_exchanged <= zigzag]
        slower += a.step_time > min(frugal)
        more += a.kv_exchanged > zigzag
    if slower:
        misses.setdefault("auto", []).append(
            f"slower than the best fixed strategy exchanging no more K/V than zigzag on {slower} packs"
        )
    if more:
        misses.setdefault("auto", []).append(f"more K/V than zigzag on {more} packs")
    return misses


@register("cp")
def run(config: Config) -> dict[str, Any]:
    sizes = QUICK if config.quick else FULL
    rows = []
    for mix in MIXES:
        packs = mix_packs(mix, sizes["packs"], config.seed)
        config.say(f"[bench] cp: {mix}, {len(packs)} packs")
        for context_parallel_size in sizes["cp_sizes"]:
            rows += cp_rows(mix, packs, context_parallel_size)
    vision = []
    for mix in VISION_MIXES:
        vision_mix = vision_packs(mix, sizes["packs"], config.seed)
        config.say(f"[bench] cp: {mix} (vision), {len(vision_mix)} packs")
        vision += [cp_vision_rows(mix, vision_mix, size) for size in sizes["cp_sizes"]]
    return {"cp": rows, "cp_vision": vision}
