"""Where every token of a packed batch goes in a context-parallel (CP) group: chunks of sequences on ranks.

A :class:`Layout` lists chunks ``(seq, start, stop, rank)``: rank ``rank`` holds positions ``start:stop`` of
segment ``seq`` of the batch. Every strategy is a layout; the shards, the attention's K/V exchange and the
predicted times are all computed from it. A chunk's queries attend to the positions ``0:stop`` of their own
sequence (causal), so a rank needs from the other ranks the keys of its sequences below its largest ``stop``.

The fixed strategies built here, for segment lengths ``L`` and ``P`` ranks:

``contiguous``
    the packed tokens cut into ``P`` equal ranges, sequences ignored (no load balancing).
``zigzag``
    Megatron's THD and ring-flash-attention's convention: every sequence in ``2P`` chunks, rank ``r`` holding
    chunks ``r`` and ``2P - 1 - r``. With ``pad_sequences=True`` every sequence is padded at its end to a
    multiple of ``2P`` (what those systems require); by default chunks differ by at most one token, the
    ``L mod 2P`` extra tokens dealt round robin from where the previous sequence stopped, so that over a
    batch every rank gets the same number of extras to within one per chunk.
``per_document``
    torch's per-document head-tail load balancer: the same two chunks per rank with boundaries
    ``floor(c * L / 2P)`` (torch itself asks for multiples of ``2P``).

``hybrid`` (:mod:`.hybrid`) keeps short sequences whole and cuts long ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Layout", "contiguous_layout", "local_layout", "per_document_layout", "tiled_pairs", "zigzag_layout"]


@dataclass(frozen=True)
class Layout:
    """Chunks of a batch's sequences on the ranks of a CP group, sorted by ``(rank, seq, start)``.

    Attributes:
        strategy: the strategy that made it.
        context_parallel_size: ranks in the group, ``P``.
        seqlens: ``(S,)`` int64 length of every segment of the batch (zero-length ones included).
        padded: ``(S,)`` int64 length with the padding the layout adds (``seqlens`` when it adds none).
        seq, start, stop, rank: ``(C,)`` int64 per chunk; ``start < stop <= padded[seq]``; adjacent chunks
            of one sequence on one rank are merged, so no two chunks of a rank touch.
    """

    strategy: str
    context_parallel_size: int
    seqlens: np.ndarray
    padded: np.ndarray
    seq: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    rank: np.ndarray

    @property
    def padding(self) -> int:
        """Tokens the layout adds to the batch."""
        return int((self.padded - self.seqlens).sum())

    def rank_tokens(self) -> np.ndarray:
        """``(P,)`` tokens each rank holds, padding included."""
        return np.bincount(self.rank, weights=self.stop - self.start, minlength=self.context_parallel_size).astype(
            np.int64
        )

    def kv_received(self) -> np.ndarray:
        """``(P,)`` K/V rows each rank needs from the others: per sequence, the positions below its largest
        ``stop`` that it does not hold."""
        if self.seq.size == 0:
            return np.zeros(self.context_parallel_size, np.int64)
        key = self.rank * max(1, self.seqlens.size) + self.seq
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        held = np.add.reduceat(self.stop - self.start, first)
        reach = np.maximum.reduceat(self.stop, first)
        return np.bincount(self.rank[first], weights=reach - held, minlength=self.context_parallel_size).astype(
            np.int64
        )

    def rank_pairs(self, tile: int) -> np.ndarray:
        """``(P,)`` causal query-key pairs each rank's attention kernel computes, in ``tile`` x ``tile`` tiles
        (``tile=1``: the exact pairs)."""
        pairs = tiled_pairs(self.stop - self.start, self.stop, tile)
        return np.bincount(self.rank, weights=pairs, minlength=self.context_parallel_size)


def tiled_pairs(lq: np.ndarray, lk: np.ndarray, tile: int) -> np.ndarray:
    """Causal query-key pairs that a tiled attention kernel computes for query segments over key segments.

    A segment of ``lq`` queries over ``lk >= lq`` keys, causal with the mask aligned to the bottom-right corner
    (query ``i`` sees keys ``j <= i + lk - lq``, as flash-attention and :func:`~omnibal_kernels.varlen_attention`
    do), computed in blocks of ``tile`` queries by ``tile`` keys: a block counts whole when it holds one visible
    pair. ``tile=1`` gives the exact count ``lq * (lk - lq) + lq * (lq + 1) / 2``.

    Args:
        lq, lk: ``(n,)`` integer arrays (or scalars) of queries and keys per segment.
        tile: the kernel's block side (positive int).

    Returns:
        ``(n,)`` float64 pairs.
    """
    lq = np.asarray(lq, dtype=np.float64)
    lk = np.asarray(lk, dtype=np.float64)
    b = float(tile)
    full = np.floor(lq / b)
    # query block i (full) sees keys up to (i + 1) * b + (lk - lq): i + 1 + ceil((lk - lq) / b) key blocks
    lead = np.ceil(np.maximum(lk - lq, 0.0) / b)
    blocks = full * (full + 1.0) / 2.0 + full * lead
    # a last, partial query block sees all lk keys
    blocks = blocks + np.where(lq - full * b > 0, np.ceil(lk / b), 0.0)
    return blocks * b * b


def _normalized(
    strategy: str,
    context_parallel_size: int,
    seqlens: np.ndarray,
    padded: np.ndarray,
    seq: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    rank: np.ndarray,
) -> Layout:
    """The layout of these chunks: empty ones dropped, sorted by (rank, seq, start), touching ones merged."""
    keep = stop > start
    seq, start, stop, rank = seq[keep], start[keep], stop[keep], rank[keep]
    # every builder cuts inside the (padded) sequences; a chunk outside one is a bug here, never a layout
    assert bool(((start >= 0) & (stop <= padded[seq])).all()), "a chunk lies outside its sequence"
    order = np.lexsort((start, seq, rank))
    seq, start, stop, rank = seq[order], start[order], stop[order], rank[order]
    if seq.size:
        joins = np.r_[False, (rank[1:] == rank[:-1]) & (seq[1:] == seq[:-1]) & (start[1:] == stop[:-1])]
        heads = np.flatnonzero(~joins)
        ends = np.r_[heads[1:], seq.size] - 1
        seq, start, stop, rank = seq[heads], start[heads], stop[ends], rank[heads]
    as64 = [np.ascontiguousarray(a, dtype=np.int64) for a in (seq, start, stop, rank)]
    return Layout(strategy, context_parallel_size, seqlens, padded, *as64)


def local_layout(strategy: str, context_parallel_size: int, seqlens: np.ndarray, owner: np.ndarray) -> Layout:
    """Every segment whole on rank ``owner[s]``."""
    s = np.arange(seqlens.size, dtype=np.int64)
    return _normalized(strategy, context_parallel_size, seqlens, seqlens, s, np.zeros_like(s), seqlens.copy(), owner)


def contiguous_layout(seqlens: np.ndarray, context_parallel_size: int) -> Layout:
    """The packed tokens cut into ``context_parallel_size`` ranges of ``floor``-rounded equal size, across sequences."""
    cu = np.r_[0, np.cumsum(seqlens)]
    total = int(cu[-1])
    bounds = (np.arange(context_parallel_size + 1, dtype=np.int64) * total) // context_parallel_size
    points = np.unique(np.r_[cu, bounds])
    lo, hi = points[:-1], points[1:]
    seq = np.searchsorted(cu, lo, side="right") - 1
    # zero-length segments share their start with the next one; searchsorted picks the last of them
    rank = np.searchsorted(bounds, lo, side="right") - 1
    return _normalized("contiguous", context_parallel_size, seqlens, seqlens, seq, lo - cu[seq], hi - cu[seq], rank)


def _head_tail(
    strategy: str, seqlens: np.ndarray, padded: np.ndarray, sizes: np.ndarray, context_parallel_size: int
) -> Layout:
    """Chunks of ``sizes`` ``(S, 2P)`` laid along each sequence; chunk ``c`` goes to rank ``min(c, 2P-1-c)``."""
    ends = np.cumsum(sizes, axis=1)
    starts = ends - sizes
    chunk = np.arange(2 * context_parallel_size, dtype=np.int64)
    owner = np.minimum(chunk, 2 * context_parallel_size - 1 - chunk)
    seq = np.repeat(np.arange(seqlens.size, dtype=np.int64), 2 * context_parallel_size)
    rank = np.tile(owner, seqlens.size)
    return _normalized(
        strategy, context_parallel_size, seqlens, padded, seq, starts.reshape(-1), ends.reshape(-1), rank
    )


def zigzag_layout(seqlens: np.ndarray, context_parallel_size: int, pad_sequences: bool = False) -> Layout:
    """Megatron / ring-flash-attention zigzag (see the module docstring for the padding and the remainder)."""
    n = 2 * context_parallel_size
    if pad_sequences:
        padded = -(-seqlens // n) * n
        sizes = np.repeat((padded // n)[:, None], n, axis=1)
        return _head_tail("zigzag", seqlens, padded, sizes, context_parallel_size)
    sizes = np.repeat((seqlens // n)[:, None], n, axis=1)
    rem = seqlens % n
    # the extras of a sequence go to the ranks after those that took the previous sequence's extras
    offset = np.r_[0, np.cumsum(rem)[:-1]] % context_parallel_size
    rows = np.arange(seqlens.size)
    for j in range(n):
        take = rem > j
        r = (offset + j) % context_parallel_size
        # a rank's first extra lands on its head chunk, a second one (more than P extras) on its tail chunk
        chunk = r if j < context_parallel_size else n - 1 - r
        sizes[rows[take], chunk[take]] += 1
    return _head_tail("zigzag", seqlens, seqlens.copy(), sizes, context_parallel_size)


def per_document_layout(seqlens: np.ndarray, context_parallel_size: int) -> Layout:
    """torch's per-document head-tail: chunk ``c`` of a sequence of length ``L`` is
    ``floor(c * L / 2P):floor((c + 1) * L / 2P)``."""
    n = 2 * context_parallel_size
    bounds = (seqlens[:, None] * np.arange(n + 1, dtype=np.int64)[None, :]) // n
    return _head_tail("per_document", seqlens, seqlens.copy(), np.diff(bounds, axis=1), context_parallel_size)
