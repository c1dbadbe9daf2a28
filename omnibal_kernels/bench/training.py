"""Measured training steps of the tiny VLM, balanced packs against random padded batches, and the cost model
calibrated in the same run that predicts them.

Shared by the suite's DDP part (:mod:`omnibal_kernels.bench.ddp`: two CPU processes, gloo) and the GPU check
(``benchmarks/bench_train_gpu.py``: every rank in turn on one CUDA device, :func:`measure_on_device`). The pieces:

* :class:`Workload`: the samples (the bundled loads scaled by 1/16,
  :func:`~omnibal_kernels.testing.tiny_vlm.scaled_lengths`, one ViT sequence per tile), and three sets of packs over
  them: ``random`` (a seeded permutation cut into micro-batches of ``batch`` samples, each trained as a dense
  ``(batch, longest)`` padded batch: the padding is computed, as a padding collator makes a model compute it),
  ``balanced`` (``plan_packs`` packs of about ``batch`` samples under the FLOP cost of the model's shapes, each
  trained as one ``pack_batch`` varlen row) and ``calibration`` (packs of samples of their own, packed alike: each
  pack draws its number of samples, their tiles and their text length apart, so that the fit can tell every term
  from the others; packs of the run's samples cannot, as their LLM tokens are mostly the tiles' 16 placeholders each
  and grow with the samples).
* :func:`run_schedule`: three replicas of the model (same initial weights, an optimizer each) take turns, one
  step at a time: a ``random`` step, a ``balanced`` step (which goes first alternates) and a ``calibration``
  step, ``rounds`` times over the epoch. Every step is a real training step (forward, backward, optimizer).
  Taking turns step by step puts the three under the same machine: on a shared CPU the speed of a core drifts
  by tens of percent within a minute, which would otherwise fall on one mode, or between the calibration and
  the run it predicts.
* :func:`summarize`: the calibration packs' times (mean over their runs) fit ``CostModel.fit`` (half of them
  held out); the fitted model predicts every ``random`` and ``balanced`` step of every rank (a padded batch as
  ``batch`` samples of its longest sample's tokens, the tiles as they are), and the report puts the measured
  and predicted busy time of every rank, and the epoch time and speed-up they give, side by side. A step lasts
  as long as its slowest rank: epoch = sum over steps of the slowest rank's busy time.

A step's ``busy`` time is measured on the robust clock of its device (the thread's CPU time on the CPU, CUDA
events on a GPU) and excludes the time spent inside the gradient all-reduce (waiting for the other rank plus the
transfer); its ``wall`` time is the step's ``time.perf_counter`` duration, waiting included: what a user sees.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .._progress import progress_bar
from ..balance import CostModel, Plan, plan_packs
from ..balance.options import PlanOptions
from ..lengths import Lengths
from ..packing import pack_batch
from ..testing.models import causal_lm_loss
from ..testing.tiny_vlm import PATCHES, TinyVLM, make_sample, scaled_lengths
from .baselines import random_padded_plan

__all__ = [
    "FIELDS",
    "MODES",
    "Sizes",
    "Workload",
    "build_batches",
    "measure_on_device",
    "padded_batch",
    "run_schedule",
    "summarize",
]

MODES = ("random", "balanced", "calibration")
# What every timed step records, in this order: busy on the robust clock (all-reduce excluded), busy on the wall
# clock, the wall time inside the all-reduce, the whole step on the wall clock.
FIELDS = ("busy", "busy_wall", "allreduce_wall", "step_wall")
# Calibration packs (see calibration_workload): samples per pack, tiles per sample, text tokens per sample (the
# samples of a pack distinct, within +-CALIBRATION_JITTER of the pack's centre; 2 * CALIBRATION_JITTER + 1 is at
# least the most samples of a pack), and the most LLM tokens a pack holds. The ranges
# cover the steps the fit predicts: balanced packs of about `batch` samples, padded rows of up to 148 tokens.
# At least one tile per sample: DDP needs a gradient for every parameter, the ViT's included, in every step.
CALIBRATION_SAMPLES = (2, 16)
CALIBRATION_TILES = (1, 5)
CALIBRATION_TEXT = (4, 130)
CALIBRATION_JITTER = 8
CALIBRATION_MAX_TOKENS = 1800
# Issue 17's targets for the measured run: balanced packs at least this much faster than random padded batches,
# and the calibrated model's speed-up and per-rank busy times within this relative error of the measured ones.
SPEEDUP_TARGET = 1.2
AGREEMENT_TARGET = 0.10


@dataclass(frozen=True)
class Sizes:
    """The sizes of one measurement.

    Attributes:
        samples: samples drawn from the bundled loads (scaled by 1/16).
        batch: samples per random padded micro-batch, and the balanced packs' target.
        hidden: the LLM width (the ViT is half as wide); layers: blocks of each.
        rounds: epochs of every mode (each step's time is its mean over the rounds).
        calibration_packs: packs the fit is made on.
        calibration_steps: calibration steps after every step of the two measured modes.
        world_size: data-parallel ranks.
        warmup: untimed steps of every replica first.
    """

    samples: int
    batch: int
    hidden: int
    layers: int
    rounds: int
    calibration_packs: int
    calibration_steps: int = 1
    world_size: int = 2
    warmup: int = 3


def padded_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A dense padded batch: ``(B, longest)`` ids (pad 0), labels (-100 on padding), tiles concatenated."""
    import torch

    longest = max(int(s["input_ids"].numel()) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    labels = torch.full((len(samples), longest), -100, dtype=torch.int64)
    for row, s in enumerate(samples):
        n = s["input_ids"].numel()
        ids[row, :n], labels[row, :n] = s["input_ids"], s["labels"]
        labels[row, 0] = -100
    pixels = torch.cat([s["pixel_values"] for s in samples])
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": torch.arange(longest).expand(len(samples), -1),
        "pixel_values": pixels if pixels.shape[0] else None,
    }


def _tile_lengths(base: Lengths) -> Lengths:
    """``base`` with one ViT sequence per tile (each tile is attended alone)."""
    offsets = np.concatenate([[0], np.cumsum(base.vit)]).astype(np.int64)
    return Lengths(base.vit, base.llm, vit_seqlens=np.ones(int(offsets[-1]), np.int64), vit_seqlens_offsets=offsets)


def calibration_workload(num_packs: int, seed: int) -> tuple[Lengths, list[np.ndarray]]:
    """The calibration samples' loads and ``num_packs`` packs of them (sample ids), one ViT sequence per tile.

    Pack ``p`` holds ``k`` samples of ``a`` tiles and about ``b`` text tokens each (``k``, ``a``, ``b`` drawn
    uniformly, apart; a pack over ``CALIBRATION_MAX_TOKENS`` is drawn again), so tiles, tokens, samples and the
    squares of the sample lengths vary on their own from pack to pack; the samples' text lengths are distinct,
    a few tokens apart, so that the sdpa attention makes one call per sample, as on the run's packs, whose
    samples' lengths mostly differ.
    """
    rng = np.random.default_rng([seed, 7])
    tiles: list[np.ndarray] = []
    text: list[np.ndarray] = []
    while len(tiles) < num_packs:
        k = int(rng.integers(CALIBRATION_SAMPLES[0], CALIBRATION_SAMPLES[1] + 1))
        a = int(rng.integers(CALIBRATION_TILES[0], CALIBRATION_TILES[1] + 1))
        b = rng.integers(CALIBRATION_TEXT[0] + CALIBRATION_JITTER, CALIBRATION_TEXT[1] - CALIBRATION_JITTER + 1)
        t = b + rng.choice(np.arange(-CALIBRATION_JITTER, CALIBRATION_JITTER + 1), k, replace=False)
        if int((a * PATCHES + t).sum()) <= CALIBRATION_MAX_TOKENS:
            tiles.append(np.full(k, a))
            text.append(t)
    sizes = np.array([x.shape[0] for x in tiles])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    vit = np.concatenate(tiles)
    lengths = _tile_lengths(Lengths(vit, vit * PATCHES + np.concatenate(text)))
    return lengths, [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]


def _plan_packs(plan: Plan) -> list[np.ndarray]:
    return [plan.pack_samples[a:b] for a, b in zip(plan.pack_offsets[:-1], plan.pack_offsets[1:])]


@dataclass(frozen=True)
class Workload:
    """The samples' loads and the packs of every mode (see the module docstring); the same on every rank.

    Attributes:
        lengths: ``(N,)`` loads with one ViT sequence per tile.
        plans: the ``random`` and ``balanced`` plans (steps x ranks of packs).
        calibration_lengths: the calibration samples' loads.
        calibration: the calibration packs, sample ids into ``calibration_lengths``.
    """

    lengths: Lengths
    plans: dict[str, Plan]
    calibration_lengths: Lengths
    calibration: list[np.ndarray]
    calibration_steps: int = 1

    @classmethod
    def build(cls, sizes: Sizes, seed: int, cost_model: CostModel) -> Workload:
        """The workload of ``sizes``; ``cost_model`` (the model's FLOP estimate) plans the balanced packs."""
        lengths = _tile_lengths(scaled_lengths(sizes.samples, seed))
        plans = {
            "random": random_padded_plan(lengths, world_size=sizes.world_size, batch_size=sizes.batch, seed=seed),
            "balanced": plan_packs(
                lengths,
                PlanOptions(target_batch_size=sizes.batch, cost_model=cost_model, seed=seed),
                world_size=sizes.world_size,
            ),
        }
        runs = sizes.rounds * max(p.num_steps for p in plans.values()) * sizes.calibration_steps * sizes.world_size
        if runs < sizes.calibration_packs:
            raise ValueError(
                f"sizes: {sizes.calibration_packs} calibration packs but only {runs} calibration runs "
                "(rounds x steps x calibration_steps x world_size); fewer packs or more steps"
            )
        extra, packs = calibration_workload(sizes.calibration_packs, seed)
        return cls(lengths, plans, extra, packs, sizes.calibration_steps)

    def mode_lengths(self, mode: str) -> Lengths:
        """The loads ``mode``'s packs index: the calibration samples' for ``calibration``, else the run's."""
        return self.calibration_lengths if mode == "calibration" else self.lengths

    def steps(self, mode: str) -> int:
        """Steps of ``mode`` per epoch (``calibration``: ``calibration_steps`` per step of the longer of the
        other two)."""
        if mode == "calibration":
            return max(p.num_steps for p in self.plans.values()) * self.calibration_steps
        return self.plans[mode].num_steps

    def rank_packs(self, mode: str, rank: int) -> list[np.ndarray]:
        """``rank``'s packs of ``mode`` in step order (``calibration``: every calibration pack)."""
        if mode == "calibration":
            return self.calibration
        return self.plans[mode].rank_batches(rank)

    def calibration_pack(self, round_: int, step: int, rank: int) -> int:
        """The calibration pack ``rank`` trains at calibration step ``step`` of round ``round_``: the packs in
        turn, ranks interleaved, so that every pack runs about equally often on every rank."""
        k = (round_ * self.steps("calibration") + step) * self.plans["random"].world_size + rank
        return k % len(self.calibration)

    def predicted(self, model: CostModel, mode: str) -> np.ndarray:
        """``(steps, ranks)`` busy time ``model`` predicts for every rank's pack of ``mode``; a padded batch costs
        its samples padded to the longest one's tokens (tiles unpadded)."""
        plan = self.plans[mode]
        packs = _plan_packs(plan)
        if mode == "random":
            longest = np.array([self.lengths.llm[p].max() for p in packs])
            vit = np.concatenate([self.lengths.vit[p] for p in packs])
            llm = np.concatenate([np.full(p.shape[0], t) for p, t in zip(packs, longest)])
            rows = np.concatenate([[0], np.cumsum([p.shape[0] for p in packs])])
            costs = model.pack_costs(
                _tile_lengths(Lengths(vit, llm)), [np.arange(a, b) for a, b in zip(rows[:-1], rows[1:])]
            )
        else:
            costs = model.pack_costs(self.lengths, packs)
        return costs[plan.step_packs]

    def tokens(self, mode: str) -> int:
        """Real (unpadded) LLM tokens ``mode`` trains in an epoch, repeated samples counted each time."""
        return int(self.lengths.llm[self.plans[mode].slot_samples()].sum())

    def padding(self) -> float:
        """Share of the random padded batches' token positions that are padding."""
        plan = self.plans["random"]
        packs = _plan_packs(plan)
        positions = sum(
            packs[int(p)].shape[0] * int(self.lengths.llm[packs[int(p)]].max()) for p in plan.step_packs.reshape(-1)
        )
        return 1.0 - self.tokens("random") / positions


def run_schedule(
    work: Workload,
    sizes: Sizes,
    ranks: list[int],
    step: Callable[[str, int, int], np.ndarray],
    progress: Optional[bool] = None,
) -> dict[str, np.ndarray]:
    """Runs every mode's steps in turn (see the module docstring) and returns what they recorded.

    Args:
        work, sizes: the workload and its sizes.
        ranks: the ranks this process trains, one after another in every step (``[rank]`` under DDP, every
            rank on one device).
        step: ``step(mode, rank, pack) -> (len(FIELDS),)`` trains ``rank``'s pack ``pack`` (an index into
            ``work.rank_packs(mode, rank)``) of ``mode`` once and returns its times. ``pack < 0`` asks for an
            untimed warm-up step.
        progress: a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        ``{mode: (rounds, steps, len(ranks), len(FIELDS))}`` and ``"calibration_pack"``: ``(rounds, steps,
        len(ranks))`` the calibration pack of every calibration step.
    """
    out = {m: np.full((sizes.rounds, work.steps(m), len(ranks), len(FIELDS)), np.nan) for m in MODES}
    which = np.zeros((sizes.rounds, work.steps("calibration"), len(ranks)), np.int64)
    total = len(MODES) * sizes.warmup + sum(sizes.rounds * work.steps(m) for m in MODES)
    bar = progress_bar(total, "training steps", enabled=progress)
    for mode in MODES:
        for k in range(sizes.warmup):
            for r in ranks:
                step(mode, r, -1 - k)
            bar.update(1)
    for rnd in range(sizes.rounds):
        for j in range(work.steps("calibration") // work.calibration_steps):
            # the two measured modes alternate which goes first; calibration follows both
            for mode in ("random", "balanced") if (j + rnd) % 2 == 0 else ("balanced", "random"):
                if j < work.steps(mode):
                    for i, r in enumerate(ranks):
                        out[mode][rnd, j, i] = step(mode, r, j)
                    bar.update(1)
            for c in range(j * work.calibration_steps, (j + 1) * work.calibration_steps):
                for i, r in enumerate(ranks):
                    which[rnd, c, i] = work.calibration_pack(rnd, c, r)
                    out["calibration"][rnd, c, i] = step("calibration", r, int(which[rnd, c, i]))
                bar.update(1)
    bar.close()
    return {**out, "calibration_pack": which}


def _epoch(busy: np.ndarray) -> float:
    """Sum over steps of the slowest rank (``busy``: (steps, ranks))."""
    return float(busy.max(axis=1).sum())


def _calibrate(work: Workload, records: dict[str, np.ndarray], seed: int, flops: CostModel) -> tuple[Any, Any]:
    """``CostModel.fit`` on the mean busy time of every calibration pack over all its runs: on all packs (the
    model that predicts the run) and on half of them, predicting the other half (its held-out error)."""
    busy = records["calibration"][..., 0].reshape(-1)
    which = records["calibration_pack"].reshape(-1)
    seconds = np.array([np.mean(busy[which == p]) for p in range(len(work.calibration))])
    if not np.isfinite(seconds).all():
        raise ValueError("a calibration pack was never timed: more steps or fewer calibration packs")
    fit = CostModel.fit(work.calibration_lengths, work.calibration, seconds, holdout=0.0, seed=seed)
    held = CostModel.fit(work.calibration_lengths, work.calibration, seconds, holdout=0.5, seed=seed, reference=flops)
    return fit, held


def summarize(work: Workload, records: dict[str, np.ndarray], *, seed: int, flops: CostModel) -> dict[str, Any]:
    """The report entry: measured and predicted busy time per rank, epochs and speed-ups, and the fit.

    Args:
        work: the workload the records were measured on.
        records: :func:`run_schedule`'s output over all ranks (``(rounds, steps, ranks, fields)``).
        seed: the seed of the fit's held-out draw.
        flops: the model's FLOP estimate, fitted beside (one factor) for comparison.

    Returns:
        A flat dict; ``<mode>_busy_s`` / ``<mode>_busy_predicted_s`` are per rank, ``<mode>_s`` the epoch (slowest
        rank per step, robust clock), ``<mode>_wall_s`` the epoch on the wall clock; ``speedup`` (robust clock),
        ``speedup_predicted`` and ``speedup_wall`` are balanced over random padded in tokens per second;
        ``busy_error_max`` the largest relative error of a rank's predicted busy time, ``speedup_error`` the
        predicted speed-up's, ``misses`` the targets (``targets``: :data:`SPEEDUP_TARGET`,
        :data:`AGREEMENT_TARGET`) missed; ``calibration`` the fit (model, errors, held-out errors beside the
        FLOP estimate's).
    """
    fit, held = _calibrate(work, records, seed, flops)
    out: dict[str, Any] = {}
    per_step_errors = []
    for mode in ("random", "balanced"):
        mean = np.mean(records[mode], axis=0)  # (steps, ranks, fields), each step's mean over the rounds
        busy, predicted = mean[..., 0], work.predicted(fit.model, mode)
        tokens = work.tokens(mode)
        out[f"{mode}_steps"] = int(busy.shape[0])
        out[f"{mode}_tokens"] = tokens
        out[f"{mode}_s"] = _epoch(busy)
        out[f"{mode}_predicted_s"] = _epoch(predicted)
        out[f"{mode}_wall_s"] = _epoch(mean[..., 3])
        out[f"{mode}_tokens_per_s"] = tokens / out[f"{mode}_s"]
        out[f"{mode}_busy_s"] = busy.sum(axis=0).tolist()
        out[f"{mode}_busy_predicted_s"] = predicted.sum(axis=0).tolist()
        out[f"{mode}_busy_wall_s"] = mean[..., 1].sum(axis=0).tolist()
        out[f"wait_fraction_{mode}"] = float(mean[..., 2].sum() / mean[..., 3].sum())
        out[f"{mode}_rounds_s"] = [round(_epoch(r[..., 0]), 4) for r in records[mode]]
        per_step_errors.append(np.abs(predicted / busy - 1).reshape(-1))
    ratio = work.tokens("balanced") / work.tokens("random")
    out["speedup"] = out["balanced_tokens_per_s"] / out["random_tokens_per_s"]
    out["speedup_predicted"] = ratio * out["random_predicted_s"] / out["balanced_predicted_s"]
    out["speedup_wall"] = ratio * out["random_wall_s"] / out["balanced_wall_s"]
    busy_errors = [
        p / m - 1
        for mode in ("random", "balanced")
        for p, m in zip(out[f"{mode}_busy_predicted_s"], out[f"{mode}_busy_s"])
    ]
    out["busy_error_max"] = float(np.max(np.abs(busy_errors)))
    out["speedup_error"] = out["speedup_predicted"] / out["speedup"] - 1
    out["step_error_median"] = float(np.median(np.concatenate(per_step_errors)))
    out["targets"] = {"speedup": SPEEDUP_TARGET, "agreement": AGREEMENT_TARGET}
    out["misses"] = _misses(out)
    out["padding_random"] = work.padding()
    out["samples"] = len(work.lengths)
    out["input_tokens"] = int(work.lengths.llm.sum())
    out["calibration"] = _fit_summary(fit, held, records)
    return out


def _misses(out: dict[str, Any]) -> list[str]:
    """The targets a summary misses, each with its number."""
    misses = []
    if out["speedup"] < SPEEDUP_TARGET:
        misses.append(f"measured speed-up {out['speedup']:.3f}x < {SPEEDUP_TARGET}x")
    if abs(out["speedup_error"]) > AGREEMENT_TARGET:
        misses.append(f"predicted speed-up {out['speedup_error']:+.1%} off the measured one")
    if out["busy_error_max"] > AGREEMENT_TARGET:
        misses.append(f"a rank's predicted busy time {out['busy_error_max']:.1%} off its measured one")
    return misses


def _fit_summary(fit: Any, held: Any, records: dict[str, np.ndarray]) -> dict[str, Any]:
    errors = held.to_dict()
    packs = int(fit.seconds.shape[0])
    return {
        "packs": packs,
        "runs_per_pack": records["calibration_pack"].size / packs,
        "model": fit.model.to_dict(),
        "fit_error": fit.to_dict()["fit_error"],
        "heldout_packs": int(held.heldout_packs.shape[0]),
        "heldout_error": errors["heldout_error"],
        "flops_heldout_error": errors["reference_heldout_error"],
    }


def build_batches(work: Workload, rank: int, seed: int) -> dict[str, list]:
    """``rank``'s batches of every mode, in step order (calibration: every calibration pack): ``padded_batch``
    for ``random``, ``pack_batch`` otherwise; built before anything is timed."""
    build: dict[str, Callable[[list[dict[str, Any]]], Any]] = {
        "random": padded_batch,
        "balanced": pack_batch,
        "calibration": pack_batch,
    }
    out = {}
    for mode in MODES:
        lengths, packs = work.mode_lengths(mode), work.rank_packs(mode, rank)
        samples = {int(i): make_sample(lengths, int(i), seed) for i in np.unique(np.concatenate(packs))}
        out[mode] = [build[mode]([samples[int(i)] for i in p]) for p in packs]
    return out


class _DeviceReplica:
    """One mode's model and optimizer on one device, trained by every rank in turn; no all-reduce. The busy
    clock is CUDA events on a GPU (under bfloat16 autocast, as GPU training runs), the thread's CPU time on
    the CPU."""

    def __init__(self, model: Any, device: Any) -> None:
        import torch

        self.torch, self.device = torch, device
        self.model = model.to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)

    def step(self, batch: Any) -> np.ndarray:
        """One training step; returns its times in the order of ``FIELDS``."""
        torch, cuda = self.torch, self.device.type == "cuda"
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        wall, cpu = time.perf_counter(), time.thread_time()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = self.model(**batch)
        causal_lm_loss(logits.float(), batch["labels"]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if cuda:
            end.record()
            end.synchronize()
            busy = start.elapsed_time(end) / 1e3
        else:
            busy = time.thread_time() - cpu
        wall = time.perf_counter() - wall
        return np.array([busy, wall, 0.0, wall])


def measure_on_device(sizes: Sizes, seed: int, device: Any, progress: Optional[bool] = None) -> dict[str, Any]:
    """The measurement of this module with every rank on one device, in turn: each rank's step is a whole
    training step of its mode's replica (forward, backward, optimizer), so a step of ``sizes.world_size``
    ranks lasts, as under DDP, as long as its slowest rank (no all-reduce to wait in).

    Args:
        sizes: the workload's sizes (``world_size`` ranks share the device).
        seed: the samples, the plans, the initial weights and the fit's held-out draw.
        device: a ``torch.device`` (``cuda``: CUDA-event busy times under bfloat16 autocast; ``cpu``: thread
            CPU time, float32).
        progress: a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        :func:`summarize`'s entry plus ``flops_model`` and ``device``.
    """
    import torch

    torch.manual_seed(seed)
    model = TinyVLM(hidden=sizes.hidden, vit_hidden=sizes.hidden // 2, layers=sizes.layers)
    flops = model.cost_model()
    work = Workload.build(sizes, seed, flops)
    batches = {
        r: {m: [_on(b, device) for b in bs] for m, bs in build_batches(work, r, seed).items()}
        for r in range(sizes.world_size)
    }
    replicas = {m: _DeviceReplica(copy.deepcopy(model), device) for m in MODES}

    def step(mode: str, r: int, pack: int) -> np.ndarray:
        mode_batches = batches[r][mode]
        return replicas[mode].step(mode_batches[pack if pack >= 0 else (-1 - pack) % len(mode_batches)])

    records = run_schedule(work, sizes, list(range(sizes.world_size)), step, progress=progress)
    result = summarize(work, records, seed=seed, flops=flops)
    result.update(flops_model=flops.to_dict(), device=str(device))
    return result


def _on(batch: Any, device: Any) -> Any:
    """A packed batch (``PackedBatch.to``) or a padded one (a dict of tensors and None) on ``device``."""
    if not isinstance(batch, dict):
        return batch.to(device)
    return {k: None if v is None else v.to(device) for k, v in batch.items()}
