"""Hugging Face ``Trainer`` integration: balanced packs as the training DataLoader.

Recipe::

    from transformers import Trainer
    from omnibal_kernels import PackCollator, PlanOptions
    from omnibal_kernels.hf import BalancedTrainerMixin

    class BalancedTrainer(BalancedTrainerMixin, Trainer):
        pass

    trainer = BalancedTrainer(model=model, args=args, train_dataset=dataset,
                              data_collator=PackCollator.for_model(model), train_lengths=lengths,
                              plan_options=PlanOptions(target_batch_size=4))
    trainer.train()

The model receives packed batches (``input_ids (1, T)``, ``position_ids``, ``cu_seqlens``/``cu_seq_lens_q``,
``max_seqlen``/``max_length_q``, ...): use a model whose attention reads them (flash-attention varlen, or
:func:`omnibal_kernels.varlen_attention`). ``per_device_train_batch_size`` is ignored (a pack is one batch);
``gradient_accumulation_steps`` becomes ``micro_steps_per_step``, so each optimizer step is balanced; world
size, rank, seed and ``dataloader_drop_last`` (the plan's ``drop_last``) come from the ``TrainingArguments``
(a ``plan_options`` whose own seed or ``drop_last`` says otherwise is an error, never silently overridden;
``WORLD_SIZE > 1`` in the environment without an initialized process group is an error too).
The DataLoader is not passed through ``accelerator.prepare`` (that would shard the already per-rank batches
again); the Trainer moves batches to the device itself, and its ``set_epoch`` call reaches the sampler.

The loss: the DataLoader's dataset is ``sampler.wrap(train_dataset)``, so every sample's loads are checked
against the lengths (``check_loads=False`` turns that off) and, with label counts in the lengths, each batch
knows its optimizer step's label tokens over all ranks and micro-steps from the plan. The Trainer weights the
loss by ``num_items_in_batch`` (the token mean over the optimizer step and, with
``average_tokens_across_devices``, its default, over the ranks); the mixin hands it the plan's count instead
of the count the Trainer gathers from every rank each optimizer step. Without label counts the Trainer counts
and gathers as usual.

Epochs: the Trainer takes ``len(DataLoader)`` at the start as the length of every epoch, and on resume it
turns the global step into an epoch and a number of batches to skip (accelerate's ``skip_first_batches``)
with that length. Balanced plans of different epochs may hold different numbers of packs (a few micro-steps
more or less), which would make the Trainer drop the end of a longer epoch and resume off by the difference.
So the DataLoader yields the plans of epochs 0, 1, 2, ... back to back, and the Trainer's epoch ``e`` is the
micro-steps ``[e * L, (e + 1) * L)`` of that sequence, ``L`` being the length of plan epoch 0. No pack is
dropped or repeated at an epoch boundary, every optimizer step is one planned step, and a resumed run sees
exactly the batches of an uninterrupted one. When every plan has ``L`` micro-steps (as on the bundled data) the
Trainer's epochs are the plan epochs; otherwise training ends after ``num_train_epochs * L`` micro-steps, a few
short of or into the next plan epoch, as ``max_steps`` would. ``DataLoader.batch_sampler.sampler`` is the
:class:`BalancedBatchSampler` (for its ``report``).

Checkpoints: every checkpoint the Trainer saves under ``output_dir`` gets ``balanced_sampler.json``, the
fingerprints of the lengths, the plan options, the plan of epoch 0 and the epoch length (hyperparameter
search trials, which save elsewhere, get none). Resuming from a checkpoint that has
one with other lengths, options, seed or world size raises ``ValueError`` (the Trainer's step arithmetic
would otherwise skip into a different plan).

Nothing here imports ``transformers``; the module is importable without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Union, cast

import torch.utils.data

from ._checks import check_epoch
from .balance.options import PlanOptions, check_options
from .sampler import BalancedBatchSampler

__all__ = ["SAMPLER_STATE_FILE", "BalancedTrainerMixin", "balanced_train_dataloader"]

# Written into every checkpoint of a BalancedTrainerMixin Trainer; checked when resuming from it.
SAMPLER_STATE_FILE = "balanced_sampler.json"
_SAMPLER_STATE_VERSION = 1


class _FixedLengthEpochs(torch.utils.data.Sampler[list[int]]):
    """Batch sampler of fixed-length epochs over the plans of epochs 0, 1, 2, ... of ``sampler``, back to back.

    Epoch ``e`` yields the micro-steps ``[e * L, (e + 1) * L)`` of that sequence, ``L = epoch_length`` (the
    length of plan epoch 0), so its length never changes and batch ``k`` of epoch ``e`` is always the same.
    """

    def __init__(self, sampler: BalancedBatchSampler) -> None:
        self.sampler = sampler
        self._plan_lengths: list[int] = [len(sampler.rank_batches(epoch=0))]
        self.epoch_length = self._plan_lengths[0]
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = check_epoch(epoch)

    def __len__(self) -> int:
        return self.epoch_length

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run that wrote the checkpoint (JSON-serializable)."""
        return {
            "version": _SAMPLER_STATE_VERSION,
            "world_size": self.sampler.world_size,
            "micro_steps_per_step": self.sampler.micro_steps_per_step,
            "epoch_length": self.epoch_length,
            "config_fingerprint": self.sampler.state_dict()["config_fingerprint"],
            "plan_fingerprint": self.sampler.fingerprint(epoch=0),
        }

    def _plan_length(self, plan_epoch: int) -> int:
        while len(self._plan_lengths) <= plan_epoch:
            self._plan_lengths.append(len(self.sampler.rank_batches(epoch=len(self._plan_lengths))))
        return self._plan_lengths[plan_epoch]

    def __iter__(self) -> Iterator[list[int]]:
        position = self._epoch * self.epoch_length  # in the plans back to back
        stop = position + self.epoch_length
        plan_epoch, plan_start = 0, 0
        while plan_start + self._plan_length(plan_epoch) <= position:
            plan_start += self._plan_length(plan_epoch)
            plan_epoch += 1
        while position < stop:
            self.sampler.set_epoch(plan_epoch)  # what the sampler reports on (balance_report, state_dict)
            batches = self.sampler.rank_batches(epoch=plan_epoch)
            self.sampler._plan_after(plan_epoch)
            take = min(stop, plan_start + len(batches)) - position
            yield from batches[position - plan_start : position - plan_start + take]
            position += take
            plan_start += len(batches)
            plan_epoch += 1


