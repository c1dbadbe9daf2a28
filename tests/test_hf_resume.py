"""The Hugging Face Trainer recipe resumes mid-epoch exactly (real transformers Trainer and accelerate, CPU).

An uninterrupted run saves checkpoints after some optimizer steps; for each, a new model and a new Trainer
resume from it (the Trainer fast-forwards with accelerate's ``skip_first_batches``). The batches seen after
the resume must be exactly those the uninterrupted run saw after that step, and the final weights the same.
The planned epochs here hold different numbers of packs (26 or 28 micro-steps), the case the Trainer's
fixed-length epoch arithmetic gets wrong unless the recipe accounts for it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from omnibal_kernels.balance import PlanOptions  # noqa: E402
from omnibal_kernels.hf import SAMPLER_STATE_FILE, BalancedTrainerMixin  # noqa: E402
from omnibal_kernels.lengths import Lengths  # noqa: E402
from omnibal_kernels.packing import PackCollator  # noqa: E402
from omnibal_kernels.sampler import BalancedBatchSampler  # noqa: E402
from omnibal_kernels.testing.models import RecordingLM  # noqa: E402

NUM_SAMPLES = 120
EPOCHS = 3
ACCUMULATION = 2
OPTIONS = PlanOptions(vit_capacity=8, llm_capacity=160)


class BalancedTrainer(BalancedTrainerMixin, transformers.Trainer):
    pass


class SaveAt(transformers.TrainerCallback):
    """Saves a checkpoint after each of the given optimizer steps."""

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True
        return control


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # a tiny model: intra-op threads only add overhead (measured on 2 busy cores: 6.5 s of CPU time for one
    # run with 2 threads, 1.2 s with 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data() -> tuple[list[dict[str, Any]], Lengths]:
    rng = np.random.default_rng(0)
    llm = rng.integers(4, 60, NUM_SAMPLES)
    vit = rng.integers(0, 4, NUM_SAMPLES)
    data = [{"input_ids": rng.integers(0, 64, int(n)).tolist(), "sample_id": i} for i, n in enumerate(llm)]
    return data, Lengths(vit, llm)


def _train(
    output_dir: Path, seed: int, *, save_at: tuple[int, ...] = (), resume_from: Path | bool | None = None
) -> tuple[RecordingLM, Any]:
    data, lengths = _data()
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        num_train_epochs=EPOCHS,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-2,
        report_to=[],
        logging_strategy="no",
        use_cpu=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=seed,
        save_strategy="no",
        disable_tqdm=True,
    )
    model = RecordingLM(seed=0)
    # the ViT loads are made up (the samples carry no pixels), so the samples are not checked against them
    trainer = BalancedTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=PackCollator(),
        train_lengths=lengths,
        plan_options=OPTIONS,
        callbacks=[SaveAt(save_at)],
        check_loads=False,
    )
    trainer.train(resume_from_checkpoint=str(resume_from) if isinstance(resume_from, Path) else resume_from)
    return model, trainer


def _plans(seed: int) -> list[list[list[int]]]:
    sampler = BalancedBatchSampler(
        _data()[1], OPTIONS.replace(seed=seed), world_size=1, rank=0, micro_steps_per_step=ACCUMULATION
    )
    return [sampler.rank_batches(epoch=e) for e in range(EPOCHS + 1)]


# seed 13 plans epochs of 28, 26, 28 micro-steps (the Trainer's epochs: 14 optimizer steps); seed 8 of 26, 28,
# 26 (13 steps). Resume points: mid-epoch 0, an epoch boundary, inside and after a plan epoch of another length.
RESUME_AT = {13: (9, 14, 30), 8: (20, 33)}
PLAN_LENGTHS = {13: [28, 26, 28], 8: [26, 28, 26]}


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """seed -> (model, trainer, output dir) of an uninterrupted run that saved checkpoints at RESUME_AT."""
    runs: dict[int, Any] = {}
    for seed, steps in RESUME_AT.items():
        output_dir = tmp_path_factory.mktemp(f"full{seed}")
        model, trainer = _train(output_dir, seed, save_at=steps)
        runs[seed] = (model, trainer, output_dir)
    return runs


@pytest.mark.parametrize("seed", sorted(RESUME_AT))
def test_uninterrupted_run_takes_the_plans_back_to_back(full_runs: dict[int, Any], seed: int) -> None:
    plans = _plans(seed)
    assert [len(p) for p in plans[:EPOCHS]] == PLAN_LENGTHS[seed]
    model, trainer, _ = full_runs[seed]
    length = len(plans[0])  # every Trainer epoch has the length of plan epoch 0
    stream = [batch for plan in plans for batch in plan]
    assert model.seen == stream[: EPOCHS * length]
    assert trainer.state.global_step == EPOCHS * length // ACCUMULATION
    # every whole plan epoch seen gives each sample once, plus only the reuses its plan reports
    sampler = BalancedBatchSampler(
        _data()[1], OPTIONS.replace(seed=seed), world_size=1, rank=0, micro_steps_per_step=ACCUMULATION
    )
    start, whole = 0, 0
    for epoch, plan in enumerate(plans[:EPOCHS]):
        if start + len(plan) > len(model.seen):
            break
        counts = Counter(i for batch in model.seen[start : start + len(plan)] for i in batch)
        expected = Counter(range(NUM_SAMPLES)) + Counter(sampler.report(epoch).duplicated_samples.tolist())
        assert counts == expected, epoch
        start += len(plan)
        whole += 1
    assert whole >= 2


@pytest.mark.parametrize("seed, step", [(seed, step) for seed, steps in RESUME_AT.items() for step in steps])
def test_resume_gives_the_uninterrupted_batches(
    tmp_path: Path, full_runs: dict[int, Any], seed: int, step: int
) -> None:
    full, full_trainer, output_dir = full_runs[seed]
    checkpoint = output_dir / f"checkpoint-{step}"
    assert (checkpoint / SAMPLER_STATE_FILE).is_file()
    resumed, trainer = _train(tmp_path, seed, resume_from=checkpoint)  # a new model and Trainer

    assert resumed.seen == full.seen[step * ACCUMULATION :]  # nothing replayed, nothing skipped
    assert trainer.state.global_step == full_trainer.state.global_step
    full_params = full.state_dict()
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, full_params[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("resume_from", ["path", "latest"])
def test_resume_with_another_plan_is_an_error(full_runs: dict[int, Any], resume_from: str) -> None:
    # the checkpoints of seed 13 resumed with seed 8: the Trainer would skip into a different plan
    _, _, output_dir = full_runs[13]
    checkpoint = output_dir / "checkpoint-9" if resume_from == "path" else True
    with pytest.raises(
        ValueError,
        match=f"checkpoint-{9 if resume_from == 'path' else 30}/{SAMPLER_STATE_FILE}: "
        "the checkpoint was written by a run with other lengths or sampler options",
    ):
        _train(output_dir, 8, resume_from=checkpoint)
