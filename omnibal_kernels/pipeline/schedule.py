"""Pipeline schedule simulator: 1F1B and GPipe, per-stage forward/backward times and communication.

Each stage runs its operations in the schedule's fixed order; an operation starts when the stage is free and
its input has arrived: the forward of micro-batch ``i`` on stage ``s`` needs that forward on stage ``s - 1``
and its send to ``s``; the backward needs the backward on ``s + 1`` and the gradient's send back (and its own
forward). A send occupies the sending stage right after the operation (blocking point-to-point sends, as in
Megatron's 1F1B without communication overlap), so a stage's time per micro-batch is its forward, backward and
two sends, the quantity the partition search balances. Activations of a micro-batch are held from the end of
its forward to the end of its backward.

- GPipe: all forwards, then all backwards (micro-batch order), so every stage holds ``m`` micro-batches.
- 1F1B (PipeDream-flush, Megatron's default): ``min(P - s - 1, m)`` warm-up forwards on stage ``s``, then one
  forward and one backward in turn, then the remaining backwards; stage ``s`` holds ``min(P - s, m)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["SCHEDULES", "ScheduleResult", "simulate", "held_micro_batches"]

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class ScheduleResult:
    """One simulated step: ``step_ms``, ``bubble`` (idle fraction of stage-time), per stage: ``busy_ms``
    (compute and sends),
    ``held`` (most micro-batches whose activations are alive at once), ``peak_bytes``, and the timeline
    ``ops`` as ``(stage, "F"|"B", micro_batch, start_ms, end_ms)``."""

    step_ms: float
    bubble: float
    busy_ms: tuple[float, ...]
    held: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    ops: tuple[tuple[int, str, int, float, float], ...]


def held_micro_batches(schedule: str, stages: int, micro_batches: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak under ``schedule``."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(stages - stage, micro_batches)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def _order(schedule: str, stages: int, m: int, s: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(stages - s - 1, m)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        order += [("F", f), ("B", b)]
        f += 1
        b += 1
    order += [("B", i) for i in range(b, m)]
    return order


def simulate(
    forward_ms: Sequence[float],
    backward_ms: Sequence[float],
    micro_batches: int,
    *,
    schedule: str = "1f1b",
    comm_ms: Optional[Sequence[float]] = None,
    activation_bytes: Optional[Sequence[float]] = None,
    static_bytes: Optional[Sequence[float]] = None,
) -> ScheduleResult:
    """Simulates one training step of a P-stage pipeline.

    Args:
        forward_ms, backward_ms: (P,) per-stage time of one micro-batch (backward includes recomputation).
        micro_batches: m, micro-batches per step.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        comm_ms: (P - 1,) send time between stages s and s + 1, each way (activations forward, their
            gradient back); it occupies the sender.
        activation_bytes: (P,) bytes one micro-batch keeps on each stage; static_bytes: (P,) bytes always held.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    fwd = np.asarray(forward_ms, dtype=np.float64)
    bwd = np.asarray(backward_ms, dtype=np.float64)
    p = fwd.size
    if fwd.ndim != 1 or p == 0 or bwd.shape != fwd.shape:
        raise ValueError(f"forward_ms and backward_ms must be 1-D of one length >= 1, got {fwd.shape}, {bwd.shape}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an int >= 1, got {micro_batches!r}")
    m = int(micro_batches)
    comm = np.zeros(max(p - 1, 0)) if comm_ms is None else np.asarray(comm_ms, dtype=np.float64)
    if comm.shape != (max(p - 1, 0),):
        raise ValueError(f"comm_ms must have P - 1 = {p - 1} entries, got shape {comm.shape}")
    for name, arr in (("forward_ms", fwd), ("backward_ms", bwd), ("comm_ms", comm)):
        if not np.isfinite(arr).all() or (arr < 0).any():
            raise ValueError(f"{name} must be finite and >= 0")
    act = np.zeros(p) if activation_bytes is None else np.asarray(activation_bytes, dtype=np.float64)
    static = np.zeros(p) if static_bytes is None else np.asarray(static_bytes, dtype=np.float64)
    if act.shape != (p,) or static.shape != (p,):
        raise ValueError(f"activation_bytes and static_bytes must have P = {p} entries")

    orders = [_order(schedule, p, m, s) for s in range(p)]
    done_f = np.full((p, m), np.nan)
    done_b = np.full((p, m), np.nan)
    pos = [0] * p
    free = np.zeros(p)
    ops = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                # done_* include the op's send, so the receiver may start when they are reached.
                if kind == "F":
                    ready = 0.0 if s == 0 else done_f[s - 1, i]
                    dur = fwd[s] + (comm[s] if s < p - 1 else 0.0)
                else:
                    ready = done_f[s, i] if s == p - 1 else max(done_b[s + 1, i], done_f[s, i])
                    dur = bwd[s] + (comm[s - 1] if s > 0 else 0.0)
                if np.isnan(ready):
                    break
                start = max(free[s], ready)
                end = start + dur
                (done_f if kind == "F" else done_b)[s, i] = end
                free[s] = end
                ops.append((s, kind, i, float(start), float(end)))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for these schedules; guards against an order bug looping forever
            raise RuntimeError("pipeline schedule deadlocked")

    step = float(max(end for *_, end in ops)) if ops else 0.0
    sends = np.concatenate([comm, [0.0]]) + np.concatenate([[0.0], comm])
    busy = [float(m * (fwd[s] + bwd[s] + sends[s])) for s in range(p)]
    bubble = 0.0 if step == 0 else 1.0 - sum(busy) / (p * step)
    held = []
    for s in range(p):
        events = sorted([(done_f[s, i], 1) for i in range(m)] + [(done_b[s, i], -1) for i in range(m)],
                        key=lambda e: (e[0], e[1]))
        live = peak = 0
        for _, delta in events:
            live += delta
            peak = max(peak, live)
        held.append(peak)
    peak_bytes = tuple(int(static[s] + held[s] * act[s]) for s in range(p))
    return ScheduleResult(step, float(bubble), tuple(busy), tuple(held), peak_bytes, tuple(ops))
