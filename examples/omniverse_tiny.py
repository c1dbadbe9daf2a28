"""Data, model and memory balance measured at tiny scale: a tiny VLM on 4 gloo processes (2 pipeline stages x 2
data-parallel pipelines, torch.distributed.pipelining, 1F1B), every configuration of ``omniverse`` trained for
one epoch of a fixed sample set and timed beside the prediction.

    python examples/omniverse_tiny.py [--json]

1. A fixed set of bundled-like samples scaled by 1/16 (``testing.tiny_vlm.scaled_lengths``) and a tiny VLM wide
   enough that its CPU time follows its FLOPs more than its per-operation overheads (``SIZES``).
2. The 4 processes start; each measures the model layer by layer (``measure_profile``: CPU time of its one
   torch thread, ``time.thread_time``, plain and under ``torch.utils.checkpoint`` as the recomputed layers
   train, saved bytes) on a
   reference micro-batch near the mean and on one of twice its samples, no more processes at once than there
   are cores, as they will train (4.); rank 0 takes each layer's median,
   fits the part of each layer's time that does not grow with the micro-batch (``affine_profile``: the
   per-call cost of its operations, which a CPU pays whatever the micro-batch), and gives the profile of the
   reference to the entry point
   (``omniverse`` with the measured profile, the model's cost model and the reference loads), which plans the
   random padded micro-batches (4 samples each) and the balanced packs of the sample set, searches the splits
   and recompute plans under a memory budget (90% of what the uniform split needs without recomputation on the
   padded micro-batches) and predicts each configuration's step and epoch.
3. Every configuration is trained: each pipeline's two stages are ``PipelineStage`` s of the planned split with
   the planned layers recomputed (``apply_recompute``), gradients averaged over the two pipelines, SGD; step k
   of every configuration runs before step k + 1 of any, so all of them meet the same load. A micro-batch is
   one row of segments, one per sample (a padded micro-batch's samples each padded to its longest, a pack's as
   they are), attended within each segment through ``cu_seqlens``. Micro-batches differ in size and a pipeline
   sends fixed-shape tensors, so every stage sends and receives its micro-batch padded to the run's largest
   and computes on the micro-batch's own extent (its tiles, tokens and segments ride along in a small float
   tensor).
4. Each stage times every forward and backward it runs (CPU time of its process's one torch thread, so
   neither the processes sharing the cores nor the process's own communication threads, a device's copy
   engines, enter it; freed memory is reused, as a device's caching allocator reuses it, instead of being
   handed back and faulted in again), no more of them at once than there are cores (a process
   switched out for another pays for the caches the other filled, which a rank's own device never does), the
   garbage collector held off; every step runs three times, each operation timed as its median (the model
   updated after the last). The measured step is the one these operation times give in
   the schedule's order and dependencies (the 1F1B order torch ran, replayed by ``pipeline.simulate``): the
   wall clock of 4 processes on 2 shared cores says nothing. The predicted step is the entry point's, from the
   profile scaled per micro-batch, with exactly the layers that were trained recomputed
   (``evaluate_partition`` given them): the profiles measured again after every round of steps, on the same
   reference micro-batches and in the same way (``predicted_step_seconds``; ``planned_step_seconds`` is the
   prediction the plan was made with, from the profile measured before the training, which the machine's
   speed can have drifted from). The losses of configurations that share their data are equal: the split
   and the recomputation change the schedule, not the numbers.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import pickle
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from omnibal_kernels.omniverse import (
    Hardware,
    Layout,
    affine_profile,
    micro_batch_scales,
    omniverse,
    padded_micro_batches,
)
from omnibal_kernels.omniverse.epoch import epoch_times
from omnibal_kernels.omniverse.run import scaled_profile
from omnibal_kernels.pipeline import (
    ModelProfile,
    apply_recompute,
    evaluate_partition,
    measure_profile,
    simulate,
    stage_kind_times,
    uniform_stages,
)
from omnibal_kernels.testing.models import causal_lm_loss
from omnibal_kernels.testing.processes import free_port
from omnibal_kernels.testing.tiny_vlm import IMAGE_TOKEN, PATCHES, TinyVLM, make_sample, scaled_lengths

SIZES = {"hidden": 256, "vit_hidden": 192, "vit_layers": 4, "llm_layers": 4}
PP, DP = 2, 2
MICRO_BATCHES = 4
BATCH_SIZE = 4
SAMPLES = 96
SEED = 0
LR = 0.05
# runs of every step, each operation timed as the median of them: a pause of the machine that hits one run is not
# the configuration's (the profile takes each layer's median over its repeats the same way)
TIMED_RUNS = 3
# samples of the micro-batches the profile is measured on: the first is the reference the entry point scales
# from; the other, of twice its load, shows which part of each layer's time does not grow with the micro-batch
# (the per-call cost of its operations, which a CPU pays for every layer whatever the micro-batch)
REFERENCE_SIZES = (BATCH_SIZE, 2 * BATCH_SIZE)
META = 40  # tiles, rows, length, samples, then the samples' cu_seqlens (room for 35 samples)


# --- the model as a chain whose layers carry the micro-batch's extent ----------------------------------------


def _cu(meta: torch.Tensor) -> tuple[Any, Any]:
    n = int(meta[3].item())
    if n < 1:
        return None, None
    cu = meta[4 : 5 + n].to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max().item())


class Embed(nn.Module):
    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.patch_embed, self.vit_pos = model.patch_embed, model.vit_pos

    def forward(self, ids: torch.Tensor, pix: torch.Tensor, meta: torch.Tensor) -> tuple:
        patches = self.patch_embed(pix).flatten(2).transpose(1, 2) + self.vit_pos
        return patches.reshape(-1, patches.shape[-1]), ids.to(patches.dtype), meta


class ViT(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor, ids: torch.Tensor, meta: torch.Tensor) -> tuple:
        if h.shape[0] == 0:  # a micro-batch of text only
            return h, ids.clone(), meta
        cu = torch.arange(h.shape[0] // PATCHES + 1, dtype=torch.int32) * PATCHES
        return self.block(h, cu), ids.clone(), meta


class Merge(nn.Module):
    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.projector, self.embed = model.projector, model.embed

    def forward(self, h: torch.Tensor, ids: torch.Tensor, meta: torch.Tensor) -> tuple:
        input_ids = ids.long()
        x = self.embed(input_ids)
        where = (input_ids == IMAGE_TOKEN).nonzero(as_tuple=True)
        return x.index_put(where, self.projector(h).to(x.dtype)), meta


class LLM(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor, meta: torch.Tensor) -> tuple:
        cu, longest = _cu(meta)
        if cu is None:
            positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        else:
            lengths = (cu[1:] - cu[:-1]).long()
            positions = (torch.arange(x.shape[1]) - torch.repeat_interleave(cu[:-1].long(), lengths))[None]
        return self.block(x, positions, cu, longest, "auto"), meta


class Head(nn.Module):
    def __init__(self, model: TinyVLM) -> None:
        super().__init__()
        self.norm, self.lm_head = model.norm, model.lm_head

    def forward(self, x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def build_chain() -> tuple[TinyVLM, nn.Sequential, list[str]]:
    torch.manual_seed(SEED)
    model = TinyVLM(**SIZES)
    layers: list[tuple[str, nn.Module]] = [("vit_embed", Embed(model))]
    layers += [(f"vit_{i}", ViT(b)) for i, b in enumerate(model.vit_blocks)]
    layers += [("projector", Merge(model))]
    layers += [(f"llm_{i}", LLM(b)) for i, b in enumerate(model.blocks)]
    layers += [("head", Head(model))]
    chain = nn.Sequential(OrderedDict(layers))
    return model, chain, [name.split("_")[0] for name, _ in layers]


# --- micro-batches: real extent, padded to the run's largest for the pipeline's fixed-shape sends ---------------


def micro_batch(lengths: Any, ids: np.ndarray, padded: bool) -> dict[str, torch.Tensor]:
    """Samples ``ids`` as one row of segments, one per sample (``cu_seqlens`` in ``meta``): each sample padded
    to the longest of them (``padded``, what a padding collator trains: every sample costs the longest one's
    tokens) or as it is (a pack). The first token of every segment has no target, so no sample learns from
    the one before it."""
    samples = [make_sample(lengths, int(i), SEED) for i in ids]
    pixels = torch.cat([s["pixel_values"] for s in samples])
    size = max(s["input_ids"].numel() for s in samples) if padded else 0
    input_ids = torch.cat([F.pad(s["input_ids"], (0, max(size - s["input_ids"].numel(), 0))) for s in samples])[None]
    labels = [F.pad(s["labels"], (0, max(size - s["labels"].numel(), 0)), value=-100) for s in samples]
    for row in labels:
        row[0] = -100
    cu = np.concatenate([[0], np.cumsum([row.numel() for row in labels])])
    if len(samples) + 5 > META:
        raise ValueError(f"a micro-batch of {len(samples)} samples does not fit META = {META}")
    meta = torch.zeros(META)
    meta[0], meta[1], meta[2], meta[3] = pixels.shape[0], 1, input_ids.shape[1], len(samples)
    meta[4 : 5 + len(samples)] = torch.tensor(cu, dtype=torch.float32)
    return {"input_ids": input_ids, "labels": torch.cat(labels)[None], "pixel_values": pixels, "meta": meta}


def pad_to(batch: dict[str, torch.Tensor], rows: int, length: int, tiles: int) -> dict[str, torch.Tensor]:
    r, s = batch["input_ids"].shape
    t = batch["pixel_values"].shape[0]
    return {
        "input_ids": F.pad(batch["input_ids"], (0, length - s, 0, rows - r)),
        "labels": F.pad(batch["labels"], (0, length - s, 0, rows - r), value=-100),
        "pixel_values": F.pad(batch["pixel_values"], (0, 0, 0, 0, 0, 0, 0, tiles - t)),
        "meta": batch["meta"],
    }


class Stage(nn.Module):
    """Layers ``first..last`` of the chain on a micro-batch padded to ``(rows, length, tiles)``: inputs cut to
    the micro-batch's extent, outputs padded back."""

    def __init__(self, chain: nn.Sequential, first: int, last: int, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.layers = nn.Sequential(OrderedDict(list(chain.named_children())[first : last + 1]))
        self.rows, self.length, self.tiles = shape

    def forward(self, *xs: torch.Tensor) -> Any:
        meta = xs[-1]
        t, r, s = (int(v) for v in meta[:3].tolist())
        cut = []
        for x in xs[:-1]:
            if x.dim() == 4:  # pixel values
                cut.append(x[:t])
            elif x.dim() == 2 and x.shape[0] == self.tiles * PATCHES:  # patches (rows are fewer than a tile's)
                cut.append(x[: t * PATCHES])
            else:  # token ids or hidden states, (rows, length, ...)
                cut.append(x[:r, :s])
        y: Any = tuple(cut) + (meta,)
        for layer in self.layers:
            y = layer(*y) if isinstance(y, tuple) else layer(y)
        outs = y if isinstance(y, tuple) else (y,)
        padded = []
        for o in outs:
            if o is meta:
                padded.append(o)
            elif o.dim() == 2 and o.shape[0] == t * PATCHES and o.shape[0] != r:
                padded.append(F.pad(o, (0, 0, 0, (self.tiles - t) * PATCHES)))
            elif o.dim() == 2:
                padded.append(F.pad(o, (0, self.length - s, 0, self.rows - r)))
            else:
                padded.append(F.pad(o, (0, 0, 0, self.length - s, 0, self.rows - r)))
        return tuple(padded) if len(padded) > 1 else padded[0]


def stacked(lengths: Any, data: Any, padded: bool) -> tuple[list[list[dict[str, torch.Tensor]]], tuple[int, int, int]]:
    """Per optimizer step and pipeline, its micro-batches stacked along dim 0, padded to one shape."""
    batches = {p: micro_batch(lengths, data.samples_of(p), padded) for p in range(data.num_micro_batches)}
    shape = (
        max(b["input_ids"].shape[0] for b in batches.values()),
        max(b["input_ids"].shape[1] for b in batches.values()),
        max(max(b["pixel_values"].shape[0] for b in batches.values()), 1),
    )
    steps = []
    for k in range(data.num_steps):
        pipes = []
        for r in range(DP):
            rows = [pad_to(batches[int(p)], *shape) for p in data.steps[k, r] if p >= 0]
            pipes.append({key: torch.cat([row[key] for row in rows]) for key in rows[0]} | {"m": len(rows)})
        steps.append(pipes)
    return steps, shape


class _Timed:
    """Mixed into a PipelineStage: the CPU time of every forward and backward it runs, each run while holding
    one of the ``cores`` slots, so that no more operations compute at once than there are cores: a process
    that shares its core with another is switched out and back and pays for the caches the other one filled,
    which no device of a pipeline rank pays (the waits for a slot are not in the times)."""

    ops: list
    cores: Any

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with self.cores:
            t0 = time.thread_time()
            out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)  # type: ignore[misc]
            self.ops.append(("F", fwd_chunk_id, (time.thread_time() - t0) * 1e3))
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with self.cores:
            t0 = time.thread_time()
            out = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)  # type: ignore[misc]
            self.ops.append(("B", bwd_chunk_id, (time.thread_time() - t0) * 1e3))
        return out


