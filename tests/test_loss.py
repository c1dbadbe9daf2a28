"""The loss over an optimizer step, in one process: the plan's counts reach every batch exactly (DataLoader
workers, epochs, resumes, reused packs), ``step_loss`` gives the global means for a model that is not a
transformers one, ``step_batches`` groups and counts, and unknown counts are an error, never a per-pack mean.

The multi-process runs (gloo, DDP, transformers models, the Trainer) are in ``test_loss_distributed.py``.
"""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from omnibal_kernels import (
    BalancedBatchSampler,
    PackCollator,
    PackOptions,
    PlanOptions,
    pack_batch,
    step_batches,
    step_loss,
)
from omnibal_kernels.testing.hf_models import label_tokens, lengths_of, training_samples
from omnibal_kernels.testing.models import TinyCausalLM

WORLD, MICRO_STEPS = 2, 2


def _data(n: int = 48) -> list[dict[str, Any]]:
    return training_samples("llama", n, seed=4)


def _sampler(lengths: Any, rank: int = 0, **options: Any) -> BalancedBatchSampler:
    plan = PlanOptions(**{"vit_capacity": 0, "llm_capacity": 40, "seed": 2, **options})
    return BalancedBatchSampler(lengths, plan, world_size=WORLD, rank=rank, micro_steps_per_step=MICRO_STEPS)


def _true_counts(data: list[dict[str, Any]], lengths: Any, epoch: int, **options: Any) -> list[tuple[int, int]]:
    """Every optimizer step's label tokens and labelled samples, counted from the samples themselves."""
    ranks = [_sampler(lengths, r, **options).rank_batches(epoch=epoch) for r in range(WORLD)]
    out = []
    for first in range(0, len(ranks[0]), MICRO_STEPS):
        ids = [i for batches in ranks for batch in batches[first : first + MICRO_STEPS] for i in batch]
        counts = [label_tokens(data[i]) for i in ids]
        out.append((sum(counts), sum(c > 0 for c in counts)))
    return out


def _loader(
    sampler: BalancedBatchSampler,
    data: list[dict[str, Any]],
    workers: int,
    context: str | None = None,
    persistent: bool = False,
) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        sampler.wrap(data),
        batch_sampler=sampler,
        collate_fn=PackCollator(),
        num_workers=workers,
        persistent_workers=persistent,
        multiprocessing_context=context if workers else None,
    )


