"""Pipeline schedule simulator: GPipe, 1F1B, interleaved 1F1B and two zero-bubble schedules, with per-stage or
per-(micro-batch, stage) times and communication.

A pipeline of ``P`` ranks runs a chain cut into ``S = P * v`` virtual stages (``v`` chunks per rank). Each rank
runs its operations in the schedule's fixed order (the orders of ``torch.distributed.pipelining``, tested
against its ``pipeline_order``); an operation starts when the rank is free and its input has arrived: the
forward ``F`` of micro-batch ``i`` on virtual stage ``j`` needs ``F(j - 1, i)`` and its send, the backward
``B`` needs ``B(j + 1, i)`` and the gradient's send (the last stage, its own ``F``). A send occupies the
sending rank right after the operation (blocking point-to-point sends, as in Megatron's 1F1B without
communication overlap); stages on one rank exchange nothing. Activations of a micro-batch are held from the end
of its forward to the end of its backward (of its weight gradient under zero bubble).

- ``"gpipe"``: all forwards, then all backwards; every stage holds ``m`` micro-batches.
- ``"1f1b"`` (PipeDream-flush, Megatron's default): ``min(P - r - 1, m)`` warm-up forwards on rank ``r``, then a
  forward and a backward in turn, then the remaining backwards; rank ``r`` holds ``min(P - r, m)``.
- ``"interleaved"`` (``ScheduleInterleaved1F1B``, Megatron's virtual pipeline): chunks placed round-robin
  (virtual stage ``j`` on rank ``j mod P``), micro-batches in rounds of ``m // max(1, m // P)`` per chunk,
  ``(v - 1) * round + 2 (P - 1 - r)`` warm-up forwards.
- ``"interleaved-zb"`` (``ScheduleInterleavedZeroBubble``, ZB-H1 for ``v = 1``): the backward split into the
  input gradient ``B`` and the weight gradient ``W``; ``(v - 1) * round + P - 1 - r`` warm-up forwards, a ``W``
  after every ``B`` from rank ``r``'s ``r``-th on, the rest at the end.
- ``"zbv"`` (``ScheduleZBVZeroBubble``): two chunks per rank in a V (rank ``r`` holds virtual stages ``r`` and
  ``2P - 1 - r``), the same split backward.

The orders are generated, never stored. A step of per-stage times (the same for every micro-batch) takes time
and memory bounded by the schedule's steady state, whatever the count of micro-batches: the step of a schedule
in its steady state grows by the same time every period, so it is measured on windows of a bounded count and
extrapolated (:func:`steady_threshold`); times per micro-batch, or ``timeline=True``, take O(operations).
Counts of micro-batches are at most :data:`MAX_MICRO_BATCHES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from .._checks import check_positive_int
from ._kernels import (
    DEADLOCK,
    GPIPE,
    INTERLEAVED,
    INTERLEAVED_ZB,
    OK,
    ONE_F_ONE_B,
    PAUSED,
    ZBV,
    new_state,
    order_into,
    simulate_into,
)

__all__ = [
    "MAX_MICRO_BATCHES",
    "SCHEDULES",
    "TORCH_SCHEDULES",
    "ScheduleResult",
    "check_micro_batches",
    "held_micro_batches",
    "representative_micro_batches",
    "schedule_order",
    "simulate",
    "stage_ranks",
    "steady_threshold",
]

SCHEDULES = ("1f1b", "gpipe", "interleaved", "interleaved-zb", "zbv")
# The torch.distributed.pipelining class that runs each schedule.
TORCH_SCHEDULES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}
_CODES = {"1f1b": ONE_F_ONE_B, "gpipe": GPIPE, "interleaved": INTERLEAVED, "interleaved-zb": INTERLEAVED_ZB, "zbv": ZBV}
ZERO_BUBBLE = ("interleaved-zb", "zbv")
_KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class ScheduleResult:
    """One simulated step.

    ``step_ms``; ``bubble``: idle fraction of rank-time; per rank: ``busy_ms`` (compute and sends),
    ``peak_bytes`` (static bytes plus the most activation bytes alive at once); per virtual stage: ``held``
    (most micro-batches alive at once); ``ops``: with ``timeline=True``, every operation as
    ``(virtual stage, "F" | "B" | "W", micro-batch, start_ms, end_ms)``, else empty.
    """

    step_ms: float
    bubble: float
    busy_ms: tuple[float, ...]
    held: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    ops: tuple[tuple[int, str, int, float, float], ...]


# The most micro-batches of one step that the pipeline functions take: far above any step a training run takes,
# and low enough that a step's time keeps its precision in float64 and any per-micro-batch input still fits.
MAX_MICRO_BATCHES = 10**9
# Periods of the steady state tried, in units of the schedule's round (module docstring), and the samples of
# the step taken from one window of counts: three times the longest period, so that every period tried is seen
# repeating at least twice after the first third of the window.
_MAX_PERIOD = 8
_WINDOW = 3 * _MAX_PERIOD
# Operations the compiled simulation runs between two returns to Python (where Ctrl-C is seen): a few hundredths of
# a second of work, a cost per chunk that no run notices.
_CHUNK_OPS = 1 << 20


def check_micro_batches(micro_batches: object, name: str = "micro_batches") -> int:
    """``micro_batches`` as an int in ``[1, MAX_MICRO_BATCHES]``."""
    return check_positive_int(name, micro_batches, 1, MAX_MICRO_BATCHES)


def representative_micro_batches(schedule: str, ranks: int, micro_batches: int, virtual_stages: int) -> int:
    """A count of micro-batches, at most ``micro_batches``, whose per-rank orders have the same warm-up, the
    same cool-down and the same steady state as those of ``micro_batches``: ``micro_batches`` itself when it
    is short, else a whole number of rounds past every rank's warm-up (:func:`steady_threshold` over 16)."""
    base = steady_threshold(schedule, ranks, virtual_stages) // 16
    return micro_batches if micro_batches < base else base


