"""An independent pipeline simulator for the tests: the orders of torch.distributed.pipelining (its own code for
the interleaved and zero-bubble schedules, written out here for GPipe and 1F1B) run through a plain
longest-path relaxation over the operations, with sends occupying the sender."""

from __future__ import annotations

import types

import numpy as np


def torch_order(schedule: str, ranks: int, micro_batches: int, virtual_stages: int) -> list[list[tuple[str, int, int]]]:
    """Every rank's ``(kind, stage, micro-batch)`` order as torch builds it (``B`` for its I and full B)."""
    P, m, v = ranks, micro_batches, virtual_stages
    if schedule == "gpipe":
        return [[("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)] for r in range(P)]
    if schedule == "1f1b":
        out = []
        for r in range(P):
            warm = min(m, P - r)  # Schedule1F1B: warm-up forwards, then one backward and one forward in turn
            ops = [("F", r, i) for i in range(warm)]
            f = warm
            for b in range(m):
                ops.append(("B", r, b))
                if f < m:
                    ops.append(("F", r, f))
                    f += 1
            out.append(ops)
        return out
    from torch.distributed.pipelining import schedules

    cls = {
        "interleaved": schedules.ScheduleInterleaved1F1B,
        "interleaved-zb": schedules.ScheduleInterleavedZeroBubble,
        "zbv": schedules.ScheduleZBVZeroBubble,
    }[schedule]
    rounds = max(1, m // P)
    fake = types.SimpleNamespace(
        pp_group_size=P,
        n_local_stages=v,
        _n_microbatches=m,
        num_stages=P * v,
        number_of_rounds=rounds,
        microbatches_per_round=m // rounds,
    )
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    out = []
    for r in range(P):
        ops = cls._calculate_single_rank_operations(fake, r)
        out.append([(kinds[a.computation_type.value], a.stage_index, a.microbatch_index) for a in ops if a is not None])
    return out


def reference_step(orders, f, b, w, comm, rank_of) -> tuple[float, list[int]]:
    """Step time and the most micro-batches alive per stage (until B, or W where the order has W).

    f, b, w: (S,) compute times (b: the input-gradient part where the order has W); comm: (S - 1,) sends,
    paid by the sender when the stages sit on different ranks."""
    S = len(f)
    send_f = [comm[j] if j < S - 1 and rank_of[j] != rank_of[j + 1] else 0.0 for j in range(S)]
    send_b = [comm[j - 1] if j > 0 and rank_of[j] != rank_of[j - 1] else 0.0 for j in range(S)]
    dur = {"F": lambda j: f[j] + send_f[j], "B": lambda j: b[j] + send_b[j], "W": lambda j: w[j]}
    end: dict[tuple[str, int, int], float] = {}
    pos = [0] * len(orders)
    free = [0.0] * len(orders)
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r, ops in enumerate(orders):
            while pos[r] < len(ops):
                kind, j, i = ops[pos[r]]
                need = {
                    "F": ("F", j - 1, i) if j > 0 else None,
                    "B": ("B", j + 1, i) if j < S - 1 else ("F", j, i),
                    "W": ("B", j, i),
                }[kind]
                if need is not None and need not in end:
                    break
                start = max(free[r], end[need] if need else 0.0)
                end[(kind, j, i)] = free[r] = start + dur[kind](j)
                pos[r] += 1
                left -= 1
                moved = True
        assert moved, "the reference orders deadlocked"
    has_w = any(k == "W" for ops in orders for k, _, _ in ops)
    held = []
    for j in range(S):
        r = rank_of[j]
        alive = peak = 0
        for kind, jj, _ in orders[r]:
            if jj != j:
                continue
            alive += 1 if kind == "F" else -1 if kind == ("W" if has_w else "B") else 0
            peak = max(peak, alive)
        held.append(peak)
    return max(end.values()), held


def rank_of(schedule: str, ranks: int, virtual_stages: int) -> list[int]:
    if schedule == "zbv":
        return [j if j < ranks else 2 * ranks - 1 - j for j in range(2 * ranks)]
    return [j % ranks for j in range(ranks * virtual_stages)]


def random_times(rng: np.random.Generator, S: int, zero_bubble: bool):
    f = rng.uniform(0.0, 3.0, S)
    b = rng.uniform(0.0, 5.0, S)
    if rng.random() < 0.3:
        f[rng.integers(S)] *= 5
    w = b * rng.uniform(0.0, 1.0, S) if zero_bubble else np.zeros(S)
    return f, b, w, rng.uniform(0.0, 0.5, max(S - 1, 0))