def _examples(chain: nn.Sequential, job: dict[str, Any], batch: dict[str, torch.Tensor]) -> list[tuple[tuple, tuple]]:
    """(inputs, outputs) of every stage on the first micro-batch of ``batch``, for the stages' static shapes."""
    rows, _, tiles = job["shape"]
    x: Any = (batch["input_ids"][:rows], batch["pixel_values"][:tiles], batch["meta"][:META])
    out = []
    with torch.no_grad():
        for first, last in job["stages"]:
            y = Stage(chain, first, last, job["shape"])(*x)
            y = y if isinstance(y, tuple) else (y,)
            out.append((x, y))
            x = y
    grads = [t.is_floating_point() and t.dim() > 1 for t in out[0][1]]
    fix = [
        (tuple(t.detach() for t in i), tuple(t.detach().requires_grad_(g) for t, g in zip(o, grads))) for i, o in out
    ]
    if len(fix) > 1:  # the later stage's inputs are the earlier one's outputs
        fix[1] = (tuple(t.detach().requires_grad_(g) for t, g in zip(fix[1][0], grads)), fix[1][1])
    return fix


class _Job:
    """One configuration on one rank: its stage module, optimizer, schedules (one per micro-batch count)."""

    def __init__(self, rank: int, job: dict[str, Any], groups: dict[str, Any], cores: Any) -> None:
        import torch.distributed.pipelining as pipelining

        self.pipe, self.s = divmod(rank, PP)
        self.job, self.groups, self.cores = job, groups, cores
        _, chain, _ = build_chain()
        first, last = job["stages"][self.s]
        self.module = Stage(chain, first, last, job["shape"])
        apply_recompute(self.module.layers, job["recompute"][self.s])
        self.examples = _examples(chain, job, job["steps"][0][self.pipe])
        self.timed = type("TimedStage", (_Timed, pipelining.PipelineStage), {})
        self.schedules: dict[int, Any] = {}
        self.opt = torch.optim.SGD(self.module.parameters(), lr=LR)
        self.out: dict[str, Any] = {"steps": [], "losses": []}
        self.pending: list[tuple[np.ndarray, float]] = []

    def _schedule(self, m: int) -> Any:
        import torch.distributed.pipelining as pipelining

        if m not in self.schedules:
            inputs, outputs = self.examples[self.s]
            stage = self.timed(
                self.module,
                self.s,
                PP,
                torch.device("cpu"),
                input_args=inputs,
                output_args=outputs,
                group=self.groups["pp"],
            )
            stage.ops, stage.cores = [], self.cores
            self.schedules[m] = (stage, pipelining.Schedule1F1B(stage, n_microbatches=m, loss_fn=causal_lm_loss))
        return self.schedules[m]

    def step(self, k: int, update: bool = True, timed: bool = True) -> None:
        """Step ``k``'s micro-batches forward and backward; ``update``: the optimizer step (else the gradients
        are dropped and the model is unchanged) and the step's record: each operation's time the median over
        the ``timed`` runs since the last update."""
        batch = self.job["steps"][k][self.pipe]
        stage, sched = self._schedule(batch["m"])
        stage.ops.clear()
        losses: list = []
        s = self.s
        args = (batch["input_ids"], batch["pixel_values"], batch["meta"]) if s == 0 else ()
        kwargs = {"target": batch["labels"], "losses": losses} if s == PP - 1 else {}
        # the collector runs between steps, not inside a timed operation
        gc.collect()
        gc.disable()
        dist.barrier()
        c0 = time.thread_time()
        sched.step(*args, **kwargs)
        busy = (time.thread_time() - c0) * 1e3
        gc.enable()
        for p in self.module.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.groups["dp"])
            p.grad /= DP
        if update:
            self.opt.step()
        self.opt.zero_grad()
        loss = torch.stack(losses).mean() if losses else torch.zeros(())
        dist.all_reduce(loss, group=self.groups["dp"])
        if timed:
            ops = np.zeros((2, batch["m"]))
            for kind, chunk, ms in stage.ops:
                ops[int(kind == "B"), chunk] += ms
            self.pending.append((ops, busy))
        if not update:
            return
        self.out["losses"].append(float(loss) / DP)
        ops = np.median([o for o, _ in self.pending], axis=0)
        busy = float(np.median([b for _, b in self.pending]))
        self.pending.clear()
        self.out["steps"].append({"forward_ms": ops[0].tolist(), "backward_ms": ops[1].tolist(), "busy_ms": busy})