class _EpochDataLoader(torch.utils.data.DataLoader):
    """A DataLoader whose ``set_epoch`` selects the epoch of its batch sampler."""

    batch_sampler: _FixedLengthEpochs  # what balanced_train_dataloader builds it with

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


def _with_trainer_arguments(
    options: Union[PlanOptions, Sequence[PlanOptions], None], args: Any
) -> Union[PlanOptions, list[PlanOptions]]:
    """``options`` (one, or one per group) with the Trainer's seed and ``drop_last``; options that set either to
    another value than the ``TrainingArguments`` are a ``ValueError`` (two sources, one setting)."""
    defaults = PlanOptions()
    wanted = {"seed": int(args.seed), "drop_last": bool(args.dataloader_drop_last)}
    many = isinstance(options, Sequence) and not isinstance(options, str)
    out = []
    for opts in options if many else [options]:  # type: ignore[union-attr]
        opts = check_options(opts)
        for name, value in wanted.items():
            own = getattr(opts, name)
            if own != getattr(defaults, name) and own != value:
                flag = "seed" if name == "seed" else "dataloader_drop_last"
                raise ValueError(
                    f"plan_options.{name}={own!r} but the TrainingArguments' {flag} is {value!r}: the Trainer's "
                    f"{flag} is the plan's; set it there (or leave plan_options.{name} at its default)"
                )
        out.append(opts.replace(**wanted))
    return out if many else out[0]