def _unit(schedule: str, ranks: int) -> int:
    """Micro-batches of one round: the interleaved orders repeat per round of ``ranks`` micro-batches once the
    step holds at least ``2 * ranks**2`` of them (then every round holds ``ranks``); the others per micro-batch."""
    return ranks if schedule in ("interleaved", "interleaved-zb") else 1


def steady_threshold(schedule: str, ranks: int, virtual_stages: int) -> int:
    """The count from which :func:`simulate` extrapolates a step of constant times from its steady state:
    the smallest count of whole rounds past the warm-up and cool-down of every rank (and past ``2 P**2`` for
    the interleaved orders, whose rounds then hold ``P`` micro-batches), times 16 so that the steady state is
    measured on two windows far apart before it is trusted."""
    u = _unit(schedule, ranks)
    base = 8 * ranks * virtual_stages + 16
    if u > 1:
        base = max(base, 2 * ranks * ranks)
    return 16 * u * (-(-base // u))


@dataclass(frozen=True)
class _Run:
    step: float
    busy: np.ndarray
    peak: np.ndarray
    held: np.ndarray
    tl: np.ndarray
    n_ops: int


@dataclass(frozen=True)
class _Case:
    """One schedule, pipeline and set of durations (sends included), simulated for any count of micro-batches."""

    code: int
    schedule: str
    P: int
    v: int
    ranks: np.ndarray
    d_f: np.ndarray
    d_b: np.ndarray
    d_w: np.ndarray
    act: np.ndarray

    def run(self, m: int, timeline: bool = False) -> _Run:
        P, v, S = self.P, self.v, self.P * self.v
        per_round = _round(self.schedule, P, m)
        busy, peak, held = np.zeros(P), np.zeros(P), np.zeros(S, np.int64)
        zero_bubble = self.schedule in ZERO_BUBBLE
        ops_total = (3 if zero_bubble else 2) * m * v * P
        tl = np.zeros((ops_total if timeline else 1, 6))
        warm = _warmup(self.schedule, P, v, m, per_round)
        ring = min(m, 2 * S + 8)
        while True:
            rec_t, rec_mb, done, alive_bytes, free, st, pend, awake, stack, counters, step = new_state(P, S, ring)
            status = PAUSED
            while status == PAUSED:  # Python runs between chunks, so Ctrl-C stops a long run
                status = simulate_into(
                    self.code,
                    P,
                    v,
                    m,
                    per_round,
                    warm,
                    self.ranks,
                    self.d_f,
                    self.d_b,
                    self.d_w,
                    self.act,
                    zero_bubble,
                    bool(timeline),
                    tl,
                    busy,
                    peak,
                    held,
                    rec_t,
                    rec_mb,
                    done,
                    alive_bytes,
                    free,
                    st,
                    pend,
                    awake,
                    stack,
                    counters,
                    step,
                    _CHUNK_OPS,
                )
            if status == OK:
                return _Run(float(step[0]), busy, peak, held, tl, int(counters[2]))
            if status == DEADLOCK and ring < m:
                ring = min(m, 2 * ring)
                busy[:], peak[:], held[:] = 0.0, 0.0, 0
                continue
            raise RuntimeError(f"schedule {self.schedule!r}: the operation order is inconsistent (status {status})")


def _measures(run: _Run) -> np.ndarray:
    """What a run says that grows with the micro-batches: the step, then held per stage, then peak per rank."""
    return np.concatenate([[run.step], run.held.astype(np.float64), run.peak])


def _same(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> bool:
    # sums of the same durations in another order: equal up to their rounding
    return bool(np.all(np.abs(a - b) <= 1e-10 * np.maximum(np.abs(scale), 1e-300)))


def _period(window: list[np.ndarray]) -> Optional[tuple[int, np.ndarray]]:
    """The shortest period ``c`` (in samples) over which every measure of a window grows by one constant
    ``delta`` in the window's last two thirds, or None."""
    scale = window[-1]
    for c in range(1, _MAX_PERIOD + 1):
        deltas = [window[t + c] - window[t] for t in range(len(window) // 3, len(window) - c)]
        if all(_same(d, deltas[-1], scale) for d in deltas):
            return c, deltas[-1]
    return None


def _extrapolate(window: list[np.ndarray], c: int, delta: np.ndarray, t: int) -> np.ndarray:
    """The measures at sample ``t`` of a window that grow by ``delta`` every ``c`` samples from its end."""
    last = len(window) - 1
    if t <= last:
        return window[t]
    t0 = last - ((last - t) % c)  # the window's last sample of t's residue
    return window[t0] + ((t - t0) // c) * delta


def _steady(case: _Case, m: int) -> _Run:
    """The run of ``m`` micro-batches of constant times, from runs of bounded counts. In its steady state a
    schedule's step grows by the same time every period, and its held micro-batches and bytes alive (which
    follow the order alone) by the same amounts (nothing past the warm-up, or every micro-batch under GPipe):
    the period is measured on a window of counts, checked on a second window four times further, and
    extrapolated to ``m``. The full run when no period is found below ``m / 16``."""
    u = _unit(case.schedule, case.P)
    base = steady_threshold(case.schedule, case.P, case.v) // 16
    while 16 * base <= m:
        window = [_measures(case.run(base + t * u)) for t in range(_WINDOW + 1)]
        found = _period(window)
        far = 4 * base
        if found is not None:
            c, delta = found
            check = [_measures(case.run(far + t * u)) for t in range(c + 1)]
            predicted = _extrapolate(window, c, delta, (far - base) // u)
            if _same(predicted, check[0], check[0]) and _same(check[c] - check[0], delta, check[c]):
                x = _extrapolate(check, c, delta, (m - far) // u)
                S = case.P * case.v
                busy = m * np.bincount(case.ranks, weights=(case.d_f + case.d_b + case.d_w)[0], minlength=case.P)
                held = np.rint(x[1 : 1 + S]).astype(np.int64)
                return _Run(float(x[0]), busy, x[1 + S :], held, np.zeros((1, 6)), 0)
        base = far
    return case.run(m)


def check_schedule(schedule: object, virtual_stages: int) -> str:
    """``schedule`` is one of :data:`SCHEDULES` and takes ``virtual_stages`` chunks per rank."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    v = check_positive_int("virtual_stages", virtual_stages)
    if schedule in ("1f1b", "gpipe") and v != 1:
        raise ValueError(
            f"virtual_stages: schedule {schedule!r} runs one chunk per rank, got {v} (use "
            "'interleaved' or 'interleaved-zb' for more)"
        )
    if schedule == "zbv" and v != 2:
        raise ValueError(f"virtual_stages: schedule 'zbv' runs exactly 2 chunks per rank, got {v}")
    return str(schedule)


def _round(schedule: str, ranks: int, m: int) -> int:
    """Micro-batches per round of the interleaved orders; torch requires ``m`` to be a multiple of the rounds."""
    if schedule not in ("interleaved", "interleaved-zb"):
        return 1
    rounds = max(1, m // ranks)
    if m % rounds:
        raise ValueError(
            f"micro_batches: {schedule!r} with {ranks} ranks needs a multiple of {rounds} "
            f"(max(1, micro_batches // ranks) rounds), got {m}"
        )
    return m // rounds


def _warmup(schedule: str, ranks: int, v: int, m: int, per_round: int) -> np.ndarray:
    r = np.arange(ranks)
    if schedule == "gpipe":
        return np.full(ranks, m, np.int64)
    if schedule == "1f1b":
        return np.minimum(ranks - r - 1, m).astype(np.int64)
    hops = 2 if schedule == "interleaved" else 1
    return np.minimum((v - 1) * per_round + hops * (ranks - 1 - r), m * v).astype(np.int64)


def stage_ranks(schedule: str, ranks: int, virtual_stages: int = 1) -> tuple[int, ...]:
    """The rank of every virtual stage: round-robin (``j mod P``), or the V of ``"zbv"``."""
    check_schedule(schedule, virtual_stages)
    P = check_positive_int("ranks", ranks)
    if schedule == "zbv":
        return tuple(j if j < P else 2 * P - 1 - j for j in range(2 * P))
    return tuple(j % P for j in range(P * virtual_stages))


def schedule_order(
    schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1
) -> list[list[tuple[str, int, int]]]:
    """The order of every rank: ``[[(kind, virtual stage, micro-batch), ...] per rank]``, kind ``"F"``,
    ``"B"`` or ``"W"``. Memory grows with ``micro_batches``; :func:`simulate` never builds it."""
    check_schedule(schedule, virtual_stages)
    P = check_positive_int("ranks", ranks)
    m = check_micro_batches(micro_batches)
    per_round = _round(schedule, P, m)
    warm = _warmup(schedule, P, virtual_stages, m, per_round)
    out = []
    n = 3 * m * virtual_stages
    for r in range(P):
        kinds, stages, mbs = (np.zeros(n, np.int64) for _ in range(3))
        length = order_into(_CODES[schedule], r, P, virtual_stages, m, per_round, int(warm[r]), kinds, stages, mbs)
        out.append([(_KINDS[k], int(j), int(i)) for k, j, i in zip(kinds[:length], stages[:length], mbs[:length])])
    return out


def _times(name: str, value: object, m: int, width: int, default: float = 0.0) -> np.ndarray:
    """``value`` as a C-contiguous float64 (1, width) or (m, width) array, finite and >= 0."""
    if value is None:
        return np.full((1, width), default)
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 1 and arr.shape == (width,):
        arr = arr[None, :]
    elif arr.ndim != 2 or arr.shape != (m, width):
        raise ValueError(
            f"{name} must have shape ({width},) or (micro_batches, {width}) = ({m}, {width}), got {arr.shape}"
        )
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"{name} must be finite and >= 0")
    return np.ascontiguousarray(arr)


def simulate(
    forward_ms: Sequence[float] | np.ndarray,
    backward_ms: Sequence[float] | np.ndarray,
    micro_batches: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    comm_ms: Optional[Sequence[float] | np.ndarray] = None,
    activation_bytes: Optional[Sequence[float] | np.ndarray] = None,
    static_bytes: Optional[Sequence[float] | np.ndarray] = None,
    weight_ms: Optional[Sequence[float] | np.ndarray] = None,
    timeline: bool = False,
) -> ScheduleResult:
    """Simulates one training step of a pipeline of ``P = S / virtual_stages`` ranks.

    Args:
        forward_ms, backward_ms: (S,) time of one micro-batch on each virtual stage, in chain order, or
            (micro_batches, S) one time per micro-batch and stage (the backward includes recomputation).
        micro_batches: m, micro-batches per step, at most :data:`MAX_MICRO_BATCHES`.
        schedule: one of :data:`SCHEDULES` (module docstring).
        virtual_stages: v, chunks per rank (1 for ``"1f1b"`` and ``"gpipe"``, 2 for ``"zbv"``).
        comm_ms: (S - 1,) or (m, S - 1): send time between virtual stages j and j + 1, each way (activations
            forward, their gradient back); it occupies the sender, and is free between stages of one rank.
        activation_bytes: (S,) or (m, S) bytes a micro-batch keeps on each stage; static_bytes: (S,) bytes
            each stage always holds (summed per rank).
        weight_ms: (S,) or (m, S), under zero bubble the part of ``backward_ms`` that is the weight gradient
            (``W``, default half of it); the rest (recomputation included) is the input gradient that the
            previous stage waits for. Other schedules run the backward whole.
        timeline: also return every operation (memory grows with m).
    """
    check_schedule(schedule, virtual_stages)
    m = check_micro_batches(micro_batches)
    v = int(virtual_stages)
    fwd_arr = np.asarray(forward_ms, dtype=np.float64)
    if fwd_arr.ndim not in (1, 2) or fwd_arr.shape[-1] == 0:
        raise ValueError(f"forward_ms must be (S,) or (micro_batches, S) with S >= 1, got shape {fwd_arr.shape}")
    S = fwd_arr.shape[-1]
    if S % v:
        raise ValueError(f"forward_ms: {S} virtual stages are not {v} chunks per rank")
    P = S // v
    fwd = _times("forward_ms", forward_ms, m, S)
    bwd = _times("backward_ms", backward_ms, m, S)
    comm = _times("comm_ms", comm_ms, m, S - 1)
    act = _times("activation_bytes", activation_bytes, m, S)
    static = _times("static_bytes", static_bytes, 1, S)[0]
    if schedule in ZERO_BUBBLE:
        d_w = bwd / 2 if weight_ms is None else _times("weight_ms", weight_ms, m, S)
        if (d_w > bwd * (1 + 1e-12)).any():
            raise ValueError("weight_ms must not exceed backward_ms")
    else:
        d_w = np.zeros_like(bwd)
    d_w = np.minimum(d_w, bwd)
    _round(schedule, P, m)  # refuses a count the interleaved orders cannot split into rounds
    ranks = np.asarray(stage_ranks(schedule, P, v), dtype=np.int64)
    cross = (ranks[:-1] != ranks[1:]).astype(np.float64)
    d_f = fwd + np.concatenate([comm * cross, np.zeros((comm.shape[0], 1))], axis=1)
    d_b = bwd - d_w + np.concatenate([np.zeros((comm.shape[0], 1)), comm * cross], axis=1)
    # one row for all micro-batches, or one row each: the kernel reads the three alike
    d_f, d_b, d_w = (np.ascontiguousarray(x) for x in np.broadcast_arrays(d_f, d_b, d_w))
    case = _Case(_CODES[schedule], schedule, P, v, ranks, d_f, d_b, d_w, act)
    if timeline or d_f.shape[0] > 1 or act.shape[0] > 1 or m < steady_threshold(schedule, P, v):
        run = case.run(m, timeline)
    else:
        run = _steady(case, m)
    step, busy, peak, held, tl, n_ops = run.step, run.busy, run.peak, run.held, run.tl, run.n_ops
    bubble = 0.0 if step == 0 else 1.0 - float(busy.sum()) / (P * step)
    rank_static = np.bincount(ranks, weights=static, minlength=P)
    ops: tuple[tuple[int, str, int, float, float], ...] = ()
    if timeline:
        ops = tuple((int(j), _KINDS[int(k)], int(i), float(a), float(b)) for _, k, j, i, a, b in tl[:n_ops])
    return ScheduleResult(
        float(step),
        float(bubble),
        tuple(float(b) for b in busy),
        tuple(int(h) for h in held),
        tuple(int(round(s + p)) for s, p in zip(rank_static, peak)),
        ops,
    )


@lru_cache(maxsize=256)
def _held(schedule: str, ranks: int, m: int, v: int) -> tuple[int, ...]:
    return simulate(np.zeros(ranks * v), np.zeros(ranks * v), m, schedule=schedule, virtual_stages=v).held


def held_micro_batches(schedule: str, ranks: int, micro_batches: int, stage: int, *, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations virtual stage ``stage`` holds at its peak under ``schedule`` (it depends
    on the order alone, not on the times)."""
    check_schedule(schedule, virtual_stages)
    P = check_positive_int("ranks", ranks)
    m = check_micro_batches(micro_batches)
    s = check_positive_int("stage", stage, 0, P * virtual_stages - 1)
    return _held(schedule, P, m, int(virtual_stages))[s]