@functools.lru_cache(maxsize=1)
def _reference() -> tuple[nn.Sequential, list[str], list[tuple[torch.Tensor, ...]]]:
    """The chain the profile is measured on and its reference micro-batches (``REFERENCE_SIZES`` samples), one
    per process: every profile after the first meets a model as warm as the trained ones."""
    lengths = scaled_lengths(SAMPLES, SEED)
    _, chain, kinds = build_chain()
    refs = [micro_batch(lengths, reference_samples(lengths, n), padded=False) for n in REFERENCE_SIZES]
    return chain, kinds, [(ref["input_ids"], ref["pixel_values"], ref["meta"]) for ref in refs]


def _profile(repeats: int, cores: Any) -> list[Any]:
    """This process's profiles of the model on the reference micro-batches, measured as the training is timed
    (holding one of the ``cores`` slots, the collector held off)."""
    chain, kinds, inputs = _reference()
    gc.collect()
    gc.disable()
    try:
        out = []
        for x in inputs:
            with cores:
                out.append(measure_profile(chain, x, kinds=kinds, repeats=repeats, timer=time.thread_time))
        return out
    finally:
        gc.enable()


def _median_profile(profiles: list[Any]) -> Any:
    """Every rank's profile, each layer's times (forward, backward and what recomputing it adds to each) the
    median over the ranks (the bytes are the same)."""
    layers = []
    for i, layer in enumerate(profiles[0].layers):
        keys = ["forward_ms", "backward_ms", "checkpoint_forward_ms"]
        if all(p.layers[i].recompute_ms is not None for p in profiles):
            keys.append("recompute_ms")
        times = {key: float(np.median([getattr(p.layers[i], key) for p in profiles])) for key in keys}
        layers.append(replace(layer, **times))
    return ModelProfile(tuple(layers), input_bytes=profiles[0].input_bytes, meta=dict(profiles[0].meta))


