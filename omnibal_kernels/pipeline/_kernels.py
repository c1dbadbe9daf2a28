"""The compiled core of the schedule simulator: per-rank operation orders and the step they run in.

Every schedule is a fixed order of operations per rank; each operation is ``(kind, virtual stage, micro-batch)``
with kind ``F`` (forward), ``B`` (backward; the input-gradient half in the zero-bubble schedules) or ``W`` (the
weight-gradient half). The orders are generated one operation at a time by a small state machine per rank, so
no order is ever stored: memory does not grow with the number of micro-batches.

An operation starts when its rank is free and its input is there: ``F(j, i)`` after ``F(j - 1, i)``,
``B(j, i)`` after ``B(j + 1, i)`` (the last virtual stage after its own ``F``), ``W(j, i)`` after ``B(j, i)``.
Each finished operation whose result another rank waits for leaves a record (its end time) in a ring buffer of
its virtual stage; a record is dropped once read. Ranks are advanced in turns, each as far as its inputs allow;
the times are those of the longest path through the dependency graph whatever the turn order, so the order of
turns only bounds how many records are alive. A producer whose ring slot is still unread waits; if no rank can
advance the caller retries with a larger ring (a full ring of ``micro_batches`` slots never blocks, so a
deadlock there is a bug in an order). A run keeps its state in arrays the caller holds and returns every
chunk of operations, so that a long one can be interrupted.
"""

from __future__ import annotations

import numba
import numpy as np

GPIPE, ONE_F_ONE_B, INTERLEAVED, INTERLEAVED_ZB, ZBV = 0, 1, 2, 3, 4
KIND_F, KIND_B, KIND_W = 0, 1, 2
STATE = 10  # ints of state per rank

OK, DEADLOCK, BAD_ORDER, PAUSED = 0, 1, 2, 3


