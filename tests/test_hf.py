"""The Hugging Face Trainer recipe: balanced packs per micro-step, re-planned every epoch (needs transformers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from omnibal_kernels.balance import PlanOptions  # noqa: E402
from omnibal_kernels.hf import BalancedTrainerMixin  # noqa: E402
from omnibal_kernels.lengths import Lengths  # noqa: E402
from omnibal_kernels.packing import PackCollator  # noqa: E402
from omnibal_kernels.sampler import BalancedBatchSampler  # noqa: E402
from omnibal_kernels.testing.models import RecordingLM  # noqa: E402


class BalancedTrainer(BalancedTrainerMixin, transformers.Trainer):
    pass


@pytest.mark.slow
def test_trainer_recipe(tmp_path):
    rng = np.random.default_rng(0)
    llm = rng.integers(4, 60, 120)
    vit = rng.integers(0, 4, 120)
    data = [{"input_ids": torch.randint(0, 64, (int(n),)), "sample_id": i} for i, n in enumerate(llm)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=13,  # a seed whose plan epoch 1 is shorter than epoch 0 (asserted below)
    )
    model = RecordingLM()
    options = PlanOptions(vit_capacity=8, llm_capacity=160)
    # the ViT loads are made up (the samples carry no pixels), so the samples are not checked against them
    trainer = BalancedTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=PackCollator(),
        train_lengths=Lengths(vit, llm),
        plan_options=options,
        check_loads=False,
    )
    trainer.train()

    reference = BalancedBatchSampler(
        Lengths(vit, llm), options.replace(seed=13), world_size=1, rank=0, micro_steps_per_step=2
    )
    plans = [reference.rank_batches(epoch=e) for e in range(3)]
    assert len(plans[0]) > len(plans[1])
    # the Trainer's epochs have the length of plan epoch 0 and run over the plans back to back: epoch 1 ends
    # in plan epoch 2, nothing of plan epoch 1 is lost or repeated
    expected = (plans[0] + plans[1] + plans[2])[: 2 * len(plans[0])]
    assert model.seen == expected  # every micro-step one balanced pack; every epoch re-planned
    assert trainer.state.global_step == len(expected) // 2
