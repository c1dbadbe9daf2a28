"""Balanced packs from a stream of samples (webdataset / streaming style), with a bounded buffer.

``BalancedPacker`` reads samples from a re-iterable source in a fixed order and cuts the stream into buffers
of ``buffer_size`` samples. Each buffer, together with the samples left over from the previous one, is
planned with :func:`omnibal_kernels.balance.plan_packs` for ``world_size`` ranks (``drop_last=True``): full
steps are emitted, the samples of a ragged last step are carried into the next buffer (so fewer than
``world_size`` packs are ever held back), and the final buffer is planned with the packer's own ``drop_last``.

Sharding without duplicates: DataLoader worker ``w`` of ``num_workers`` owns the buffers ``w, w + num_workers,
...`` and skips the samples of the others; every rank reads the same stream, plans the same buffers (the plan
depends only on the buffer's loads, the options with their seed, the buffer index and the epoch) and keeps its
own column of every step. So every sample lands in exactly one pack on one rank (only the final ragged step
with ``drop_last`` and ``oversize="drop"`` lose samples, both reported; a ragged step inside the stream,
oversize singles included, waits for the next buffer), and rank ``r``'s ``k``-th batch belongs to the same step
as every other rank's ``k``-th batch, also behind a DataLoader that interleaves its workers. The price: each
rank and worker reads the whole stream (cheap when samples are decoded lazily; ``lengths_fn`` should only look
at metadata).

Epochs: the epoch sits in a shared-memory tensor, so ``set_epoch`` in the main process reaches DataLoader
workers that hold their own copy of the packer (persistent workers included); each pass reads it when it
starts. The source must give the same samples every time it is iterated: a one-shot iterator is a
``TypeError`` at construction, and a pass that sees another number of samples than the first pass in the same
process is a ``ValueError`` (a source that runs dry would otherwise give an empty next epoch or shard).

:func:`streaming_report` replays the packer on known loads and returns its balance report next to the
offline plan's of the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Optional, Union, cast

import numpy as np
import torch.utils.data

from ._checks import check_epoch, check_int, check_positive_int, default_world
from ._csr import offsets_from_counts
from .balance.options import PlanOptions, check_options, check_world_size
from .balance.packs import Plan, TooFewPacksError, as_lengths
from .balance.plan import plan_packs_without_warning
from .balance.report import BalanceReport, balance_report
from .balance.schedule import concat_plans
from .balance.seeds import epoch_seed
from .lengths import Lengths

__all__ = ["BalancedPacker", "StreamPack", "StreamingReport", "streaming_report"]


def _stream_options(options: object) -> PlanOptions:
    """The options of a stream: capacities are needed (a stream cannot be searched before it is read)."""
    options = check_options(options)
    if options.context_parallel.enabled:
        raise ValueError(
            "BalancedPacker plans whole packs per rank; context parallelism (options.context_parallel.size > 1) "
            "needs the BalancedBatchSampler, whose batches tell the collator each rank's shard"
        )
    if not options.has_capacities:
        raise ValueError(
            "a stream needs vit_capacity and llm_capacity: capacities cannot be searched before the "
            "stream is read (search_capacity on a sample of its lengths gives them)"
        )
    return options


# (payload, vit, llm, ViT sequence lengths or None) of one sample, in stream order.
_Item = tuple[Any, int, int, Optional[tuple[int, ...]]]


def _buffer_lengths(batch: list[_Item]) -> Lengths:
    """The loads of a buffer, with its samples' ViT sequences where any sample gives them (a sample that gives
    none is one sequence of its whole ViT load, the cost model's default)."""
    vit = np.array([b[1] for b in batch], np.int64)
    llm = np.array([b[2] for b in batch], np.int64)
    if all(b[3] is None for b in batch):
        return Lengths(vit, llm)
    seqs = [b[3] if b[3] is not None else ((b[1],) if b[1] else ()) for b in batch]
    offsets = offsets_from_counts([len(q) for q in seqs])
    flat = np.fromiter((x for q in seqs for x in q), np.int64, count=int(offsets[-1]))
    return Lengths(vit, llm, vit_seqlens=flat, vit_seqlens_offsets=offsets)


