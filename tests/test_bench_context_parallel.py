"""The suite's ``cp`` part: rows for every strategy, targets checked, misses reported, packs full."""

from __future__ import annotations

import numpy as np

from omnibal_kernels.bench.context_parallel import MIXES, STRATEGIES, _misses, cp_rows, mix_packs
from omnibal_kernels.context_parallel import ContextParallelOptions, context_parallel_rank_times


def test_packs_are_full_and_rows_cover_every_strategy():
    for mix in ("long_and_short_128k", "bundled_32k"):
        packs = mix_packs(mix, 2)
        capacity = MIXES[mix][1]
        assert len(packs) == 2 and all(0.9 * capacity <= int(p.sum()) <= capacity for p in packs)
        rows = cp_rows(mix, packs, 4)
        assert [r["strategy"] for r in rows] == list(STRATEGIES)
        by = {r["strategy"]: r for r in rows}
        assert by["contiguous"]["step_vs_contiguous"] == 1.0 and by["zigzag_megatron"]["kv_vs_zigzag"] == 1.0
        assert by["zigzag_megatron"]["padding"] > 0 and by["zigzag"]["padding"] == 0
        assert by["auto"]["step_vs_contiguous"] <= min(by[n]["step_vs_contiguous"] for n in STRATEGIES) + 1e-12
        assert not any("slower" in m for m in by["auto"]["misses"])
        assert by["auto_tokens_1.1"]["token_imbalance"] <= 1.1 + 4 / (capacity / 4)


def test_misses_are_reported():
    """Negative control: rows over the targets are listed as misses."""
    packs = [np.array([60_000, 3_000, 2_000])]
    times = {
        name: [context_parallel_rank_times(packs[0], ContextParallelOptions(size=2, strategy=s, pad_sequences=p))]
        for name, (s, p, _) in STRATEGIES.items()
    }
    rows = [dict(strategy=name, worst_imbalance=1.0, kv_vs_zigzag=0.1) for name in STRATEGIES]
    assert _misses("long_and_short_128k", 2, times, rows) == {}
    next(r for r in rows if r["strategy"] == "auto").update(worst_imbalance=1.05, kv_vs_zigzag=0.5)
    times["auto"] = times["contiguous"]  # slower than the best fixed strategy on this pack
    misses = _misses("long_and_short_128k", 2, times, rows)["auto"]
    assert len(misses) == 3 and "1.0500 > 1.02" in misses[0] and "0.50x" in misses[1] and "1 packs" in misses[2]


def test_vision_rows_balance_the_vit_and_route_less_than_an_all_gather():
    from omnibal_kernels.bench.context_parallel_vision import VISION_MIXES, cp_vision_rows, pack_work, vision_packs
    from omnibal_kernels.bench.markdown import _cp_vision

    rows = []
    for mix, (_, capacity) in VISION_MIXES.items():
        packs = vision_packs(mix, 2)
        assert len(packs) == 2 and all(sum(s[0].size for s in p) <= capacity for p in packs)
        for cp in (2, 8):
            row = cp_vision_rows(mix, packs, cp)
            assert row["worst_vit_imbalance_fair"] <= 1.05 and not row["misses"]
            assert 0 < row["rows_vs_all_gather"] < 1 and row["step_split_vs_whole"] < 1
            rows.append(row)
        text, work = pack_work(packs[0], ContextParallelOptions(size=4))
        assert text.shape == (4,) and np.isclose(work.times.sum(), work.units.cost.sum())
    table = "\n".join(_cp_vision(rows))
    assert "long_video_128k" in table and "Misses:" in table and "- none" in table


def test_a_vision_miss_is_reported():
    """Negative control: one unit per rank but three units: ViT max/mean over the target is a miss."""
    from omnibal_kernels.bench.context_parallel_vision import IMAGE, cp_vision_rows

    sample = (np.r_[np.zeros(10, np.int64), np.full(16, IMAGE), np.zeros(10, np.int64)], [(IMAGE, 1, 8, 8)])
    row = cp_vision_rows("image_docs_64k", [[sample, sample, sample]], 2)
    assert row["worst_vit_imbalance_fair"] > 1.05 and "ViT max/mean" in row["misses"][0]