def _fitted_profile(measured: list[list[Any]]) -> Any:
    """The profile of the first reference micro-batch from every process's profiles of every reference (each
    layer's median over the processes), with each layer's fixed times fitted over the references."""
    lengths = scaled_lengths(SAMPLES, SEED)
    refs = [reference_samples(lengths, n) for n in REFERENCE_SIZES]
    medians = [_median_profile([own[i] for own in measured]) for i in range(len(REFERENCE_SIZES))]
    return affine_profile(medians, [(lengths.vit[r], lengths.llm[r]) for r in refs], _cost_model())


def _jobs(lengths: Any, result: Any, names: list[str]) -> list[dict[str, Any]]:
    data = {name: stacked(lengths, mb, name == "padded") for name, mb in result.micro_batches.items()}
    jobs: dict[str, dict[str, Any]] = {}
    for c in result.configurations:
        recompute = [[names[j] for j in stage] for stage in c.recomputed]
        jobs.setdefault(
            _key(c),
            {
                "key": _key(c),
                "stages": c.stages,
                "recompute": recompute,
                "steps": data[c.data][0],
                "shape": data[c.data][1],
            },
        )
    return list(jobs.values())


def _key(c: Any) -> str:
    return str((c.data, c.stages, c.recomputed))


def _reuse_freed_memory() -> None:
    """Keeps glibc from handing large freed blocks back to the kernel, so that an operation's tensors reuse
    memory the process already touched, as a device's caching allocator does: otherwise every activation kept
    across micro-batches comes from fresh pages, and the page faults land in the operations that keep the most
    (the ones without recomputation), which the profile, freeing each layer's tensors as it goes, never meets."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):  # not glibc
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # blocks up to this size come from the heap, not their own mapping
    libc.mallopt(m_trim_threshold, 1 << 30)  # freed heap memory stays with the process
    libc.mallopt(m_top_pad, 256 << 20)  # the heap grows in large steps


def _worker(rank: int, port: int, repeats: int, out_dir: str, cores: Any) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    _reuse_freed_memory()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=PP * DP)
    try:
        pps = [dist.new_group(list(range(p * PP, (p + 1) * PP))) for p in range(DP)]
        dps = [dist.new_group(list(range(s, PP * DP, PP))) for s in range(PP)]
        groups = {"pp": pps[rank // PP], "dp": dps[rank % PP]}
        # the ranks profile as they train: no more at once than there are cores
        profiles: list[Any] = [None] * (PP * DP)
        dist.all_gather_object(profiles, _profile(repeats, cores))
        shared: list[Any] = [None]
        if rank == 0:
            lengths, result, profile = plan(_fitted_profile(profiles))
            with open(os.path.join(out_dir, "plan.pkl"), "wb") as f:
                pickle.dump((lengths, result, profile), f)
            shared = [_jobs(lengths, result, profile.names)]
        dist.broadcast_object_list(shared, src=0)
        runs = [_Job(rank, job, groups, cores) for job in shared[0]]
        for run_ in runs:
            run_.step(0, update=False, timed=False)
        # every run of step k of every configuration before step k + 1 of any, so all of them meet the same load;
        # the profiles measured again after each round, so that they meet the machine the training met
        alongside: list[Any] = []
        for k in range(max(len(job["steps"]) for job in shared[0])):
            for i in range(TIMED_RUNS):
                for run_ in runs[k % len(runs) :] + runs[: k % len(runs)]:
                    if k < len(run_.job["steps"]):
                        run_.step(k, update=i == TIMED_RUNS - 1)
                alongside.append(_profile(1, cores))
        gathered: list[Any] = [None] * (PP * DP)
        dist.all_gather_object(gathered, alongside)
        if rank == 0:
            with open(os.path.join(out_dir, "alongside.pkl"), "wb") as f:
                pickle.dump(_fitted_profile([p for own in gathered for p in own]), f)
        torch.save({run_.job["key"]: run_.out for run_ in runs}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def reference_samples(lengths: Any, size: int = BATCH_SIZE) -> np.ndarray:
    """``size`` consecutive samples whose tiles and tokens are closest to those of a mean micro-batch of that
    many samples: a micro-batch the profile is measured on, where the micro-batches are."""
    n = len(lengths) - size + 1
    tiles = np.convolve(lengths.vit, np.ones(size), "valid")[:n] / (size * lengths.vit.mean())
    tokens = np.convolve(lengths.llm, np.ones(size), "valid")[:n] / (size * lengths.llm.mean())
    first = int(np.argmin((tiles - 1) ** 2 + (tokens - 1) ** 2))
    return np.arange(first, first + size)


def plan(profile: Any) -> tuple[Any, Any, Any]:
    """The sample set, the entry point's result for the measured ``profile``, and the profile."""
    lengths = scaled_lengths(SAMPLES, SEED)
    model = build_chain()[0]
    ref_ids = reference_samples(lengths)
    reference = (lengths.vit[ref_ids], lengths.llm[ref_ids])
    cost = model.cost_model()
    padded = padded_micro_batches(lengths, dp=DP, micro_batches=MICRO_BATCHES, batch_size=BATCH_SIZE, seed=SEED)
    need = evaluate_partition(
        scaled_profile(profile, reference, padded, cost),
        uniform_stages(len(profile), PP),
        micro_batches=MICRO_BATCHES,
        recompute="none",
    )
    # memory must be balanced by recomputing: below what the uniform split needs without it
    layout = Layout(
        gpus=PP * DP, pp=PP, tp=1, micro_batches=MICRO_BATCHES, memory_gb=0.9 * max(need.memory_bytes) / 2**30
    )
    result = omniverse(
        profile,
        layout,
        lengths,
        cost_model=cost,
        reference=reference,
        batch_size=BATCH_SIZE,
        hardware=Hardware(link_gb_per_s=0.0),
        seed=SEED,
    )
    return lengths, result, profile