@numba.njit(cache=True, nogil=True, inline="always")
def _family_stage(k: int, ranks: int, chunks: int, per_round: int, rank: int, backward: bool) -> tuple[int, int]:
    """The virtual stage and micro-batch of the k-th forward (or backward) of ``rank`` in a 1F1B-like order:
    micro-batches go in rounds of ``per_round``, one round per chunk in turn (backwards from the last chunk)."""
    if chunks == 1:
        return rank, k
    chunk = (k // per_round) % chunks
    if backward:
        chunk = chunks - 1 - chunk
    mb = (k // (per_round * chunks)) * per_round + k % per_round
    return chunk * ranks + rank, mb


@numba.njit(cache=True, nogil=True, inline="always")
def _next_family(
    st: np.ndarray, rank: int, ranks: int, chunks: int, m: int, per_round: int, warm: int, zero_bubble: bool
) -> tuple[int, int, int]:
    """Next operation of a GPipe / 1F1B / interleaved (zero-bubble) order: ``warm`` forwards, then a forward and
    a backward in turn, then the remaining backwards; zero bubble adds, from the ``rank``-th backward on, the
    weight gradient of the oldest backward still without one, and the rest at the end. ``(-1, 0, 0)`` at the end.
    State: ``[phase, i, sub, weights emitted]``."""
    nf = m * chunks
    while True:
        phase, i, sub = st[rank, 0], st[rank, 1], st[rank, 2]
        if phase == 0:
            if i < warm:
                st[rank, 1] = i + 1
                j, mb = _family_stage(i, ranks, chunks, per_round, rank, False)
                return KIND_F, j, mb
            st[rank, 0], st[rank, 1], st[rank, 2] = 1, 0, 0
        elif phase == 1 or phase == 2:
            steady = phase == 1
            if (steady and i >= nf - warm) or (not steady and i >= nf):
                if steady:
                    st[rank, 0], st[rank, 1], st[rank, 2] = 2, nf - warm, 0
                else:
                    st[rank, 0] = 3
                continue
            if steady and sub == 0:
                st[rank, 2] = 1
                j, mb = _family_stage(warm + i, ranks, chunks, per_round, rank, False)
                return KIND_F, j, mb
            if (steady and sub == 1) or (not steady and sub == 0):
                st[rank, 2] = sub + 1
                j, mb = _family_stage(i, ranks, chunks, per_round, rank, True)
                return KIND_B, j, mb
            st[rank, 1], st[rank, 2] = i + 1, 0
            if zero_bubble and i >= rank:
                k = st[rank, 3]
                st[rank, 3] = k + 1
                j, mb = _family_stage(k, ranks, chunks, per_round, rank, True)
                return KIND_W, j, mb
        elif phase == 3:
            if zero_bubble and st[rank, 3] < nf:
                k = st[rank, 3]
                st[rank, 3] = k + 1
                j, mb = _family_stage(k, ranks, chunks, per_round, rank, True)
                return KIND_W, j, mb
            st[rank, 0] = 4
        else:
            return -1, 0, 0


@numba.njit(cache=True, nogil=True)
def _zbv_group(phase: int, sub: int, st: np.ndarray, rank: int, n_micro: int) -> tuple[int, int]:
    """``(kind * 2 + chunk, size of the group)`` of position ``sub`` of a group of ZBV phase ``phase``;
    kind -1 skips the position. ``st[3:9]`` are the counters f0, f1, b0, b1, w0, w1."""
    if phase == 0:
        return KIND_F * 2, 1
    if phase == 1:
        return (KIND_F * 2 + 1, 2) if sub == 0 else (KIND_F * 2, 2)
    if phase == 2:
        return (KIND_F * 2 + 1, 3) if sub == 0 else ((KIND_B * 2 + 1, 3) if sub == 1 else (KIND_W * 2 + 1, 3))
    if phase == 3:
        if sub == 0:
            return (KIND_F * 2, 6) if st[rank, 3] < n_micro else (-1, 6)
        codes = (0, KIND_B * 2, KIND_W * 2, KIND_F * 2 + 1, KIND_B * 2 + 1, KIND_W * 2 + 1)
        return codes[sub], 6
    if phase == 4:
        return (KIND_B * 2, 2) if sub == 0 else (KIND_B * 2 + 1, 2)
    if phase == 5:
        return (KIND_B * 2, 2) if sub == 0 else (KIND_W * 2, 2)
    return (KIND_W * 2 + 1, 1) if phase == 6 else (KIND_W * 2, 1)


@numba.njit(cache=True, nogil=True)
def _next_zbv(st: np.ndarray, rank: int, ranks: int, m: int) -> tuple[int, int, int]:
    """Next operation of the ZBV zero-bubble order (two chunks per rank in a V: rank r holds virtual stages r and
    2P - 1 - r). Phases: 2(P - r) - 1 forwards of chunk 0; r pairs (F1, F0); P - r triples (F1, B1, W1); the
    steady groups (F0 while any is left, B0, W0, F1, B1, W1) until both chunks have every forward; r pairs
    (B0, B1); P - r pairs (B0, W0); the remaining W1, then W0. The order runs over at least 2P - 1 micro-batches
    and skips operations past ``m``. State: ``[phase, count in phase, sub, f0, f1, b0, b1, w0, w1]``."""
    n_micro = max(2 * ranks - 1, m)
    counts = (2 * (ranks - rank) - 1, rank, ranks - rank, -1, rank, ranks - rank, -1, -1)
    while True:
        phase = st[rank, 0]
        if phase > 7:
            return -1, 0, 0
        if phase == 3 and st[rank, 2] == 0 and not (st[rank, 4] < st[rank, 3] or st[rank, 3] < n_micro):
            st[rank, 0], st[rank, 1], st[rank, 2] = 4, 0, 0
            st[rank, 7], st[rank, 8] = st[rank, 5], st[rank, 6]
            continue
        if phase == 6 and st[rank, 8] >= st[rank, 6] or phase == 7 and st[rank, 7] >= st[rank, 5]:
            st[rank, 0], st[rank, 1], st[rank, 2] = phase + 1, 0, 0
            continue
        if counts[phase] >= 0 and st[rank, 1] >= counts[phase]:
            st[rank, 0], st[rank, 1], st[rank, 2] = phase + 1, 0, 0
            continue
        code, size = _zbv_group(phase, st[rank, 2], st, rank, n_micro)
        st[rank, 2] += 1
        if st[rank, 2] == size:
            st[rank, 1], st[rank, 2] = st[rank, 1] + 1, 0
        if code < 0:
            continue
        kind, chunk = code // 2, code % 2
        if kind == KIND_F:
            slot = 3 + chunk
        elif kind == KIND_B:
            slot = 5 + chunk
        else:
            slot = 7 + chunk if phase >= 4 else 5 + chunk
        mb = st[rank, slot]
        # Before the cool-down a W follows its B at once and shares its counter, which the W advances.
        if not (kind == KIND_B and phase < 4):
            st[rank, slot] = mb + 1
        if mb >= m:
            continue
        return kind, (rank if chunk == 0 else 2 * ranks - 1 - rank), mb


@numba.njit(cache=True, nogil=True)
def next_op(
    code: int, st: np.ndarray, rank: int, ranks: int, chunks: int, m: int, per_round: int, warm: int
) -> tuple[int, int, int]:
    """Next ``(kind, virtual stage, micro-batch)`` of ``rank`` under schedule ``code``; kind -1 at the end."""
    if code == ZBV:
        return _next_zbv(st, rank, ranks, m)
    return _next_family(st, rank, ranks, chunks, m, per_round, warm, code == INTERLEAVED_ZB)


@numba.njit(cache=True, nogil=True)
def order_into(
    code: int,
    rank: int,
    ranks: int,
    chunks: int,
    m: int,
    per_round: int,
    warm: int,
    kinds: np.ndarray,
    stages: np.ndarray,
    mbs: np.ndarray,
) -> int:
    """Writes the order of ``rank`` into the three arrays (large enough); returns its length."""
    st = np.zeros((rank + 1, STATE), np.int64)
    n = 0
    while True:
        kind, j, mb = next_op(code, st, rank, ranks, chunks, m, per_round, warm)
        if kind < 0:
            return n
        kinds[n], stages[n], mbs[n] = kind, j, mb
        n += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _wake(q: int, awake: np.ndarray, stack: np.ndarray, top: int) -> int:
    """Puts rank q on the stack of ranks to run unless it is there; returns the new top."""
    if not awake[q]:
        awake[q] = True
        stack[top] = q
        top += 1
    return top


@numba.njit(cache=True, nogil=True, inline="always")
def _account(
    kind: int,
    j: int,
    r: int,
    nbytes: float,
    release_at_w: bool,
    f_done: np.ndarray,
    b_done: np.ndarray,
    alive: np.ndarray,
    alive_bytes: np.ndarray,
    held: np.ndarray,
    peak: np.ndarray,
) -> None:
    """Counts a finished operation: forwards and backwards done, micro-batches and bytes alive, their peaks."""
    if kind == KIND_F:
        f_done[j] += 1
        alive[j] += 1
        held[j] = max(held[j], alive[j])
        alive_bytes[r] += nbytes
        peak[r] = max(peak[r], alive_bytes[r])
        return
    if kind == KIND_B:
        b_done[j] += 1
    if (kind == KIND_W) == release_at_w:
        alive[j] -= 1
        alive_bytes[r] -= nbytes


@numba.njit(cache=True, nogil=True, inline="always")
def _links(kind: int, j: int, last: int) -> tuple[int, int]:
    """The virtual stages whose records operation ``(kind, j)`` reads and writes (-1: none). F reads stage
    ``j - 1``'s forward record and leaves one for stage ``j + 1``; B reads stage ``j + 1``'s backward record and
    leaves one for stage ``j - 1``; W, and the ends of the chain, neither. Scalars only: array arguments of an
    inlined function would be reference-counted on every operation."""
    if kind == KIND_F:
        return (j - 1 if j > 0 else -1), (j if j < last else -1)
    if kind == KIND_B:
        return (j + 1 if j < last else -1), (j if j > 0 else -1)
    return -1, -1


def new_state(ranks: int, stages: int, ring: int) -> tuple[np.ndarray, ...]:
    """The state of a run that :func:`simulate_into` advances chunk by chunk: ``(rec_t, rec_mb, done, alive_bytes,
    free, st, pend, awake, stack, counters, step)``; ``done`` (3, S) forwards done, backwards done and
    micro-batches alive per stage; ``counters`` the stack's top, the ranks left and the operations run."""
    return (
        np.zeros((2, stages, ring)),
        np.full((2, stages, ring), -1, np.int64),
        np.zeros((3, stages), np.int64),
        np.zeros(ranks),
        np.zeros(ranks),
        np.zeros((ranks, STATE), np.int64),
        np.full((ranks, 3), -2, np.int64),
        np.ones(ranks, np.bool_),
        np.arange(ranks)[::-1].copy(),
        np.array([ranks, ranks, 0], np.int64),
        np.zeros(1),
    )


@numba.njit(cache=True, nogil=True)
def simulate_into(
    code: int,
    ranks: int,
    chunks: int,
    m: int,
    per_round: int,
    warm: np.ndarray,
    stage_rank: np.ndarray,
    d_f: np.ndarray,
    d_b: np.ndarray,
    d_w: np.ndarray,
    act: np.ndarray,
    release_at_w: bool,
    record: bool,
    tl: np.ndarray,
    busy: np.ndarray,
    peak: np.ndarray,
    held: np.ndarray,
    rec_t: np.ndarray,
    rec_mb: np.ndarray,
    done: np.ndarray,
    alive_bytes: np.ndarray,
    free: np.ndarray,
    st: np.ndarray,
    pend: np.ndarray,
    awake: np.ndarray,
    stack: np.ndarray,
    counters: np.ndarray,
    step_out: np.ndarray,
    budget: int,
) -> int:
    """Advances a run (its state from :func:`new_state`, outputs zeroed) by about ``budget`` operations; returns
    ``PAUSED`` (call again), ``OK`` (the step is ``step_out[0]``, the operations ``counters[2]``), ``DEADLOCK`` or
    ``BAD_ORDER``. Runs stop between chunks so that the caller can be interrupted.

    d_f, d_b, d_w: (M, S) durations of F, B, W per micro-batch (M = m) or for all (M = 1), sends included;
    act: (M', S) bytes a micro-batch keeps on its stage, alive from the end of its F to the end of its B
    (of its W when ``release_at_w``). Outputs: busy (P,) and peak (P,) per rank (peak: most bytes alive at
    once), held (S,) most micro-batches alive at once per virtual stage; tl (ops, 6) the timeline rows
    ``(rank, kind, stage, micro-batch, start, end)`` when ``record``. A rank that cannot advance sleeps until
    the rank it waits for writes its record or reads the record in its way.
    """
    S = d_f.shape[1]
    ring = rec_t.shape[2]
    per_mb_t = d_f.shape[0] > 1
    per_mb_a = act.shape[0] > 1
    f_done, b_done, alive = done[0], done[1], done[2]
    top, left, n_ops = counters[0], counters[1], counters[2]
    step = step_out[0]
    stop = n_ops + budget
    while top:
        if n_ops >= stop:
            counters[0], counters[1], counters[2] = top, left, n_ops
            step_out[0] = step
            return PAUSED
        top -= 1
        r = stack[top]
        awake[r] = False
        while pend[r, 0] != -3:
            if pend[r, 0] == -2:
                kind, j, mb = next_op(code, st, r, ranks, chunks, m, per_round, warm[r])
                if kind < 0:
                    pend[r, 0] = -3
                    left -= 1
                    break
                if stage_rank[j] != r:
                    return BAD_ORDER
                pend[r, 0], pend[r, 1], pend[r, 2] = kind, j, mb
            kind, j, mb = pend[r, 0], pend[r, 1], pend[r, 2]
            slot = mb % ring
            row = mb if per_mb_t else 0
            src, out = _links(kind, j, S - 1)
            rk = 0 if kind == KIND_F else 1  # the records of forwards, or of backwards
            if kind == KIND_B:
                if f_done[j] <= mb:
                    break  # a backward waits for its forward
            elif kind == KIND_W and b_done[j] <= mb:
                break  # a weight gradient waits for its backward
            if src >= 0 and rec_mb[rk, src, slot] != mb:
                break  # the input is not there yet
            if out >= 0 and rec_mb[rk, out, slot] != -1:
                break  # the slot of the output is not read yet
            ready = rec_t[rk, src, slot] if src >= 0 else 0.0
            dur = d_f[row, j] if kind == KIND_F else (d_b[row, j] if kind == KIND_B else d_w[row, j])
            start = max(free[r], ready)
            end = start + dur
            free[r] = end
            busy[r] += dur
            step = max(step, end)
            if src >= 0:
                rec_mb[rk, src, slot] = -1
                top = _wake(stage_rank[src], awake, stack, top)
            if out >= 0:
                rec_t[rk, out, slot] = end
                rec_mb[rk, out, slot] = mb
                top = _wake(stage_rank[out + 1 if kind == KIND_F else out - 1], awake, stack, top)
            _account(
                kind, j, r, act[mb if per_mb_a else 0, j], release_at_w, f_done, b_done, alive, alive_bytes, held, peak
            )
            if record:
                tl[n_ops, 0], tl[n_ops, 1], tl[n_ops, 2], tl[n_ops, 3] = r, kind, j, mb
                tl[n_ops, 4], tl[n_ops, 5] = start, end
            n_ops += 1
            pend[r, 0] = -2
    counters[0], counters[1], counters[2] = top, left, n_ops
    step_out[0] = step
    if left:
        return DEADLOCK
    return OK