def _plan_stream(
    items: Iterable[_Item],
    options: PlanOptions,
    world_size: int,
    buffer_size: int,
    epoch: int,
    worker: int,
    num_workers: int,
) -> Iterator[tuple[Plan, list[Any]]]:
    """``(plan, payloads)`` for each buffer that worker ``worker`` owns: ``plan``'s sample ids index ``payloads``.

    ``items``: ``(payload, vit, llm, vit_seqlens or None)`` in stream order. Plans hold whole steps only; what a
    plan drops with ``drop_last`` (other than samples dropped by ``oversize="drop"``) is carried into the worker's
    next buffer.
    """
    carried: list[_Item] = []
    current: list[_Item] = []
    buffer_index = -1
    vit_capacity, llm_capacity = options.capacities()

    def flush(batch: list[_Item], index: int, final: bool):
        if not batch:
            return None, []
        lengths = _buffer_lengths(batch)
        if options.oversize == "drop" and np.all((lengths.vit > vit_capacity) | (lengths.llm > llm_capacity)):
            return None, []  # nothing but oversize samples: all dropped (carried samples are never oversize)
        try:
            plan = plan_packs_without_warning(
                lengths,
                options.replace(drop_last=options.drop_last if final else True, seed=epoch_seed(options.seed, index)),
                world_size=world_size,
                epoch=epoch,
            )
        except TooFewPacksError:
            # fewer packs than ranks: wait for more samples, or (at the end, with drop_last) drop them
            return None, ([] if final else batch)
        if final:
            return plan, []
        # the ragged last step's samples wait for the next buffer, oversize singles included (they get their
        # own pack again there); only oversize="drop" loses samples here, and the report counts them
        carry_ids = plan.dropped_samples
        if options.oversize == "drop":
            carry_ids = np.setdiff1d(carry_ids, plan.oversize_samples)
        return plan, [batch[i] for i in carry_ids.tolist()]

    for position, item in enumerate(items):
        index = position // buffer_size
        if index % num_workers != worker:
            continue
        if index != buffer_index and current:
            batch = carried + current
            plan, carried = flush(batch, buffer_index, final=False)
            current = []
            if plan is not None:
                yield plan, [b[0] for b in batch]
        buffer_index = index
        current.append(item)
    batch = carried + current
    plan, _ = flush(batch, max(buffer_index, 0), final=True)
    if plan is not None:
        yield plan, [b[0] for b in batch]


def _checked_loads(position: int, loads: Any) -> tuple[int, int, Optional[tuple[int, ...]]]:
    """``lengths_fn``'s answer for the sample at ``position`` as ``(vit, llm, vit_seqlens or None)``, checked."""
    seqlens = None
    try:
        vit, llm, *rest = loads
        whole = len(rest) <= 1 and int(vit) == vit and int(llm) == llm  # 3.0 is fine; 2.5 is not truncated
        vit, llm = int(vit), int(llm)
    except (TypeError, ValueError, OverflowError):
        whole, rest = False, []
    if not whole:
        raise TypeError(
            f"sample {position}: lengths_fn must return (vit, llm) or (vit, llm, vit_seqlens) integers, got {loads!r}"
        )
    if vit < 0 or llm < 0:
        raise ValueError(f"sample {position}: negative load (vit {vit}, llm {llm})")
    if rest:
        try:
            given = tuple(int(x) for x in rest[0])
            whole = all(int(x) == x for x in rest[0])
        except (TypeError, ValueError, OverflowError):
            whole = False
        if not whole:
            raise TypeError(f"sample {position}: vit_seqlens must be a sequence of integers, got {rest[0]!r}")
        if any(x < 0 for x in given) or sum(given) != vit:
            raise ValueError(
                f"sample {position}: vit_seqlens {list(given)} must be non-negative and sum to its ViT load {vit}"
            )
        seqlens = given
    return vit, llm, seqlens


class StreamPack(list):
    """One pack of a :class:`~omnibal_kernels.streaming.BalancedPacker` (a list of samples), as the collator gets
    it.

    Attributes:
        counted_per_step: whether the loader is iterated through :func:`~omnibal_kernels.loss.step_batches`,
            which gives its batches their step's ``num_items_in_batch``; the collator warns where it is not.
    """

    __slots__ = ("counted_per_step",)

    def __init__(self, samples: list[Any], counted_per_step: bool) -> None:
        super().__init__(samples)
        self.counted_per_step = counted_per_step

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamPack, (list(self), self.counted_per_step))


