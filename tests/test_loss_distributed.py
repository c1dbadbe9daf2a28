"""The loss over an optimizer step under DDP, on real gloo process groups: exactly the global mean's gradient.

Each run starts 2 or 4 processes (one gloo rank each, one torch thread) that train tiny random transformers
models in float64 through the documented path: ``DataLoader(sampler.wrap(dataset), batch_sampler=sampler,
collate_fn=PackCollator.for_model(model))``, 2 micro-steps per optimizer step, ``(loss * world_size).backward()``
per micro-step under ``DistributedDataParallel`` (``no_sync`` but on the last micro-step). The gradients after
the first and the last optimizer step of the epoch (random packs: the last is ragged and reuses packs, so
some samples are trained twice; the balanced method would split packs into whole steps) must equal, within
1e-6 relative, those of the samples one at a time: every (sample, slot) of the step over all ranks and
micro-steps run alone, its summed token loss over the step's targets (token mean),
or its mean token loss over the step's samples with targets (sample mean), in float64.

Scenarios: text (Llama), InternVL-style tiles and Qwen2-VL-style patches; lengths with label counts (the counts
come from the plan: any collective call in the data path fails the run) and without them
(``step_batches`` counts with one all-reduce per step); the token mode through the model's own loss, the
sample mode through ``step_loss``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

pytest.importorskip("transformers")

from omnibal_kernels.testing.processes import free_port

MICRO_STEPS = 2
SEED = 3
RTOL = 1e-6
# capacities that give packs of about 3 samples, and the samples per rank in the data
CAPACITIES = {"llama": (0, 40), "internvl": (6, 60), "qwen2_vl": (40, 60)}
SAMPLES_PER_RANK = 10


def _setup(name: str, with_label: bool, world: int) -> tuple[list[dict], Any]:
    from omnibal_kernels.testing.hf_models import lengths_of, training_samples

    data = training_samples(name, SAMPLES_PER_RANK * world, seed=1, dtype=torch.float64)
    return data, lengths_of(data, label=with_label)


def _sampler(lengths: Any, name: str, **world: int) -> Any:
    from omnibal_kernels import BalancedBatchSampler, PlanOptions

    qv, qt = CAPACITIES[name]
    options = PlanOptions(vit_capacity=qv, llm_capacity=qt, seed=SEED, method="random")
    return BalancedBatchSampler(lengths, options, micro_steps_per_step=MICRO_STEPS, **world)


@contextlib.contextmanager
def _no_collectives():
    """Any Python-level collective call fails (DDP's own gradient reduction runs in C++ and is not affected)."""
    names = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast", "reduce")
    saved = {name: getattr(dist, name) for name in names}

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective was called in the data path")

    for name in names:
        setattr(dist, name, forbidden)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _steps(loader: Any, with_label: bool) -> list[list[Any]]:
    """The epoch's optimizer steps: with label counts straight from the loader (each batch knows its step's
    count), without them through step_batches (one all-reduce per step)."""
    from omnibal_kernels import step_batches

    if not with_label:
        return list(step_batches(loader))
    with _no_collectives():
        batches = list(loader)
    assert all("num_items_in_batch" in b for b in batches)
    return [batches[i : i + MICRO_STEPS] for i in range(0, len(batches), MICRO_STEPS)]


def _train_scenario(name: str, mode: str, with_label: bool, world: int) -> list[dict[str, torch.Tensor]]:
    from omnibal_kernels import PackCollator, step_loss
    from omnibal_kernels.testing.hf_models import tiny_model

    data, lengths = _setup(name, with_label, world)
    model = tiny_model(name, dtype=torch.float64)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    sampler = _sampler(lengths, name)  # world size and rank from the process group
    assert (sampler.world_size, sampler.rank) == (world, dist.get_rank())
    loader = torch.utils.data.DataLoader(
        sampler.wrap(data), batch_sampler=sampler, collate_fn=PackCollator.for_model(model, warmup=False)
    )
    steps = _steps(loader, with_label)
    grads = []
    for step in (steps[0], steps[-1]):
        model.zero_grad(set_to_none=True)
        for j, batch in enumerate(step):
            with ddp.no_sync() if j < len(step) - 1 else contextlib.nullcontext():
                out = ddp(**batch)
                loss = out.loss if mode == "token" else step_loss(out.logits, batch, mode="sample")
                (loss * world).backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return grads


def _worker(rank: int, world: int, port: int, out_dir: str, scenarios: list[tuple[str, str, bool]]) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {scenario: _train_scenario(*scenario, world) for scenario in scenarios}
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "grads.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _reference(name: str, mode: str, with_label: bool, world: int) -> tuple[list[dict[str, torch.Tensor]], int]:
    """The gradients of the first and last optimizer step from the samples one at a time, and how many slots
    of the last step repeat a sample."""
    from omnibal_kernels.testing.hf_models import alone, tiny_model

    data, lengths = _setup(name, with_label, world)
    model = tiny_model(name, dtype=torch.float64)
    ranks = [_sampler(lengths, name, world_size=world, rank=r).rank_batches() for r in range(world)]
    grads, repeated = [], 0
    for first in (0, len(ranks[0]) - MICRO_STEPS):
        ids = [i for batches in ranks for batch in batches[first : first + MICRO_STEPS] for i in batch]
        repeated = len(ids) - len(set(ids))
        model.zero_grad(set_to_none=True)
        terms = []
        for i in ids:
            inputs = {k: v for k, v in alone(data[i]).items() if k != "labels"}
            logits = model(**inputs).logits[0]
            labels = data[i]["labels"]
            targets = int((labels[1:] != -100).sum())
            terms.append((F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum"), targets))
        if mode == "token":
            loss = sum(ce for ce, _ in terms) / sum(n for _, n in terms)
        else:
            loss = sum(ce / n for ce, n in terms if n) / sum(n > 0 for _, n in terms)
        loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return grads, repeated


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _start(worker: Any, world: int, *args: Any) -> None:
    """``world`` processes running ``worker(rank, world, port, *args)``, forked where the platform can (they
    start with torch and the models' modules imported), each on one torch thread."""
    context = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with _one_thread():
        mp.start_processes(worker, args=(world, free_port(), *args), nprocs=world, start_method=context, join=True)


def _run(world: int, scenarios: list[tuple[str, str, bool]]) -> None:
    with _one_thread():
        references = {scenario: _reference(*scenario, world) for scenario in scenarios}
    with tempfile.TemporaryDirectory() as out_dir:
        _start(_worker, world, out_dir, scenarios)
        results = torch.load(os.path.join(out_dir, "grads.pt"), weights_only=False)
    repeated = 0
    for scenario in scenarios:
        want, repeats = references[scenario]
        repeated += repeats
        for got_step, want_step, which in zip(results[scenario], want, ("first", "last")):
            assert got_step.keys() == want_step.keys()
            for key, g in want_step.items():
                err = float((got_step[key] - g).norm() / g.norm().clamp_min(1e-300))
                assert err <= RTOL, (scenario, which, key, err)
    assert repeated > 0, "no last step reused packs: the ragged step is not covered"


# Few samples over the ranks: reused packs in the last step are part of what the global means must count.
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.DuplicatesWarning")
@pytest.mark.slow
def test_two_gloo_ranks_train_the_global_token_and_sample_means():
    _run(
        2,
        [
            ("llama", "token", True),
            ("llama", "sample", True),
            ("llama", "token", False),
            ("internvl", "token", True),
            ("internvl", "sample", False),
            ("qwen2_vl", "token", True),
            ("qwen2_vl", "sample", True),
            ("qwen2_vl", "token", False),
        ],
    )


# Few samples over the ranks: reused packs in the last step are part of what the global means must count.
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.DuplicatesWarning")
@pytest.mark.slow
def test_four_gloo_ranks_train_the_global_token_and_sample_means():
    _run(4, [("llama", "token", True), ("internvl", "sample", True), ("qwen2_vl", "token", False)])


def _trainer_grads(with_label: bool, world: int) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of the first optimizer step of the Trainer mixin, and the Trainer's gathers meanwhile."""
    import transformers

    from omnibal_kernels import PackCollator, PlanOptions
    from omnibal_kernels.hf import BalancedTrainerMixin
    from omnibal_kernels.testing.hf_models import tiny_model

    class Trainer(BalancedTrainerMixin, transformers.Trainer):
        pass

    class Capture(transformers.TrainerCallback):
        grads: dict[str, torch.Tensor] = {}

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            Capture.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    data, lengths = _setup("llama", with_label, world)
    model = tiny_model("llama", dtype=torch.float64)
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=1,
        gradient_accumulation_steps=MICRO_STEPS,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=SEED,
        disable_tqdm=True,
    )
    qv, qt = CAPACITIES["llama"]
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=PackCollator.for_model(model),
        train_lengths=lengths,
        plan_options=PlanOptions(vit_capacity=qv, llm_capacity=qt, method="random"),
        callbacks=[Capture()],
    )
    gathers = []
    gather = trainer.accelerator.gather
    trainer.accelerator.gather = lambda value: gathers.append(1) or gather(value)
    trainer.train()
    return Capture.grads, len(gathers)


def _trainer_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from accelerate.state import AcceleratorState

    # OMP_NUM_THREADS: else accelerate sets the threads per process from the cores
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    AcceleratorState._reset_state(True)  # a forked process starts with the parent's (single-process) state
    results = {with_label: _trainer_grads(with_label, world) for with_label in (True, False)}
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "trainer.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_trainer_mixin_on_two_gloo_ranks_trains_the_global_token_mean():
    """The Trainer's first optimizer step equals the samples one at a time; with label counts in the lengths the
    count comes from the plan (the Trainer gathers nothing), without them from the Trainer's gather."""
    pytest.importorskip("accelerate")
    world = 2
    with _one_thread():
        want, _ = _reference("llama", "token", True, world)
    with tempfile.TemporaryDirectory() as out_dir:
        _start(_trainer_worker, world, out_dir)
        results = torch.load(os.path.join(out_dir, "trainer.pt"), weights_only=False)
    for with_label, (got, gathers) in results.items():
        assert (gathers == 0) == with_label, (with_label, gathers)
        assert got.keys() == want[0].keys()
        for key, g in want[0].items():
            err = float((got[key] - g).norm() / g.norm())
            assert err <= RTOL, (with_label, key, err)
