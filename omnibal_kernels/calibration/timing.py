"""Measured training time of real packed batches: forward + backward of a model, one pack at a time.

Clocks (``clock=``):

``"cuda"``
    CUDA events around forward + backward, read after ``torch.cuda.synchronize``: the GPU's own time (the
    default for a model on a CUDA device).
``"wall"``
    ``time.perf_counter`` around forward + backward (CUDA synchronized before and after when the model is on a
    GPU): what a training step waits for, other processes included (the default on the CPU).
``"thread"``
    The calling thread's CPU time (``time.thread_time``) with torch set to one thread for the measurement (and
    restored after): CPU models only. Time the thread spends waiting while other processes run is not counted,
    so on a shared, busy machine it is far steadier than the wall clock; it still moves with what the machine's
    other work does to the caches and memory bandwidth. On the CPU the autograd engine runs the backward on the
    calling thread, so the clock sees it whole.

Runs: ``warmup`` untimed forward + backward passes first (the first batches, cycled), then ``repeats`` timed
passes over all batches, every other pass in reverse order so that a slow drift of the machine does not fall on
the same packs; each pack's time is the median of its repeats. Gradients are cleared (set to None) between
runs, outside the timed region, so every run does the same work.

Reference (``reference=``): on a shared CPU the speed of the machine drifts by tens of percent over a second
(other processes' work, frequency), far more than two runs of the same pack differ back to back. With a
reference batch, every timed run is preceded and followed by a timed run of that batch, and the run counts
``run / mean(the two reference runs around it) * median(all reference runs)``: the drift cancels, the unit stays
seconds. ``"auto"`` (the default) uses the batch at the first quartile of token counts on the CPU clocks (it
costs a quarter to a half more time) and none on CUDA, whose event times do not drift.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, cast

import numpy as np

from .._checks import check_positive_int
from .._progress import progress_bar

__all__ = ["CLOCKS", "PackTimes", "measure_pack_times"]

CLOCKS = ("auto", "cuda", "wall", "thread")
# The reference batch "auto" picks: this quantile of the batches' token counts (short, so it costs little).
_REFERENCE_QUANTILE = 0.25


@dataclass(frozen=True)
class PackTimes:
    """Measured forward + backward time of every batch.

    Attributes:
        seconds: ``(P,)`` median over the repeats of each batch's time.
        runs: ``(repeats, P)`` every timed run, in seconds (divided by the reference around it, when there is one).
        clock: the clock used (``"cuda"``, ``"wall"`` or ``"thread"``).
        device: the model's device, e.g. ``"cpu"`` or ``"cuda:0"``.
        reference: the index of the reference batch, or None.
        raw_runs: ``(repeats, P)`` the timed runs as measured; reference_runs: ``(repeats, P + 1)`` the reference
            runs of every pass, in the order they ran (None without a reference).
    """

    seconds: np.ndarray
    runs: np.ndarray
    clock: str
    device: str
    reference: Optional[int] = None
    raw_runs: Optional[np.ndarray] = None
    reference_runs: Optional[np.ndarray] = None

    @property
    def spread(self) -> np.ndarray:
        """``(P,)`` (slowest - fastest run) / median of each batch: how much its repeats disagree."""
        return (self.runs.max(axis=0) - self.runs.min(axis=0)) / self.seconds

    def summary(self) -> dict[str, Any]:
        """Clock, device, batches, repeats, reference, total median seconds and the median and largest spread
        (also of the raw runs, when a reference divided them)."""
        spread = self.spread
        out = {
            "clock": self.clock,
            "device": self.device,
            "batches": int(self.seconds.size),
            "repeats": int(self.runs.shape[0]),
            "reference": self.reference,
            "seconds_total": float(self.seconds.sum()),
            "spread_median": float(np.median(spread)),
            "spread_max": float(spread.max()),
        }
        if self.raw_runs is not None:
            raw = self.raw_runs
            out["raw_spread_median"] = float(np.median((raw.max(axis=0) - raw.min(axis=0)) / np.median(raw, axis=0)))
        return out


def _default_loss(model: Any, batch: Mapping[str, Any]) -> Any:
    out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is None:
        raise TypeError("the model's output has no loss (pass labels in the batches, or loss=fn(model, batch))")
    return loss


def _to_device(batch: Any, device: Any) -> Any:
    import torch

    if hasattr(batch, "to") and not isinstance(batch, torch.Tensor):
        return batch.to(device)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _resolve_clock(clock: str, device: Any) -> str:
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    on_cuda = device.type == "cuda"
    if clock == "auto":
        return "cuda" if on_cuda else "wall"
    if clock == "cuda" and not on_cuda:
        raise ValueError(f"clock='cuda' needs a model on a CUDA device, the model is on {device}")
    if clock == "thread" and on_cuda:
        raise ValueError("clock='thread' measures CPU work; the model is on a CUDA device (use 'cuda' or 'wall')")
    return clock


def _timer(clock: str, device: Any) -> Callable[[Callable[[], None]], float]:
    """A function that runs ``work`` and returns its seconds on ``clock``."""
    import torch

    if clock == "cuda":

        def cuda_time(work: Callable[[], None]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            work()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return cuda_time
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    read = time.thread_time if clock == "thread" else time.perf_counter

    def host_time(work: Callable[[], None]) -> float:
        sync()
        t0 = read()
        work()
        sync()
        return read() - t0

    return host_time


def _reference_index(reference: Any, clock: str, batches: Sequence[Mapping[str, Any]]) -> Optional[int]:
    if reference is None:
        return None
    if reference == "auto":
        if clock == "cuda":
            return None
        tokens = np.array([_tokens(b) for b in batches])
        target = np.quantile(tokens, _REFERENCE_QUANTILE, method="nearest")
        return int(np.flatnonzero(tokens == target)[0])
    index = check_positive_int("reference", reference, minimum=0)
    if index >= len(batches):
        raise ValueError(f"reference must be a batch index in [0, {len(batches)}), got {index}")
    return index


def _pass_order(r: int, count: int) -> np.ndarray:
    """The batches of pass ``r`` in the order they run: forward on even passes, backward on odd ones."""
    order = np.arange(count)
    return order if r % 2 == 0 else order[::-1]


def _tokens(batch: Mapping[str, Any]) -> int:
    ids: Any = batch.get("input_ids")
    return int(ids.numel()) if hasattr(ids, "numel") else 0


def measure_pack_times(
    model: Any,
    batches: Sequence[Mapping[str, Any]],
    *,
    repeats: int = 3,
    warmup: int = 3,
    clock: str = "auto",
    reference: Any = "auto",
    loss: Optional[Callable[[Any, Mapping[str, Any]], Any]] = None,
    progress: Optional[bool] = None,
) -> PackTimes:
    """Times forward + backward of each batch on the model's device (see the module docstring for the clocks).

    Args:
        model: a ``torch.nn.Module`` (e.g. a transformers model), trained as it is: put into training mode for
            the measurement (and back after), weights never updated.
        batches: ``P`` packed batches, e.g. ``PackCollator.for_model(model)(samples)`` of each pack; each is
            moved to the model's device once, before any timing.
        repeats: timed passes over all batches (the median is kept).
        warmup: untimed runs before the first timed one.
        clock: ``"auto"`` (``"cuda"`` on a GPU, ``"wall"`` on the CPU), ``"cuda"``, ``"wall"`` or ``"thread"``.
        reference: the index of the batch that measures the machine's speed around every run, ``"auto"`` (see
            the module docstring) or None (runs as measured).
        loss: ``loss(model, batch) -> scalar tensor`` (default: ``model(**batch).loss``).
        progress: a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        :class:`PackTimes` (``seconds`` of shape ``(P,)``).

    Raises:
        ValueError: no batches, ``repeats < 1``, ``warmup < 0``, a clock that does not fit the device, a
            reference that is not a batch index.
        TypeError: a batch that is not a mapping, a model output without a loss.
    """
    import torch

    repeats = check_positive_int("repeats", repeats)
    warmup = check_positive_int("warmup", warmup, minimum=0)
    if not isinstance(batches, Sequence) or not len(batches):
        raise ValueError("batches must be a non-empty sequence of packed batches")
    for i, b in enumerate(batches):
        if not isinstance(b, Mapping):
            raise TypeError(f"batch {i} must be a mapping of model inputs, got {type(b).__name__}")
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    clock = _resolve_clock(clock, device)
    loss_fn = loss or _default_loss
    moved = [_to_device(b, device) for b in batches]
    timer = _timer(clock, device)

    def run(batch: Mapping[str, Any]) -> Callable[[], None]:
        def work() -> None:
            loss_fn(model, batch).backward()

        return work

    ref = _reference_index(reference, clock, moved)
    threads = torch.get_num_threads()
    was_training = model.training
    runs = np.zeros((repeats, len(moved)))
    ref_runs = np.zeros((repeats, len(moved) + 1)) if ref is not None else None  # set exactly when ref is an int
    per_pass = len(moved) * (1 if ref is None else 2) + (ref is not None)
    bar = progress_bar(total=warmup + repeats * per_pass, desc="timing packs", enabled=progress)

    def timed(i: int) -> float:
        t = timer(run(moved[i]))
        model.zero_grad(set_to_none=True)
        bar.update(1)
        return t

    try:
        if clock == "thread":
            torch.set_num_threads(1)
        model.train()
        for k in range(warmup):
            run(moved[k % len(moved)])()
            model.zero_grad(set_to_none=True)
            bar.update(1)
        for r in range(repeats):
            if ref_runs is not None:
                ref_runs[r, 0] = timed(cast(int, ref))
            for k, i in enumerate(_pass_order(r, len(moved))):
                runs[r, i] = timed(i)
                if ref_runs is not None:
                    ref_runs[r, k + 1] = timed(cast(int, ref))
    finally:
        bar.close()
        model.train(was_training)
        torch.set_num_threads(threads)
    if ref_runs is None:
        return PackTimes(np.median(runs, axis=0), runs, clock, str(device))
    return _normalized(runs, ref_runs, cast(int, ref), clock, str(device))


def _normalized(raw: np.ndarray, ref_runs: np.ndarray, ref: int, clock: str, device: str) -> PackTimes:
    """Every run divided by the mean of the reference runs before and after it, times the median reference run."""
    runs = np.zeros_like(raw)
    scale = float(np.median(ref_runs))
    for r in range(raw.shape[0]):
        order = _pass_order(r, raw.shape[1])
        around = (ref_runs[r, :-1] + ref_runs[r, 1:]) / 2  # around[k]: the references of the k-th run of the pass
        runs[r, order] = raw[r, order] / around * scale
    return PackTimes(np.median(runs, axis=0), runs, clock, device, ref, raw, ref_runs)
