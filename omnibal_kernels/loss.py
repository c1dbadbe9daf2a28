"""The loss of a packed micro-step as its share of the optimizer step's mean, over all ranks and micro-steps.

A causal LM trained on packs must weight every token (or every sample) over the whole optimizer step, never
per pack: packs are balanced in input tokens, not in label tokens, and a per-pack mean under DDP's gradient
average weights a token by one over its own pack's label count. The step's count is what makes it exact:

* **From the plan, without communication.** With label counts in the lengths
  (:attr:`~omnibal_kernels.lengths.Lengths.label`), ``DataLoader(sampler.wrap(dataset), batch_sampler=sampler,
  collate_fn=PackCollator.for_model(model))`` gives each batch ``num_items_in_batch``: the optimizer step's label
  tokens after the causal shift, all ranks and micro-steps (the name and meaning transformers' losses take). Then
  ``model(**batch).loss`` is the micro-step's summed token loss over that count.
* **One all-reduce per optimizer step.** Without label counts, :func:`step_batches` groups a loader's batches
  by optimizer step, counts the step's label tokens on each rank and sums them over the ranks with one
  ``torch.distributed.all_reduce`` of two int64 scalars (the tokens and the labelled samples), then sets the
  same fields.

Either way: under DDP (or FSDP), which averages gradients over the ranks, backpropagate ``loss * world_size``
in every micro-step; the accumulated gradient is then exactly that of the token mean over the optimizer step.
For models that return logits (not a transformers loss) :func:`step_loss` computes the same share from
``(logits, batch)``, in the token mode or the sample mode (every sample weighted equally, whatever its
length: each sample's mean token loss, averaged over the step's samples that have targets).

Context parallelism: a batch of a sharding ``PackCollator`` (``context_parallel.size = C``) is one CP rank's
shard of a pack, with the pack's counts. :func:`step_loss` pairs each held token with its target in
``shift_labels`` (never with its local neighbour, which may belong to another chunk) and weights samples by
their targets over the whole pack; :func:`step_batches` counts each shard's own targets (summed over all
ranks, CP ranks included, they are the step's) and each labelled sample once (on CP rank 0). The
``world_size`` to multiply by is then every rank the gradient average spans, data- and context-parallel
(Megatron and torchtitan reduce gradients over both).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F

from ._checks import check_positive_int, default_world
from .packing.batch import LossCounts, PackedBatch
from .sampler import BalancedBatchSampler
from .streaming import BalancedPacker

__all__ = ["LossMode", "step_batches", "step_loss"]

LossMode = Literal["token", "sample"]
_MODES = ("token", "sample")


def _counts_of(batch: Any) -> LossCounts:
    counts = getattr(batch, "loss_counts", None)
    if not isinstance(counts, LossCounts):
        raise TypeError(
            f"expected a PackedBatch of PackCollator or pack_batch (with loss_counts), got {type(batch).__name__}"
        )
    return counts


def _targets(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The causal loss's targets of a packed ``(1, T)`` row: ``labels[0, 1:] != ignore_index``, ``(T - 1,)`` bool."""
    return labels.reshape(-1)[1:] != ignore_index


def _segments(sample_lens: tuple[int, ...], total: int, device: torch.device) -> torch.Tensor:
    """``(total,)`` int64 sample index of every token; padding after the samples gets ``len(sample_lens)``."""
    lens = torch.tensor([*sample_lens, total - sum(sample_lens)], dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(lens.shape[0], device=device), lens)


def _shard_of(batch: Any) -> Any:
    """The batch's ContextParallelShard (a CP rank's part of a pack), or None for a whole pack."""
    from .context_parallel import ContextParallelShard

    shard = batch.get("context_parallel_shard") if isinstance(batch, PackedBatch) else None
    return shard if isinstance(shard, ContextParallelShard) else None


def _shard_segments(sample_lens: tuple[int, ...], indices: torch.Tensor) -> torch.Tensor:
    """``(n,)`` int64 sample index of every token a shard holds (its packed position ``indices``); padding
    (position ``-1``, or past the samples) gets ``len(sample_lens)``."""
    ends = torch.tensor(sample_lens, dtype=torch.int64, device=indices.device).cumsum(0)
    segments = torch.searchsorted(ends, indices, right=True)
    return torch.where(indices < 0, len(sample_lens), segments)


