"""From a layout to every rank's rows: the tokens it holds, its query segments, and the K/V rows it exchanges.

Rows are numbered in the *padded* packed order: segment ``s`` occupies ``cu_padded[s]:cu_padded[s + 1]``
(``cu_padded`` is the cumulative sum of ``Layout.padded``; without padding it is the batch's ``cu_seqlens``).
A rank holds its chunks in ``(seq, start)`` order, so its local rows increase with the padded packed row.

Keys: a chunk ``start:stop`` of sequence ``s`` is one query segment, whose keys are rows ``0:stop`` of ``s``
(causal, bottom-right aligned: query ``i`` of the chunk sees keys up to ``start + i``). Keys held by other
ranks arrive in one all-to-all: rank ``q`` sends rank ``r`` the rows of ``q`` that ``r`` needs, in ``q``'s
local order, and ``r`` receives them grouped by sender in rank order. ``key_index`` then picks each segment's
keys out of ``cat(own K/V, received K/V)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import Layout

__all__ = ["RankPlan", "ranges", "rank_plans"]


@dataclass(frozen=True)
class RankPlan:
    """One rank's rows (all int64 numpy arrays).

    Attributes:
        rows: ``(n,)`` padded packed row of every held token, in local order.
        seq, pos: ``(n,)`` segment of each held token and its position in the (padded) segment.
        cu_q: ``(c + 1,)`` local query segments (one per chunk).
        keys: ``(c,)`` keys of each query segment (the chunk's ``stop``).
        key_index: ``(keys.sum(),)`` row of each segment's keys in ``cat(own, received)``.
        send_index: local rows sent, grouped by destination rank; ``send_counts[q]`` go to rank ``q``.
        recv_counts: ``(P,)`` rows received from each rank.
    """

    rows: np.ndarray
    seq: np.ndarray
    pos: np.ndarray
    cu_q: np.ndarray
    keys: np.ndarray
    key_index: np.ndarray
    send_index: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray


def ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """``concat(arange(a, b) for a, b in zip(starts, stops))`` in one pass (int64)."""
    lengths = stops - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total, dtype=np.int64)


def _needed(seq: np.ndarray, stop: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """Rows a rank's chunks attend to: per sequence, rows ``0:reach`` with ``reach`` its last chunk's stop."""
    last = np.r_[seq[1:] != seq[:-1], True] if seq.size else np.zeros(0, bool)
    return ranges(cu[seq[last]], cu[seq[last]] + stop[last])


def rank_plans(layout: Layout) -> list[RankPlan]:
    """The rows, query segments and K/V exchange of every rank of ``layout``."""
    size = layout.context_parallel_size
    cu = np.r_[0, np.cumsum(layout.padded)].astype(np.int64)
    total = int(cu[-1])
    bounds = np.searchsorted(layout.rank, np.arange(size + 1))
    owner = np.full(total, -1, np.int64)
    local = np.zeros(total, np.int64)
    held = []
    for r in range(size):
        c = slice(bounds[r], bounds[r + 1])
        rows = ranges(cu[layout.seq[c]] + layout.start[c], cu[layout.seq[c]] + layout.stop[c])
        owner[rows] = r
        local[rows] = np.arange(rows.size)
        held.append((c, rows))
    # received[r]: rows r gets, grouped by sender in rank order (each group in the sender's local order)
    received = []
    for r, (c, _) in enumerate(held):
        need = _needed(layout.seq[c], layout.stop[c], cu)
        remote = need[owner[need] != r]
        received.append(remote[np.argsort(owner[remote], kind="stable")])
    recv_pos = np.full(total, -1, np.int64)
    plans = []
    for r, (c, rows) in enumerate(held):
        got = received[r]
        recv_counts = np.bincount(owner[got], minlength=size).astype(np.int64)
        sends = [local[received[q][owner[received[q]] == r]] for q in range(size)]
        recv_pos[got] = np.arange(got.size)
        seq, start, stop = layout.seq[c], layout.start[c], layout.stop[c]
        keys = ranges(cu[seq], cu[seq] + stop)
        key_index = np.where(owner[keys] == r, local[keys], rows.size + recv_pos[keys])
        recv_pos[got] = -1
        lengths = stop - start
        plans.append(
            RankPlan(
                rows=rows,
                seq=np.repeat(seq, lengths),
                pos=ranges(start, stop),
                cu_q=np.r_[0, np.cumsum(lengths)].astype(np.int64),
                keys=stop.copy(),
                key_index=key_index,
                send_index=np.concatenate(sends) if sends else np.zeros(0, np.int64),
                send_counts=np.array([s.size for s in sends], np.int64),
                recv_counts=recv_counts,
            )
        )
    return plans
