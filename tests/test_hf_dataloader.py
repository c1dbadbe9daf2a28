"""balanced_train_dataloader on a stand-in Trainer (runs without transformers; the real Trainer is in test_hf.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from omnibal_kernels._files import write_json
from omnibal_kernels.balance import PlanOptions
from omnibal_kernels.hf import SAMPLER_STATE_FILE, _check_sampler_state, balanced_train_dataloader
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.sampler import BalancedBatchSampler


def _trainer(n: int, **args):
    defaults = dict(
        world_size=2,
        process_index=1,
        gradient_accumulation_steps=2,
        seed=3,
        dataloader_drop_last=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        dataloader_persistent_workers=False,
        dataloader_prefetch_factor=None,
    )
    defaults.update(args)
    return SimpleNamespace(args=SimpleNamespace(**defaults), train_dataset=list(range(n)), data_collator=list)


def _lengths(n: int) -> Lengths:
    rng = np.random.default_rng(1)
    return Lengths(rng.integers(0, 4, n), rng.integers(4, 60, n))


@pytest.mark.parametrize("drop_last", [False, True])
def test_options_come_from_the_training_arguments(drop_last):
    lengths = _lengths(101)
    loader = balanced_train_dataloader(
        _trainer(101, dataloader_drop_last=drop_last), lengths, PlanOptions(vit_capacity=8, llm_capacity=160)
    )
    sampler = loader.batch_sampler.sampler
    assert (sampler.world_size, sampler.rank, sampler.micro_steps_per_step, sampler.seed, sampler.drop_last) == (
        2,
        1,
        2,
        3,
        drop_last,
    )
    reference = BalancedBatchSampler(
        lengths,
        PlanOptions(seed=3, drop_last=drop_last, vit_capacity=8, llm_capacity=160),
        world_size=2,
        rank=1,
        micro_steps_per_step=2,
    )
    assert list(loader) == reference.rank_batches(epoch=0)
    loader.set_epoch(1)
    assert list(loader) == reference.rank_batches(epoch=1)


def test_the_dataset_size_is_checked():
    caps = PlanOptions(vit_capacity=8, llm_capacity=160)
    loader = balanced_train_dataloader(_trainer(50, process_index=0, seed=9), _lengths(50), caps)
    assert (loader.batch_sampler.sampler.rank, loader.batch_sampler.sampler.seed) == (0, 9)
    with pytest.raises(ValueError, match="lengths has 49 samples but the dataset has 50"):
        balanced_train_dataloader(_trainer(50), _lengths(49), caps)
    trainer = _trainer(50)
    trainer.train_dataset = None
    with pytest.raises(ValueError, match="no train_dataset"):
        balanced_train_dataloader(trainer, _lengths(50))


def test_plan_options_never_silently_override_the_training_arguments():
    options = PlanOptions(vit_capacity=8, llm_capacity=160, seed=9, drop_last=True)
    loader = balanced_train_dataloader(_trainer(101, seed=9, dataloader_drop_last=True), _lengths(101), options)
    sampler = loader.batch_sampler.sampler
    assert (sampler.seed, sampler.drop_last, sampler.micro_steps_per_step) == (9, True, 2)
    reference = BalancedBatchSampler(_lengths(101), options, world_size=2, rank=1, micro_steps_per_step=2)
    assert list(loader) == reference.rank_batches(epoch=0)
    with pytest.raises(ValueError, match=r"plan_options.seed=9 but the TrainingArguments' seed is 3"):
        balanced_train_dataloader(_trainer(101), _lengths(101), options)
    with pytest.raises(ValueError, match=r"plan_options.drop_last=True but .* dataloader_drop_last is False"):
        balanced_train_dataloader(_trainer(101), _lengths(101), options.replace(seed=3))
    # one per group, each given the Trainer's seed
    groups = np.arange(101) % 2
    caps = PlanOptions(vit_capacity=8, llm_capacity=160)
    grouped = balanced_train_dataloader(_trainer(101), _lengths(101), [caps, caps], groups=groups)
    assert grouped.batch_sampler.sampler.options == (caps.replace(seed=3), caps.replace(seed=3))


def test_epochs_keep_the_length_of_plan_epoch_zero():
    # plans of 28, 26, 28, 28 micro-steps: the Trainer's epochs all have 28, taken from the plans back to back
    rng = np.random.default_rng(0)
    llm = rng.integers(4, 60, 120)
    lengths = Lengths(rng.integers(0, 4, 120), llm)
    options = PlanOptions(vit_capacity=8, llm_capacity=160, seed=13)
    reference = BalancedBatchSampler(lengths, options, world_size=1, rank=0, micro_steps_per_step=2)
    plans = [reference.rank_batches(epoch=e) for e in range(4)]
    assert [len(p) for p in plans] == [28, 26, 28, 28]
    stream = [batch for plan in plans for batch in plan]
    loader = balanced_train_dataloader(_trainer(120, world_size=1, process_index=0, seed=13), lengths, options)
    seen = []
    for epoch in (2, 0, 1, 2):  # any order: epoch e is always the same batches (what a resume relies on)
        loader.set_epoch(epoch)
        assert len(loader) == 28
        batches = list(loader)
        assert batches == stream[epoch * 28 : (epoch + 1) * 28]
        seen.append(batches)
    assert seen[0] == seen[3]
    # the sampler is at the plan epoch of the last batch: epoch 2 ends 2 micro-steps into plan epoch 3
    assert loader.batch_sampler.sampler.epoch == 3


def test_checkpoint_sampler_state_is_checked(tmp_path):
    identity = balanced_train_dataloader(
        _trainer(50), _lengths(50), PlanOptions(vit_capacity=8, llm_capacity=160)
    ).batch_sampler.identity()
    other = balanced_train_dataloader(
        _trainer(50, seed=4), _lengths(50), PlanOptions(vit_capacity=8, llm_capacity=160)
    ).batch_sampler.identity()
    path = tmp_path / SAMPLER_STATE_FILE
    _check_sampler_state(path, identity)  # a checkpoint without one: nothing to check
    write_json(path, identity)
    _check_sampler_state(path, identity)
    with pytest.raises(
        ValueError,
        match=f"{SAMPLER_STATE_FILE}: the checkpoint was written by a run with other "
        r"lengths or sampler options \(config_fingerprint",
    ):
        _check_sampler_state(path, other)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"{SAMPLER_STATE_FILE}: unreadable sampler state"):
        _check_sampler_state(path, identity)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        _check_sampler_state(path, identity)