def _local_counts(batch: PackedBatch, ignore_index: int) -> tuple[int, int]:
    """This batch's targets and samples with at least one target (for a CP shard: its own targets, and the
    pack's labelled samples on CP rank 0 only, so that a sum over all ranks counts each once)."""
    counts = _counts_of(batch)
    shard = _shard_of(batch)
    if shard is not None:
        labelled = sum(t > 0 for t in counts.sample_targets or ()) if shard.rank == 0 else 0
        return int((batch["shift_labels"] != ignore_index).sum()), int(labelled)
    targets = _targets(batch["labels"], ignore_index)
    segments = _segments(counts.sample_lens, targets.shape[0] + 1, targets.device)[1:]
    per_sample = torch.bincount(segments[targets], minlength=len(counts.sample_lens) + 1)[:-1]
    return int(targets.sum()), int((per_sample > 0).sum())


def step_loss(
    logits: torch.Tensor, batch: PackedBatch, *, mode: LossMode = "token", ignore_index: int = -100
) -> torch.Tensor:
    """The micro-step's share of the optimizer step's mean causal LM loss: sum its values over the step's
    micro-steps and ranks and you get the mean (backpropagate ``loss * world_size`` under DDP).

    Args:
        logits: ``(1, T, vocab)`` or ``(T, vocab)``, position ``i`` predicting ``labels[i + 1]`` (the causal
            shift, as transformers' losses do); for a context-parallel shard (a batch with
            ``context_parallel_shard``) the ``n`` held tokens' logits, position ``i`` predicting
            ``shift_labels[i]``. Computed in float32 at least (float64 stays float64).
        batch: the :class:`~omnibal_kernels.packing.PackedBatch` the logits come from, with its step's counts:
            a batch of ``sampler.wrap(dataset)`` with label counts in the lengths, or one yielded by
            :func:`step_batches`.
        mode: ``"token"``: the summed token loss over ``num_items_in_batch`` (the step's targets). ``"sample"``:
            each sample's mean token loss summed, over ``num_samples_in_batch`` (the step's samples with
            targets); a sample without targets adds nothing.
        ignore_index: the label value without a target.

    Returns:
        A 0-d tensor.

    Raises:
        ValueError: the batch's step counts are unknown (never a silent per-pack mean: use lengths with label
            counts or :func:`step_batches`), logits and labels of different lengths, an unknown ``mode``.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    counts = _counts_of(batch)
    shard = _shard_of(batch)
    labels = batch["shift_labels" if shard is not None else "labels"].reshape(-1)
    flat = logits.reshape(-1, logits.shape[-1]) if logits.dim() == 3 else logits
    if logits.dim() not in (2, 3) or flat.shape[0] != labels.shape[0]:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match the batch's {labels.shape[0]} tokens "
            "(expected (1, T, vocab) or (T, vocab))"
        )
    total = counts.num_items_in_batch if mode == "token" else counts.num_samples_in_batch
    if total is None:
        raise ValueError(
            f"the batch's optimizer step has no count for mode={mode!r}: give the lengths label counts "
            "(Lengths.label) and use DataLoader(sampler.wrap(dataset), batch_sampler=sampler, ...), or iterate "
            "omnibal_kernels.step_batches(loader), which counts each step with one all-reduce"
        )
    dtype = torch.promote_types(flat.dtype, torch.float32)
    labels = labels.to(flat.device)
    # a CP shard's targets are already paired with their tokens; a whole pack pairs token i with label i + 1
    inputs, targets = (flat, labels) if shard is not None else (flat[:-1], labels[1:])
    losses = F.cross_entropy(inputs.to(dtype), targets, ignore_index=ignore_index, reduction="none")
    if mode == "token":
        return losses.sum() / max(total, 1)
    num_slots = len(counts.sample_lens) + 1
    if shard is not None:
        if counts.sample_targets is None:
            raise ValueError(
                "a context-parallel shard needs its samples' targets over the whole pack "
                "(LossCounts.sample_targets, which a sharding PackCollator sets)"
            )
        segments = _shard_segments(counts.sample_lens, shard.indices.to(flat.device))
        per_sample = torch.tensor([*(counts.sample_targets or ()), 0], dtype=torch.int64, device=flat.device)
    else:
        segments = _segments(counts.sample_lens, labels.shape[0], flat.device)[1:]
        per_sample = torch.bincount(segments[_targets(labels, ignore_index)], minlength=num_slots)
    sums = torch.zeros(num_slots, dtype=dtype, device=flat.device).index_add_(0, segments, losses)
    return (sums[:-1] / per_sample[:-1].clamp_min(1)).sum() / max(total, 1)


def _step_key(counts: LossCounts) -> Optional[tuple[int, int]]:
    return None if counts.step is None else (int(counts.epoch or 0), counts.step)


def _group_steps(batches: Iterator[Any], micro_steps_per_step: Optional[int]) -> Iterator[list[Any]]:
    """Consecutive batches of one optimizer step: by the plan's step where batches carry it (a resumed run's
    first step may be short), else ``micro_steps_per_step`` at a time."""
    step: list[Any] = []
    for batch in batches:
        counts = _counts_of(batch)
        key = _step_key(counts)
        if step and key is not None and key != _step_key(step[0].loss_counts):
            yield step
            step = []
        step.append(batch)
        per_step = counts.micro_steps_per_step if key is not None else micro_steps_per_step
        if per_step is None:
            raise ValueError("step_batches: these batches come from no sampler's plan; pass micro_steps_per_step")
        if (key is not None and counts.micro_step == per_step - 1) or (key is None and len(step) == per_step):
            yield step
            step = []
    if step:
        yield step


def _reduce_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def step_batches(
    loader: Iterable[PackedBatch], *, micro_steps_per_step: Optional[int] = None, ignore_index: int = -100
) -> Iterator[list[PackedBatch]]:
    """A loader's batches, one list per optimizer step, each batch with its step's counts.

    ``for batches in step_batches(loader): for batch in batches: (model(**batch).loss * world_size).backward()``

    Batches whose step's counts the plan gives (label counts in the lengths) pass unchanged, without
    communication. Otherwise the step's batches are fetched first (as the Hugging Face Trainer does), their
    targets (labels after the causal shift) and samples with targets are counted, and summed over the ranks
    with **one** ``torch.distributed.all_reduce`` (two int64 scalars, on the GPU with NCCL: one host sync) per
    optimizer step; every batch then gets ``num_items_in_batch`` (where it hands it to the model) and its
    :attr:`~omnibal_kernels.packing.PackedBatch.loss_counts` for :func:`step_loss`. Every rank must iterate the
    same number of steps (a sampler's plan guarantees it).

    Args:
        loader: yields :class:`~omnibal_kernels.packing.PackedBatch` (a DataLoader with ``PackCollator`` or
            ``pack_batch``).
        micro_steps_per_step: batches per optimizer step, for batches outside a sampler's plan (those of
            ``sampler.wrap(dataset)`` know their step).
        ignore_index: the label value without a target.

    Raises:
        ValueError: ``WORLD_SIZE > 1`` without an initialized process group (the counts would be this rank's
            only), batches outside a plan without ``micro_steps_per_step``.
    """
    if micro_steps_per_step is not None:
        micro_steps_per_step = check_positive_int("micro_steps_per_step", micro_steps_per_step)
    world_size, _ = default_world(owner="step_batches")
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", batch_sampler)
    if isinstance(sampler, BalancedBatchSampler):
        sampler._counted_per_step = True  # the sampler's warning about missing label counts does not apply
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, BalancedPacker):
        dataset._counted_per_step = True  # nor the collators' about a stream's packs
    for step in _group_steps(iter(loader), micro_steps_per_step):
        if all(b.loss_counts.num_items_in_batch is not None for b in step):
            yield step
            continue
        local = torch.tensor([sum(c) for c in zip(*(_local_counts(b, ignore_index) for b in step))], dtype=torch.int64)
        if world_size > 1:
            import torch.distributed as dist

            reduced = local.to(_reduce_device())
            dist.all_reduce(reduced)
            local = reduced.cpu()
        items, samples = local.tolist()
        yield [
            b.with_counts(b.loss_counts._replace(num_items_in_batch=items, num_samples_in_batch=samples)) for b in step
        ]