def run(repeats: int = 3) -> dict[str, Any]:
    """Profiles, plans and trains every configuration on 4 processes; returns measured beside predicted."""
    start = time.perf_counter()
    # as many operations at once as there are cores (and as the profile is measured with, PP at a time)
    cores = mp.get_context("spawn").BoundedSemaphore(min(PP, len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(free_port(), repeats, out_dir, cores), nprocs=PP * DP, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + 300
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError("workers did not finish within 300 s")
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(PP * DP)]
        with open(os.path.join(out_dir, "plan.pkl"), "rb") as f:
            lengths, result, planned = pickle.load(f)
        with open(os.path.join(out_dir, "alongside.pkl"), "rb") as f:
            profile = pickle.load(f)
    rows = []
    for c in result.configurations:
        measured = _measured_steps([r[_key(c)] for r in ranks])
        priced = _predicted_plan(result, profile, lengths, c)
        data = result.micro_batches[c.data]
        predicted = _predicted_steps(priced, data)
        rows.append(
            {
                "name": c.name,
                "data": c.data,
                "split": c.split,
                "recompute": c.recompute,
                "stages": [list(x) for x in c.stages],
                "recomputed": [len(x) for x in c.recomputed],
                "measured_step_seconds": float(np.mean(measured)) / 1e3,
                "predicted_step_seconds": float(np.mean(predicted)) / 1e3,
                "planned_step_seconds": c.step_seconds,
                "measured_epoch_seconds": float(np.sum(measured)) / 1e3,
                "predicted_epoch_seconds": float(np.sum(predicted)) / 1e3,
                "measured_steps_ms": measured,
                "predicted_steps_ms": predicted.tolist(),
                "busy_ms": [[s["busy_ms"] for s in r[_key(c)]["steps"]] for r in ranks],
                "stage_ms": _stage_ms([r[_key(c)] for r in ranks], _predicted_ops(priced, data)),
                "loss": ranks[PP - 1][_key(c)]["losses"],
            }
        )
    return {
        "samples": SAMPLES,
        "sizes": SIZES,
        "memory_gb": result.layout.memory_gb,
        "profile": profile.to_dict(),
        "configurations": rows,
        "seconds": time.perf_counter() - start,
    }


def _predicted_plan(result: Any, profile: Any, lengths: Any, c: Any) -> tuple[Any, Any, Any]:
    """Configuration ``c`` as the entry point prices it on ``profile``: the profile scaled to its data, its
    split with exactly the layers that were trained recomputed, and every micro-batch's scale per layer kind."""
    data = result.micro_batches[c.data]
    ref_ids = reference_samples(lengths)
    cost = _cost_model()
    scaled = scaled_profile(profile, (lengths.vit[ref_ids], lengths.llm[ref_ids]), data, cost)
    layout = result.layout
    plan_ = evaluate_partition(
        scaled,
        c.stages,
        micro_batches=layout.micro_batches,
        memory_bytes=layout.memory_bytes,
        schedule=layout.schedule,
        recompute=c.recomputed,
        link_gb_per_s=result.hardware.link_gb_per_s,
    )
    return plan_, scaled, micro_batch_scales(data, cost)


def _predicted_steps(priced: tuple[Any, Any, Any], data: Any) -> np.ndarray:
    """Every optimizer step of a configuration as the entry point predicts it (``compose``: its split and
    trained recompute choice evaluated on the profile scaled to its ``data``, ``priced`` by
    :func:`_predicted_plan`, its epoch simulated micro-batch by micro-batch)."""
    plan_, scaled, scales = priced
    return epoch_times(plan_, scaled, data, scales).step_ms


def _predicted_ops(priced: tuple[Any, Any, Any], data: Any) -> tuple[np.ndarray, np.ndarray]:
    """(steps, pipelines, micro-batches, stages) forward and backward ms the entry point predicts for a
    configuration ``priced`` by :func:`_predicted_plan` on its ``data``."""
    plan_, scaled, scales = priced
    kind_times = stage_kind_times(plan_, scaled)
    fwd = np.full((*data.steps.shape, PP), np.nan)
    bwd = np.full((*data.steps.shape, PP), np.nan)
    for k in range(data.num_steps):
        for r in range(DP):
            ids = data.steps[k, r][data.steps[k, r] >= 0]
            t = kind_times.times({kind: v[ids] for kind, v in scales.items()})
            fwd[k, r, : ids.size], bwd[k, r, : ids.size] = t.forward_ms, t.backward_ms
    return fwd, bwd


@functools.lru_cache(maxsize=1)
def _cost_model() -> Any:
    """The tiny VLM's cost model from its shapes (the one the entry point was given)."""
    return build_chain()[0].cost_model()


def _stage_ms(ranks: list[dict[str, Any]], predicted: tuple[np.ndarray, np.ndarray]) -> dict[str, list[float]]:
    """Mean forward and backward ms per stage, measured and predicted."""
    out: dict[str, list[float]] = {}
    for i, kind in enumerate(("forward_ms", "backward_ms")):
        measured = [
            np.mean([x for r in range(DP) for st in ranks[r * PP + s]["steps"] for x in st[kind]]) for s in range(PP)
        ]
        out[f"measured_{kind}"] = [float(x) for x in measured]
        out[f"predicted_{kind}"] = [float(np.nanmean(predicted[i][..., s])) for s in range(PP)]
    return out


def _measured_steps(ranks: list[dict[str, Any]]) -> list[float]:
    """Each optimizer step from the operation times measured on every rank, in 1F1B order: its slowest pipeline."""
    out = []
    for k in range(len(ranks[0]["steps"])):
        slowest = 0.0
        for pipe in range(DP):
            own = [ranks[pipe * PP + s]["steps"][k] for s in range(PP)]
            fwd = np.array([o["forward_ms"] for o in own]).T
            bwd = np.array([o["backward_ms"] for o in own]).T
            slowest = max(slowest, simulate(fwd, bwd, fwd.shape[0], schedule="1f1b").step_ms)
        out.append(slowest)
    return out


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per layer when profiling")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = run(args.repeats)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"tiny VLM {SIZES}, {SAMPLES} samples, {PP} stages x {DP} pipelines (gloo), {MICRO_BATCHES} micro-batches "
        f"per step, {report['memory_gb'] * 2**10:.1f} MiB per rank; CPU ms per step, measured / predicted"
    )
    for r in report["configurations"]:
        print(
            f"  {r['name']:<11} {r['data']:<9} {r['split']:<9} {r['recompute']:<5} step "
            f"{r['measured_step_seconds'] * 1e3:7.1f} / {r['predicted_step_seconds'] * 1e3:7.1f}  epoch "
            f"{r['measured_epoch_seconds'] * 1e3:7.1f} / {r['predicted_epoch_seconds'] * 1e3:7.1f}  losses "
            + ", ".join(f"{x:.5f}" for x in r["loss"])
        )
        ms = r["stage_ms"]
        pairs = [
            f"{kind} "
            + " / ".join(f"{a:.1f} ({b:.1f})" for a, b in zip(ms[f"measured_{kind}_ms"], ms[f"predicted_{kind}_ms"]))
            for kind in ("forward", "backward")
        ]
        print("      per micro-batch, stages 0 / 1, measured (predicted): " + ", ".join(pairs))
    print(f"{report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