def _check_epoch(loader: Any, truth: list[tuple[int, int]], start: int = 0) -> None:
    batches = list(loader)
    assert len(batches) == len(truth) * MICRO_STEPS - start
    for k, batch in enumerate(batches, start=start):
        items, samples = truth[k // MICRO_STEPS]
        assert int(batch["num_items_in_batch"]) == items == batch.loss_counts.num_items_in_batch, k
        assert batch.loss_counts.num_samples_in_batch == samples
        assert (batch.loss_counts.step, batch.loss_counts.micro_step) == divmod(k, MICRO_STEPS)


_CONTEXTS = [c for c in ("fork", "spawn") if c in multiprocessing.get_all_start_methods()]


# Few samples over many slots: the ragged last step reuses packs, which the counts must cover too.
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.DuplicatesWarning")
@pytest.mark.parametrize(
    "workers, context, persistent",
    [
        (0, None, False),
        (2, "fork", False),
        # a spawned worker imports torch and the package afresh: seconds
        *((1, c, True) if c != "spawn" else pytest.param(1, c, True, marks=pytest.mark.slow) for c in _CONTEXTS),
    ],
)
def test_every_batch_gets_its_steps_count_in_any_worker(workers, context, persistent):
    """Persistent workers hold one copy of the dataset for the whole run: the counts travel with the batches."""
    if context == "fork" and "fork" not in _CONTEXTS:
        pytest.skip("no fork")
    data = _data()
    lengths = lengths_of(data)
    # random packs: the ragged last step reuses packs (the balanced method splits packs into whole steps here)
    sampler = _sampler(lengths, method="random")
    assert sampler.report().duplicated_samples.size > 0
    loader = _loader(sampler, data, workers, context, persistent)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        _check_epoch(loader, _true_counts(data, lengths, epoch, method="random"))


def test_a_resumed_run_gets_the_same_counts():
    data = _data()
    lengths = lengths_of(data)
    run = _sampler(lengths)
    run.set_epoch(1)
    it = iter(_loader(run, data, 0))
    for _ in range(3):
        next(it)
    resumed = _sampler(lengths)
    resumed.load_state_dict(run.state_dict())
    resumed.set_epoch(1)
    _check_epoch(
        _loader(resumed, data, 2, "fork" if "fork" in _CONTEXTS else "spawn"), _true_counts(data, lengths, 1), start=3
    )


def _reference_grads(model: torch.nn.Module, samples: list[dict[str, Any]], mode: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    terms = []
    for s in samples:
        logits = model(s["input_ids"][None])[0]
        terms.append(
            (F.cross_entropy(logits[:-1], s["labels"][1:], ignore_index=-100, reduction="sum"), label_tokens(s))
        )
    if mode == "token":
        loss = sum(ce for ce, _ in terms) / sum(n for _, n in terms)
    else:
        loss = sum(ce / n for ce, n in terms if n) / sum(n > 0 for _, n in terms)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token", "sample"])
@pytest.mark.parametrize("with_label", [True, False])
def test_step_loss_of_a_model_without_transformers_is_the_global_mean(mode, with_label):
    """TinyCausalLM returns logits; summed over the ranks (what DDP's average times world_size gives) and the
    micro-steps, step_loss has the gradient of the step's global token or sample mean (float64, 1e-6)."""
    data = _data()
    lengths = lengths_of(data, label=with_label)
    torch.manual_seed(0)
    model = TinyCausalLM(vocab_size=128).double()
    model.zero_grad(set_to_none=True)
    slots = []
    by_hand = None if with_label else _all_reduced_first_step(lengths, data)
    for rank in range(WORLD):
        sampler = _sampler(lengths, rank)
        step = next(iter(step_batches(_loader(sampler, data, 0)))) if with_label else by_hand[rank]
        for batch in step:
            logits = model(
                batch["input_ids"],
                position_ids=batch["position_ids"],
                cu_seqlens=batch["cu_seqlens"],
                max_seqlen=batch["max_seqlen"],
            )
            step_loss(logits, batch, mode=mode).backward()
        slots += [i for ids in sampler.rank_batches()[:MICRO_STEPS] for i in ids]
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    want = _reference_grads(model, [data[i] for i in slots], mode)
    for key, g in want.items():
        assert float((got[key] - g).norm() / g.norm()) <= 1e-6, key


def _all_reduced_first_step(lengths: Any, data: list[dict[str, Any]]) -> list[list[Any]]:
    """Every rank's first optimizer step through step_batches, with the all-reduce done by hand (one process
    plays both ranks): the counts are summed over the ranks' batches."""
    steps = []
    for rank in range(WORLD):
        loader = _loader(_sampler(lengths, rank), data, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the counts are summed here, by hand
            steps.append(list(loader)[:MICRO_STEPS])
    assert all(b.loss_counts.num_items_in_batch is None for step in steps for b in step)
    items = sum(int((b["labels"][0, 1:] != -100).sum()) for step in steps for b in step)
    labelled = sum(1 for step in steps for b in step for i in _sample_targets(b) if i > 0)
    return [
        [b.with_counts(b.loss_counts._replace(num_items_in_batch=items, num_samples_in_batch=labelled)) for b in step]
        for step in steps
    ]


def _sample_targets(batch: Any) -> list[int]:
    cu = np.cumsum([0, *batch.loss_counts.sample_lens])
    labels = batch["labels"][0]
    return [int((labels[a:b] != -100).sum()) for a, b in zip(cu[:-1], cu[1:])]


def test_step_batches_counts_a_world_of_one_and_groups_plain_batches():
    data = _data(12)
    batches = [pack_batch(data[i : i + 3]) for i in range(0, 12, 3)]
    assert all(b.loss_counts.num_items_in_batch is None and "num_items_in_batch" not in b for b in batches)
    steps = list(step_batches(batches, micro_steps_per_step=2))
    assert [len(s) for s in steps] == [2, 2]
    for k, step in enumerate(steps):
        items = sum(label_tokens(s) for s in data[6 * k : 6 * k + 6])
        samples = sum(label_tokens(s) > 0 for s in data[6 * k : 6 * k + 6])
        for batch in step:
            assert int(batch["num_items_in_batch"]) == items == batch.loss_counts.num_items_in_batch
            assert batch.loss_counts.num_samples_in_batch == samples
    with pytest.raises(ValueError, match="pass micro_steps_per_step"):
        list(step_batches(batches))


def test_unknown_counts_are_an_error_never_a_per_pack_mean():
    data = _data(6)
    batch = pack_batch(data[:3])
    logits = torch.randn(1, batch["input_ids"].shape[1], 128)
    for mode in ("token", "sample"):
        with pytest.raises(ValueError, match="no count for mode=.*step_batches"):
            step_loss(logits, batch, mode=mode)
    with pytest.raises(ValueError, match="mode must be one of"):
        step_loss(logits, batch, mode="pack")
    with pytest.raises(ValueError, match="do not match the batch's"):
        step_loss(logits[:, 1:], batch)
    with pytest.raises(TypeError, match="PackedBatch"):
        step_loss(logits, dict(batch))


def test_a_wrapped_loader_without_label_counts_warns_once_unless_step_batches_counts():
    data = _data(24)
    sampler = _sampler(lengths_of(data, label=False))
    loader = _loader(sampler, data, 0)
    with pytest.warns(UserWarning, match="no label counts.*num_items_in_batch.*step_batches"):
        list(loader)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no label counts")
        list(loader)  # once per sampler
        counted = _sampler(lengths_of(data, label=False))
        list(step_batches(_loader(counted, data, 0)))


def test_label_counts_need_the_first_label_masked():
    data = _data(24)
    sampler = _sampler(lengths_of(data))
    loader = torch.utils.data.DataLoader(
        sampler.wrap(data), batch_sampler=sampler, collate_fn=PackCollator(PackOptions(mask_first_label=False))
    )
    with pytest.raises(ValueError, match="label counts need mask_first_label=True"):
        next(iter(loader))
