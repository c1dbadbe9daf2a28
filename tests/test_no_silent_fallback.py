"""No silent fallback, and what was changed is said: a launcher's WORLD_SIZE without a process group, half a
world (``world_size`` without ``rank``), a batch sampler passed as ``sampler=``, the collator class passed for an
instance; capacities raised past the target's and reused packs above 5% of an epoch warn once and are reported;
a stream's packs collated outside ``step_batches`` (a loss per pack) warn.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnibal_kernels import (
    BalancedBatchSampler,
    BalancedPacker,
    Lengths,
    OmnibalWarning,
    PackCollator,
    PlanOptions,
    search_capacity,
    step_batches,
)
from omnibal_kernels.hf import balanced_train_dataloader
from omnibal_kernels.packing import pack_batch
from omnibal_kernels.testing.hf_models import lengths_of, training_samples


def _lengths(n: int = 200, seed: int = 0) -> Lengths:
    rng = np.random.default_rng(seed)
    return Lengths(rng.integers(0, 6, n), rng.integers(10, 900, n))


def _stand_in_trainer(n: int) -> SimpleNamespace:
    args = SimpleNamespace(
        world_size=1,
        process_index=0,
        gradient_accumulation_steps=1,
        seed=0,
        dataloader_drop_last=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        dataloader_persistent_workers=False,
        dataloader_prefetch_factor=None,
    )
    return SimpleNamespace(args=args, train_dataset=list(range(n)), data_collator=list)


def test_world_size_in_the_environment_needs_a_process_group(monkeypatch):
    lengths = _lengths()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ValueError,
        match=r"BalancedBatchSampler: WORLD_SIZE=2 in the environment but no "
        r"torch.distributed process group is initialized: call "
        r"torch.distributed.init_process_group",
    ):
        BalancedBatchSampler(lengths)
    with pytest.raises(ValueError, match=r"BalancedPacker: WORLD_SIZE=2 .*init_process_group"):
        BalancedPacker(list(range(10)), lambda s: (0, 1), options=PlanOptions(vit_capacity=1, llm_capacity=4))
    with pytest.raises(ValueError, match=r"BalancedTrainerMixin: WORLD_SIZE=2 .*init_process_group"):
        balanced_train_dataloader(
            _stand_in_trainer(len(lengths)), lengths, PlanOptions(vit_capacity=40, llm_capacity=4000)
        )
    with pytest.raises(ValueError, match=r"step_batches: WORLD_SIZE=2 .*init_process_group"):
        next(step_batches([], micro_steps_per_step=1))
    # an explicit world is the caller's: planning for other ranks needs no process group
    assert BalancedBatchSampler(lengths, world_size=2, rank=1).rank == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert BalancedBatchSampler(lengths).world_size == 1


@pytest.mark.parametrize("given", [{"world_size": 4}, {"rank": 0}])
def test_half_a_world_is_an_error(given):
    missing = "rank" if "world_size" in given else "world_size"
    given_name = next(iter(given))
    with pytest.raises(ValueError, match=f"BalancedBatchSampler: {given_name} was given without {missing}"):
        BalancedBatchSampler(_lengths(), **given)
    with pytest.raises(ValueError, match=f"BalancedPacker: {given_name} was given without {missing}"):
        BalancedPacker(list(range(10)), lambda s: (0, 1), PlanOptions(vit_capacity=1, llm_capacity=4), **given)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_batch_sampler_passed_as_sampler_is_a_clear_error(wrapped):
    data = training_samples("llama", 40, seed=0)
    sampler = BalancedBatchSampler(lengths_of(data), PlanOptions(vit_capacity=0, llm_capacity=60), world_size=1, rank=0)
    dataset = sampler.wrap(data) if wrapped else data
    for loader in (
        torch.utils.data.DataLoader(dataset, sampler=sampler, collate_fn=PackCollator()),
        torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, collate_fn=PackCollator()),
    ):
        with pytest.raises(
            TypeError,
            match=r"pass it as DataLoader\(dataset, batch_sampler=sampler\), not "
            r"sampler=sampler",
        ):
            next(iter(loader))
    with pytest.raises(TypeError, match="batch_sampler=sampler"):  # the wrapped dataset itself, indexed by a batch
        sampler.wrap(data)[[0, 1]]
    assert len(next(iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=list)))) > 0


@pytest.mark.parametrize("workers", [0, 1])
def test_the_collator_class_for_an_instance_is_a_clear_error(workers):
    data = training_samples("llama", 8, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=PackCollator, num_workers=workers)
    with pytest.raises(
        TypeError,
        match=r"PackCollator was called with a batch of 4 samples: collate_fn must be an "
        r"instance, collate_fn=PackCollator\(...\)",
    ):
        next(iter(loader))


def test_capacities_raised_past_the_target_warn_and_are_reported():
    lengths = _lengths()
    big = Lengths(np.append(lengths.vit, 60), np.append(lengths.llm, 20_000))  # one sample of 15 mean packs
    for method in ("balanced", "isf"):
        with pytest.warns(
            UserWarning,
            match=r"target_batch_size=4: the capacities it gives cannot hold the largest "
            r"sample \(ViT load 60, 20000 tokens\), so they were raised .* packs "
            r"hold about [\d.]+ samples on average \(predicted_batch_size\)",
        ):
            caps = search_capacity(
                big,
                PlanOptions(
                    target_batch_size=4,
                    method=method,
                ),
                world_size=2,
            )
        assert caps.raised and caps.predicted_batch_size > 8
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*were raised")
        assert not search_capacity(
            lengths,
            PlanOptions(target_batch_size=4),
        ).raised
        text = Lengths(np.zeros(200, np.int64), lengths.llm)
        assert not search_capacity(
            text,
            PlanOptions(target_batch_size=4),
        ).raised
    with pytest.warns(UserWarning, match="were raised"):
        assert search_capacity(
            Lengths(text.vit[:11], np.append(text.llm[:10], 100_000)),
            PlanOptions(target_batch_size=4),
        ).raised
    with pytest.warns(UserWarning, match="were raised"):
        sampler = BalancedBatchSampler(big, world_size=1, rank=0)
    report = sampler.report()
    assert report.capacities_raised == (True,) and report.predicted_batch_sizes[0] > 8
    assert report.to_dict()["capacities_raised"] == [True]
    plain = BalancedBatchSampler(lengths, world_size=1, rank=0).report()
    assert plain.capacities_raised == (False,) and plain.predicted_batch_sizes[0] == pytest.approx(4, rel=0.1)
    given = BalancedBatchSampler(lengths, PlanOptions(vit_capacity=30, llm_capacity=5000), world_size=1, rank=0)
    assert given.report().predicted_batch_sizes == (None,)


def test_reused_packs_above_five_percent_warn_once_and_are_reported():
    lengths = _lengths(200)
    with pytest.warns(
        UserWarning,
        match=r"epoch 0: [\d.]+% of the epoch's samples are trained twice: .* world_size "
        r"8 x micro_steps_per_step 1 = 8 packs.*packs hold about [\d.]+ samples.*"
        r"drop_last=True",
    ):
        # random packs: the balanced method splits packs into whole steps where it can, and reuses none here
        sampler = BalancedBatchSampler(lengths, PlanOptions(target_batch_size=4, method="random"), world_size=8, rank=0)
    report = sampler.report()
    assert report.duplicated_fraction == report.duplicated_samples.size / report.num_samples > 0.05
    assert report.groups[0].duplicated_fraction == report.duplicated_fraction
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*trained twice")
        for epoch in range(1, 4):  # once per sampler
            sampler.set_epoch(epoch)
            list(sampler)
        dropped = BalancedBatchSampler(lengths, PlanOptions(target_batch_size=4, drop_last=True), world_size=8, rank=0)
        assert dropped.report().duplicated_fraction == 0.0
        few = BalancedBatchSampler(_lengths(4000), PlanOptions(target_batch_size=4), world_size=2, rank=0)
        assert few.report().duplicated_fraction <= 0.05


@pytest.mark.parametrize("collate", ["PackCollator", "pack_batch"])
def test_a_stream_collated_outside_step_batches_warns_of_a_loss_per_pack(collate):
    data = training_samples("llama", 40, seed=0)
    options = PlanOptions(vit_capacity=0, llm_capacity=120)
    collate_fn = PackCollator() if collate == "PackCollator" else pack_batch

    def stream() -> BalancedPacker:
        return BalancedPacker(data, lambda s: (0, len(s["input_ids"])), options, buffer_size=16, world_size=1, rank=0)

    # the packs themselves, looked at without a collator: nothing to warn about
    packs = list(stream())
    assert sorted(i for pack in packs for i in map(id, pack)) == sorted(map(id, data))
    loader = torch.utils.data.DataLoader(stream(), batch_size=None, collate_fn=collate_fn)
    with pytest.warns(OmnibalWarning, match=r"outside omnibal_kernels.step_batches.*each pack's own mean"):
        batch = next(iter(loader))
    assert "num_items_in_batch" not in batch.keys()
    # through step_batches every batch gets its step's count of targets, and nothing warns (the suite's filters
    # make the warning an error)
    loader = torch.utils.data.DataLoader(stream(), batch_size=None, collate_fn=collate_fn)
    steps = list(step_batches(loader, micro_steps_per_step=2))
    assert sum(len(step) for step in steps) == len(packs)
    for step in steps:
        targets = sum(int((b["labels"][..., 1:] != -100).sum()) for b in step)
        assert all(int(b["num_items_in_batch"]) == targets for b in step)