def _trainer_world(args: Any) -> tuple[int, int]:
    """``(world_size, rank)`` of the Trainer's arguments; an error where the environment says more processes
    run than a process group connects."""
    import torch.distributed as dist

    env = os.environ.get("WORLD_SIZE", "").strip()
    if env.isdigit() and int(env) > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"BalancedTrainerMixin: WORLD_SIZE={env} in the environment but no torch.distributed process group is "
            f"initialized (the Trainer's arguments say world size {args.world_size}): call "
            "torch.distributed.init_process_group(...) before building the Trainer (torchrun and accelerate "
            "launch set up what it needs); else every process trains the batches of rank 0"
        )
    return int(args.world_size), int(args.process_index)


def balanced_train_dataloader(
    trainer: Any,
    lengths: Any,
    plan_options: Union[PlanOptions, Sequence[PlanOptions], None] = None,
    *,
    groups: Any = None,
    collate_fn: Optional[Callable[..., Any]] = None,
    check_loads: bool = True,
) -> torch.utils.data.DataLoader:
    """The training DataLoader of ``trainer`` (a ``transformers.Trainer``) over a :class:`BalancedBatchSampler`.

    Args:
        trainer: supplies ``train_dataset``, ``data_collator`` and ``args`` (``world_size``, ``process_index``,
            ``gradient_accumulation_steps``, ``seed``, ``dataloader_drop_last``, ``dataloader_num_workers``,
            ``dataloader_pin_memory``, ``dataloader_persistent_workers``, ``dataloader_prefetch_factor``).
        lengths: per-sample loads of ``train_dataset`` (see :class:`BalancedBatchSampler`).
        plan_options: how to plan (a :class:`~omnibal_kernels.PlanOptions`, or one per group); its ``seed`` and
            ``drop_last`` are the Trainer's (``args.seed``, ``args.dataloader_drop_last``): options that set
            them to other values are a ``ValueError``.
        groups: the sampler's groups (:class:`BalancedBatchSampler`).
        collate_fn: default ``trainer.data_collator`` (pass ``data_collator=PackCollator.for_model(model)`` to
            the Trainer).
        check_loads: check every sample against its length entry (:meth:`BalancedBatchSampler.wrap`).

    Returns:
        A DataLoader over ``sampler.wrap(train_dataset)`` yielding one packed batch per micro-step, with
        ``set_epoch``; every epoch has the length of plan epoch 0 (see the module docstring), and
        ``batch_sampler.sampler`` is the :class:`BalancedBatchSampler`.

    Raises:
        ValueError: no ``train_dataset``; ``WORLD_SIZE > 1`` in the environment without an initialized process
            group; what the sampler raises.
    """
    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("the Trainer has no train_dataset")
    world_size, rank = _trainer_world(args)
    sampler = BalancedBatchSampler(
        lengths,
        _with_trainer_arguments(plan_options, args),
        world_size=world_size,
        rank=rank,
        micro_steps_per_step=args.gradient_accumulation_steps,
        groups=groups,
        dataset=dataset,
    )
    workers = args.dataloader_num_workers
    extra: dict[str, Any] = {}
    if workers > 0:
        extra["persistent_workers"] = args.dataloader_persistent_workers
        if args.dataloader_prefetch_factor is not None:
            extra["prefetch_factor"] = args.dataloader_prefetch_factor
    return _EpochDataLoader(
        sampler.wrap(dataset, check_loads=check_loads),
        batch_sampler=_FixedLengthEpochs(sampler),
        collate_fn=collate_fn or trainer.data_collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        **extra,
    )


def _check_sampler_state(path: Path, identity: dict[str, Any]) -> None:
    """ValueError when the checkpoint's sampler state (if it has one) differs from this run's ``identity``."""
    if not path.is_file():
        return  # a checkpoint of another Trainer: nothing to compare
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable sampler state ({err})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: the sampler state must be a JSON object")
    differ = [key for key in identity if key != "version" and saved.get(key) != identity[key]]
    if differ:
        details = ", ".join(f"{key} {saved.get(key)!r} != {identity[key]!r}" for key in differ)
        raise ValueError(
            f"{path}: the checkpoint was written by a run with other lengths or sampler options ({details}); "
            "resuming it would not continue its batches"
        )


