"""Measured training speed-up: the tiny VLM trained with DDP over 2 CPU processes, balanced packs against random
padded batches, beside what a cost model calibrated in the same run predicts for every rank.

The workload, the turns the modes take and the fit are :mod:`omnibal_kernels.bench.training`'s. Here two ranks
(gloo, torch on one thread each) each hold three DDP replicas of the model (``random``, ``balanced``,
``calibration``: the same initial weights, a fused AdamW each) and train them in turn, one step at a time; the
batches are built before anything is timed, so a step is training only (collate speed is the ``collate``
provider's). A DDP communication hook runs the gradient all-reduce synchronously and times it on both clocks.

Clocks, per step and rank:

* ``busy`` (the robust clock): the rank's thread CPU time (``time.thread_time``) of forward, backward and
  optimizer step, minus its thread time inside the all-reduce. It does not count the time other processes hold
  the CPU, which on a shared 2-core machine is most of the wall time; it still moves with what their work does
  to the caches, which taking turns spreads over the three modes alike. On the CPU the autograd engine runs the
  backward, and the DDP hooks in it, on the calling thread, so the clock sees the step whole.
* ``busy_wall``: the same on the wall clock (``time.perf_counter``), the all-reduce excluded.
* ``step_wall``: the whole step on the wall clock, waiting for the other rank included: what a user sees; the
  wall epoch sums, over steps, the slower rank's step.

The report gives the speed-up on the robust clock (the headline ``speedup``), on the wall clock and as the
calibrated model predicts it, each rank's measured and predicted busy time, and the machine's load average
before and after (other processes' work inflates the wall clock, not the busy time).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ..packing import warmup
from ..testing.models import causal_lm_loss
from ..testing.processes import free_port
from ..testing.tiny_vlm import TinyVLM
from .runner import Config, register
from .training import FIELDS, MODES, Sizes, Workload, build_batches, padded_batch, run_schedule, summarize

__all__ = ["FULL", "QUICK", "padded_batch", "run"]

# 12 samples per micro-batch (about 870 tokens) at width 256, so that the matrix products, which the padded
# batches pay for their padding in, take most of a step rather than its thousands of operator calls (the fitted
# model in the report splits a step into its per-pack and per-token terms). Two calibration steps after every
# measured pair: the fit's six terms take more runs than a step's prediction, and a run on the shared machine
# varies by tens of percent. --quick trains the same shapes on fewer samples, one round.
FULL = Sizes(samples=1024, batch=12, hidden=256, layers=2, rounds=2, calibration_packs=64, calibration_steps=2)
QUICK = Sizes(samples=384, batch=12, hidden=256, layers=2, rounds=1, calibration_packs=32, calibration_steps=2)


def _timed_allreduce(state: dict[str, float], bucket):
    """DDP communication hook: a blocking all-reduce (mean), its wall and thread time added to ``state``.

    ``bucket`` is a ``dist.GradBucket`` and the result a ``Future[Tensor]``; they carry no annotations
    because DDP checks annotations by identity and this module's are strings.
    """
    buf = bucket.buffer()
    wall, cpu = time.perf_counter(), time.thread_time()
    dist.all_reduce(buf)
    state["thread"] += time.thread_time() - cpu
    state["wall"] += time.perf_counter() - wall
    buf.div_(dist.get_world_size())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


class _Replica:
    """One mode's DDP model, its optimizer and the all-reduce times of its current step."""

    def __init__(self, model: nn.Module) -> None:
        self.state = {"thread": 0.0, "wall": 0.0}
        self.model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        self.model.register_comm_hook(self.state, _timed_allreduce)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)

    def step(self, batch: Any) -> np.ndarray:
        """One training step; returns its times in the order of ``FIELDS``."""
        self.state["thread"] = self.state["wall"] = 0.0
        wall, cpu = time.perf_counter(), time.thread_time()
        causal_lm_loss(self.model(**batch), batch["labels"]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        return np.array([cpu - self.state["thread"], wall - self.state["wall"], self.state["wall"], wall])


def _worker(rank: int, port: int, sizes: Sizes, seed: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=sizes.world_size)
    try:
        torch.manual_seed(seed)
        model = TinyVLM(hidden=sizes.hidden, vit_hidden=sizes.hidden // 2, layers=sizes.layers)
        flops = model.cost_model()
        work = Workload.build(sizes, seed, flops)
        batches = build_batches(work, rank, seed)
        replicas = {m: _Replica(copy.deepcopy(model)) for m in MODES}

        def step(mode: str, r: int, pack: int) -> np.ndarray:
            mode_batches = batches[mode]
            return replicas[mode].step(mode_batches[pack if pack >= 0 else (-1 - pack) % len(mode_batches)])

        dist.barrier()
        load = [os.getloadavg()[0]]
        records = run_schedule(work, sizes, [rank], step, progress=None if rank == 0 else False)
        load.append(os.getloadavg()[0])
        gathered: list[Any] = [None] * sizes.world_size
        dist.all_gather_object(gathered, records)
        if rank == 0:
            merged = {k: np.concatenate([g[k] for g in gathered], axis=2) for k in records}
            result = summarize(work, merged, seed=seed, flops=flops)
            result.update(load_average=load, flops_model=flops.to_dict())
            with open(out_path, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


@register("ddp")
def run(config: Config) -> dict[str, Any]:
    """Trains the tiny VLM every way with DDP over 2 processes and returns ``measured_ddp``."""
    sizes = QUICK if config.quick else FULL
    warmup()  # the packing kernel, compiled once here and inherited by the ranks
    # fork where the platform has it: the ranks inherit the imported modules (seconds of start-up each on a
    # busy 2-core machine); every rank runs torch with one thread, so no OpenMP pool crosses the fork
    method = "fork" if "fork" in torch.multiprocessing.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ddp.json")
        torch.multiprocessing.start_processes(
            _worker,
            args=(free_port(), sizes, config.seed, out_path),
            nprocs=sizes.world_size,
            join=True,
            start_method=method,
        )
        with open(out_path) as f:
            result = json.load(f)
    result.update(
        world_size=sizes.world_size,
        threads_per_rank=1,
        batch_size=sizes.batch,
        hidden=sizes.hidden,
        layers=sizes.layers,
        rounds=sizes.rounds,
        cpu_count=os.cpu_count(),
        clock="thread CPU time, all-reduce excluded",
        fields=list(FIELDS),
        caveat="CPU processes at one thread each; a GPU's shapes and overheads differ "
        "(benchmarks/gpu_check.sh runs the same measurement on one)",
    )
    config.say(
        f"  busy per epoch (thread CPU time, slowest rank per step): random padded {result['random_s']:.2f} s, "
        f"balanced {result['balanced_s']:.2f} s: {result['speedup']:.2f}x tokens/s (calibrated model: "
        f"{result['speedup_predicted']:.2f}x; wall clock {result['speedup_wall']:.2f}x at load "
        f"{result['load_average'][0]:.1f})"
    )
    return {"measured_ddp": result}