class BalancedPacker(torch.utils.data.IterableDataset):
    """Yields this rank's packs (lists of samples) from a stream: ``DataLoader(packer, batch_size=None,
    collate_fn=pack_batch)``.

    Args:
        source: a re-iterable of samples (list, webdataset pipeline, ...) giving the same order on every
            rank and worker each time it is iterated; do not shard it per worker or rank yourself. An iterator
            or generator (consumed by one pass) raises TypeError; a pass that sees another number of samples
            than the first one raises ValueError.
        lengths_fn: ``sample -> (vit, llm)`` or ``(vit, llm, vit_seqlens)``, the sample's loads and, for a
            cost model with a ViT attention term, its ViT sequence lengths (one per image, video frame group or
            tile, summing to ``vit``; see :class:`~omnibal_kernels.lengths.Lengths`).
        options: a :class:`~omnibal_kernels.balance.options.PlanOptions` with capacities (a stream is not
            searched; ``target_batch_size`` is unused; no context parallelism). Plans depend only on the
            buffers' loads, the options, the buffer index and the epoch. ``drop_last`` acts at the end of the
            stream (a ragged last step dropped, as :func:`streaming_report` reports); ragged steps inside the
            stream are never dropped: their samples (oversize singles included) are carried into the next buffer.
        buffer_size: samples per buffer (memory bound: a worker holds at most one buffer plus fewer than
            ``world_size`` packs carried over).
        world_size, rank: default torch.distributed's when initialized, else 1 and 0.

    Yields:
        One list of samples per micro-step, for this rank (a :class:`StreamPack`:
        the collators warn where its batches would reach a model without their step's
        ``num_items_in_batch``, i.e. where the loader is not iterated through
        :func:`~omnibal_kernels.loss.step_batches`).
    """

    def __init__(
        self,
        source: Iterable[Any],
        lengths_fn: Callable[[Any], tuple[Any, ...]],
        options: PlanOptions,
        *,
        buffer_size: int = 4096,
        world_size: Optional[int] = None,
        rank: Optional[int] = None,
    ) -> None:
        if not callable(lengths_fn):
            raise TypeError("lengths_fn must be a callable sample -> (vit, llm) or (vit, llm, vit_seqlens)")
        if not hasattr(source, "__iter__"):
            raise TypeError(f"source must be iterable, got {type(source).__name__}")
        if isinstance(source, Iterator):
            raise TypeError(
                f"source must be re-iterable (a list, a map-style dataset, a webdataset pipeline, ...), got the "
                f"one-shot iterator {type(source).__name__}: it would be empty from the second pass on (the next "
                "epoch, another DataLoader worker); pass an object whose __iter__ starts the stream anew"
            )
        self.source = source
        self.lengths_fn = lengths_fn
        self.world_size, self.rank = default_world(world_size, rank, owner="BalancedPacker")
        self.options = _stream_options(options)
        self.buffer_size = check_positive_int("buffer_size", buffer_size)
        # The epoch lives in shared memory: DataLoader workers hold copies of the packer (persistent ones for
        # the whole run), and set_epoch in the main process must reach them.
        self._shared_epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._pass_samples: Optional[int] = None  # samples of the first complete pass in this process
        # set by step_batches before the loader starts its workers, so that their copies carry it too
        self._counted_per_step = False

    @property
    def epoch(self) -> int:
        """The epoch the next pass plans for (what :meth:`set_epoch` set; 0 at first)."""
        return int(self._shared_epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """New packs for a new epoch (the stream order is the source's); DataLoader workers, persistent ones
        included, plan the epoch set here when their next pass starts."""
        self._shared_epoch.fill_(check_epoch(epoch))  # below 2**63: fits the int64 slot

    def _items(self) -> Iterator[_Item]:
        position = -1
        for position, sample in enumerate(self.source):
            loads = self.lengths_fn(sample)
            yield (sample, *_checked_loads(position, loads))
        # Every pass must see the same stream: a source that is consumed by its first pass (a generator behind
        # __iter__, a shared file handle) would silently yield nothing in the next epoch or the next shard.
        count = position + 1
        if self._pass_samples is None:
            self._pass_samples = count
        elif count != self._pass_samples:
            raise ValueError(
                f"source gave {count} samples on this pass but {self._pass_samples} on the first one: "
                "BalancedPacker needs a source that gives the same samples in the same order every time it is "
                "iterated (is its __iter__ handing out an exhausted iterator?)"
            )

    def iter_shard(self, worker: int = 0, num_workers: int = 1) -> Iterator[list[Any]]:
        """The packs of DataLoader worker ``worker`` of ``num_workers`` on this rank (``__iter__`` picks them);
        the epoch is read now, when the pass starts."""
        num_workers = check_positive_int("num_workers", num_workers)
        worker = check_int("worker", worker)
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker must be in [0, {num_workers}), got {worker}")
        return self._packs(self.epoch, worker, num_workers)

    def _packs(self, epoch: int, worker: int, num_workers: int) -> Iterator[list[Any]]:
        for plan, payloads in _plan_stream(
            self._items(), self.options, self.world_size, self.buffer_size, epoch, worker, num_workers
        ):
            for pack in plan.step_packs[:, self.rank]:
                yield StreamPack([payloads[i] for i in plan.pack(int(pack)).tolist()], self._counted_per_step)

    def __iter__(self) -> Iterator[list[Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self.iter_shard(0, 1)
        return self.iter_shard(info.id, info.num_workers)


class StreamingReport(NamedTuple):
    """Balance of the streaming packer next to the offline plan of the same samples.

    ``offline`` is None where no offline plan exists for the options (with ``drop_last=True`` the whole data may
    fill fewer packs than ranks, which the stream reports as dropped samples instead).
    """

    streaming: BalanceReport
    offline: Optional[BalanceReport]
    num_buffers: int


def _merge(plans: list[tuple[Plan, list[int]]], options: PlanOptions, world_size: int, n: int) -> Plan:
    """The streamed plans as one Plan over stream positions (steps one after another)."""
    ids = [np.asarray(payloads, np.int64) for _, payloads in plans]
    stacked = concat_plans([plan for plan, _ in plans], ids)
    slotted = [i[plan.slot_samples()] for (plan, _), i in zip(plans, ids)]
    # samples in no slot: carried to a worker's last buffer and dropped there (drop_last), or oversize-dropped;
    # a sample carried out of a buffer's plan shows up in a later plan
    lost = np.setdiff1d(np.arange(n), np.concatenate(slotted) if slotted else np.zeros(0, np.int64))
    vit_capacity, llm_capacity = options.capacities()
    return Plan(
        method=options.method,
        pack_offsets=stacked.pack_offsets,
        pack_samples=stacked.pack_samples,
        step_packs=np.concatenate(stacked.step_packs) if plans else np.zeros((0, world_size), np.int64),
        world_size=world_size,
        vit_capacity=vit_capacity,
        llm_capacity=llm_capacity,
        seed=options.seed,
        dropped_samples=lost,
        duplicated_slots=sum(plan.duplicated_slots for plan, _ in plans),
        num_input_samples=n,
        seconds=float(sum(p.seconds for p, _ in plans)),
    )


def streaming_report(
    lengths: Union[Lengths, tuple, np.ndarray],
    options: PlanOptions,
    *,
    buffer_size: int = 4096,
    world_size: int = 8,
    num_workers: int = 1,
    epoch: int = 0,
) -> StreamingReport:
    """Plans ``lengths`` as a stream (in order, ``buffer_size`` at a time, over ``num_workers`` workers) and
    offline (all at once), and reports both with :func:`balance_report` (fill, dist ratios, efficiency).

    ``options`` and ``buffer_size`` are those of :class:`BalancedPacker`.

    Returns:
        ``StreamingReport(streaming, offline, num_buffers)``; ``offline`` is None where :func:`plan_packs`
        cannot plan the whole data with these options (``TooFewPacksError``, or no sample to plan: none, or
        all dropped by ``oversize="drop"``) while the stream can, dropping and reporting what it cannot schedule.

    Raises:
        ValueError/TypeError: the streaming packer's errors (e.g. ``OversizeError`` with ``oversize="error"``,
            bad options).
    """
    options = _stream_options(options)
    buffer_size = check_positive_int("buffer_size", buffer_size)
    world_size = check_world_size(world_size)
    num_workers = check_positive_int("num_workers", num_workers)
    epoch = check_epoch(epoch)
    lengths = as_lengths(lengths)
    n = len(lengths)
    if lengths.vit_seqlens is None:
        seqs: list[Optional[tuple[int, ...]]] = [None] * n
    else:
        flat, offsets = lengths.vit_seqlens.tolist(), cast(np.ndarray, lengths.vit_seqlens_offsets).tolist()
        seqs = [tuple(flat[offsets[i] : offsets[i + 1]]) for i in range(n)]
    items = list(zip(range(n), lengths.vit.tolist(), lengths.llm.tolist(), seqs))
    plans = [
        pp
        for w in range(num_workers)
        for pp in _plan_stream(items, options, world_size, buffer_size, epoch, w, num_workers)
    ]
    streaming = balance_report(_merge(plans, options, world_size, n), lengths, options.cost_model)
    try:
        offline: Optional[BalanceReport] = balance_report(
            plan_packs_without_warning(lengths, options, world_size=world_size, epoch=epoch),
            lengths,
            options.cost_model,
        )
    except TooFewPacksError:  # drop_last and fewer packs than ranks: the stream dropped (and reported) them
        offline = None
    except ValueError:
        # no sample to plan (none, or all dropped as oversize): the stream reports them all dropped
        vit_capacity, llm_capacity = options.capacities()
        if ((lengths.vit <= vit_capacity) & (lengths.llm <= llm_capacity)).any():
            raise
        offline = None
    return StreamingReport(streaming, offline, len(plans))