def _sampler_state_callback(trainer: Any) -> Any:
    """A ``transformers.TrainerCallback`` writing :data:`SAMPLER_STATE_FILE` into every checkpoint."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class SaveSamplerState(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            identity = trainer._sampler_identity
            if args.should_save and identity is not None and folder.is_dir():
                from ._files import write_json

                write_json(folder / SAMPLER_STATE_FILE, identity, indent=1)

    return SaveSamplerState()


def _planned_num_items(batches: list[Any]) -> Optional[int]:
    """The label tokens of the optimizer step ``batches`` make up, from the plan; None unless every batch carries
    the count of one and the same planned step."""
    counts = [getattr(b, "loss_counts", None) for b in batches]
    known = [c for c in counts if c is not None and c.num_items_in_batch is not None]
    if not known or len(known) != len(counts) or len({(c.epoch, c.step) for c in known}) != 1:
        return None
    return int(known[0].num_items_in_batch)


class BalancedTrainerMixin:
    """Put before ``transformers.Trainer`` in the bases: ``class T(BalancedTrainerMixin, Trainer)``.

    Extra constructor arguments: ``train_lengths`` (per-sample loads of ``train_dataset``, required),
    ``plan_options`` (a :class:`~omnibal_kernels.PlanOptions`, or one per group; seed and ``drop_last`` are the
    ``TrainingArguments``'), ``groups`` (the sampler's groups) and ``check_loads`` (check every sample against
    its length entry, default True).
    """

    def __init__(
        self,
        *args: Any,
        train_lengths: Any,
        plan_options: Union[PlanOptions, Sequence[PlanOptions], None] = None,
        groups: Any = None,
        check_loads: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.train_lengths = train_lengths
        self.plan_options = plan_options
        self.groups = groups
        self.check_loads = check_loads
        self._sampler_identity: Optional[dict[str, Any]] = None
        self._resume_checkpoint: Optional[Path] = None
        self.add_callback(_sampler_state_callback(self))  # type: ignore[attr-defined]  # of the Trainer mixed in

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; a checkpoint to resume from is first checked against this run's sampler."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)  # type: ignore[attr-defined]  # the Trainer's
        self._resume_checkpoint = Path(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else None
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]  # the Trainer's
        finally:
            self._resume_checkpoint = None

    def get_batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int, device: Any) -> tuple[list[Any], Any]:
        """``Trainer.get_batch_samples``: the optimizer step's batches and their ``num_items_in_batch``, taken
        from the plan when the lengths carry label counts (no gather across ranks), else the Trainer's count."""
        batches: list[Any] = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        count = _planned_num_items(batches)
        if count is None or not self._plan_count_is_the_trainers():
            return super().get_batch_samples(iter(batches), len(batches), device)  # type: ignore[misc]
        return batches, torch.tensor(count, device=device)

    def _plan_count_is_the_trainers(self) -> bool:
        """Whether the Trainer counts what the plan gives: the step's label tokens over all ranks (it averages
        tokens across devices, the model takes ``num_items_in_batch``, and no model, context or sequence
        parallel ranks or DataParallel GPUs share a batch)."""
        args = self.args  # type: ignore[attr-defined]
        shared = [getattr(self, name, lambda: 1)() for name in ("get_tp_size", "get_cp_size", "get_sp_size")]
        uses_count = self.model_accepts_loss_kwargs or self.compute_loss_func is not None  # type: ignore[attr-defined]
        return (
            uses_count
            and getattr(args, "n_gpu", 1) <= 1
            and all(size == 1 for size in shared)
            and (args.average_tokens_across_devices or args.world_size == 1)
        )

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        loader = balanced_train_dataloader(
            self, self.train_lengths, self.plan_options, groups=self.groups, check_loads=self.check_loads
        )
        self._sampler_identity = cast(_FixedLengthEpochs, loader.batch_sampler).identity()
        if self._resume_checkpoint is not None:
            _check_sampler_state(self._resume_checkpoint / SAMPLER_STATE_FILE, self._sampler_identity)
        return loader
