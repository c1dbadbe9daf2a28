"""Collate speed: ``pack_batch`` against a per-sample Python collator and the ``torch.cat`` floor.

Inputs (sample sizes drawn with a fixed seed from the bundled real loads):

* ``text``: token ids and labels of real LLM lengths;
* ``tiles``: InternVL-style samples, ``pixel_values`` ``(tiles, 3, 112, 112)`` (real tile counts; tiles
  scaled from 448 to 112 pixels so a batch of 64 stays small) and the real token counts;
* ``patches``: Qwen2-VL-style samples, ``pixel_values`` ``(h * w, 1176)`` patches with ``image_grid_thw``
  ``[[1, h, w]]`` (``h``, ``w`` even, 4 to 24) and one placeholder token per 4 patches plus real text;
* ``lists``: the ``text`` samples with ids and labels as Python lists, what a ``datasets.Dataset`` yields
  without a torch format (main process only; the floor there converts each list with numpy and concatenates).

Providers (same samples, same text outputs):

* ``omnibal_kernels``: ``pack_batch`` (the numba backend);
* ``omnibal_kernels_checked``: ``pack_batch`` on the samples of a planned micro-step (what
  ``sampler.wrap(dataset)`` hands the collator): every sample's tokens, ViT load and label tokens checked against
  its length entry, and ``num_items_in_batch`` and the loss counts set; the cost of the check, side by side;
* ``python_per_sample``: ``testing.pack_batch_reference`` (per-sample Python lists, as Hugging Face's
  ``DataCollatorWithFlattening`` builds them), plus ``torch.cat`` of the pixels and a Python loop for the
  vision offsets;
* ``hf_flattening``: transformers' ``DataCollatorWithFlattening`` (text only, when transformers is present);
* ``torch_cat_floor``: ``torch.cat`` of the ids, the labels and the pixels, what any collator must do.

``process``: best time per call in the main process, providers taking turns. ``worker``: seconds per batch
delivered by a real ``DataLoader`` with one worker (collate in the worker, the batch sent through shared
memory), after the worker has started; the floor there concatenates into shared memory, as
``default_collate`` does in a worker.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import numpy as np
import torch

from ..data import DEFAULT_LENGTHS_PATH
from ..packing import PackedBatch, pack_batch, warmup
from ..packing.planned import sample_loads
from ..sampler.steps import PlannedBatch, PlannedDataset, PlannedSamples, PlannedStep
from ..testing import pack_batch_reference
from .runner import Config, register

VOCAB = 151_000
TILE_PX = 112
PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x 14 x 14 pixels
Samples = list[dict[str, Any]]
OURS, PYTHON, HF, FLOOR = "omnibal_kernels", "python_per_sample", "hf_flattening", "torch_cat_floor"
CHECKED = "omnibal_kernels_checked"
INPUTS = ("text", "tiles", "patches", "lists")
FULL = dict(batch_sizes=(4, 16, 64), worker_batch_sizes=(4, 16, 64), rounds=7, budget_s=0.02, worker_batches=12)
QUICK = dict(batch_sizes=(4, 16), worker_batch_sizes=(16,), rounds=3, budget_s=0.005, worker_batches=6)


def make_samples(kind: str, batch_size: int, seed: int = 0) -> Samples:
    """``batch_size`` samples of input ``kind`` (one of :data:`INPUTS`), fixed seed."""
    if kind not in INPUTS:
        raise ValueError(f"kind must be one of {INPUTS}, got {kind!r}")
    if kind == "lists":
        return [{k: v.tolist() for k, v in s.items()} for s in make_samples("text", batch_size, seed)]
    rng = np.random.default_rng([seed, batch_size, INPUTS.index(kind)])
    with np.load(DEFAULT_LENGTHS_PATH) as z:
        pick = rng.integers(0, z["llm"].shape[0], batch_size)
        tiles, tokens = z["vit"][pick], z["llm"][pick]
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for t, n in zip(tiles.tolist(), tokens.tolist()):
        sample: dict[str, Any] = {}
        if kind == "tiles" and t > 0:
            sample["pixel_values"] = torch.randn(t, 3, TILE_PX, TILE_PX, generator=gen)
        elif kind == "patches":
            h, w = (2 * rng.integers(2, 13, 2)).tolist()
            sample["pixel_values"] = torch.randn(h * w, PATCH_DIM, generator=gen)
            sample["image_grid_thw"] = torch.tensor([[1, h, w]])
            n = max(int(n) - 256 * t, 1) + h * w // 4
        sample["input_ids"] = torch.randint(0, VOCAB, (int(n),), generator=gen)
        sample["labels"] = torch.randint(0, VOCAB, (int(n),), generator=gen)
        samples.append(sample)
    return samples


def planned_step(samples: Samples) -> PlannedStep:
    """The step a sampler would give ``samples`` (one micro-step of one rank): their true loads and label counts."""
    loads = [sample_loads(s) for s in samples]
    label = tuple(int((torch.as_tensor(s.get("labels", s["input_ids"]))[1:] != -100).sum()) for s in samples)
    return PlannedStep(
        epoch=0,
        step=0,
        micro_step=0,
        micro_steps_per_step=1,
        world_size=1,
        rank=0,
        vit=tuple(v for _, v in loads),
        llm=tuple(int(t or 0) for t, _ in loads),
        label=label,
        num_items_in_batch=sum(label),
        num_samples_in_batch=sum(n > 0 for n in label),
    )


def planned_samples(samples: Samples) -> PlannedSamples:
    """``samples`` as ``sampler.wrap(dataset)`` hands them to the collator, loads checked."""
    return PlannedSamples(list(samples), planned_step(samples), list(range(len(samples))), True)


def python_collate(samples: Samples) -> dict[str, Any]:
    """A plain per-sample Python collator: the reference text fields, then the pixels and vision offsets."""
    out = pack_batch_reference(samples)
    pixels = [s["pixel_values"] for s in samples if "pixel_values" in s]
    if pixels:
        out["pixel_values"] = torch.cat(pixels)
        cu = [0]
        for s in samples:
            if "image_grid_thw" in s:
                for _, h, w in s["image_grid_thw"].tolist():
                    cu.append(cu[-1] + h * w)
            elif "pixel_values" in s:
                for _ in range(s["pixel_values"].shape[0]):
                    cu.append(cu[-1] + 1)
        out["vit_cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
        grids = [s["image_grid_thw"] for s in samples if "image_grid_thw" in s]
        if grids:
            out["image_grid_thw"] = torch.cat(grids)
    return out


def floor_collate(samples: Samples) -> tuple[torch.Tensor, ...]:
    """``torch.cat`` of the ids, the labels and the pixels: the least any collator does."""
    out = (torch.cat([s["input_ids"] for s in samples]), torch.cat([s["labels"] for s in samples]))
    pixels = [s["pixel_values"] for s in samples if "pixel_values" in s]
    return out + (torch.cat(pixels),) if pixels else out


def floor_collate_lists(samples: Samples) -> tuple[torch.Tensor, ...]:
    """The floor for Python lists: each list converted with numpy, the ids and the labels concatenated."""
    return tuple(
        torch.from_numpy(np.concatenate([np.array(s[key], dtype=np.int64) for s in samples]))
        for key in ("input_ids", "labels")
    )


def _shared_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    rest = tensors[0].shape[1:]
    rows = sum(t.shape[0] for t in tensors)
    out = torch.empty((rows, *rest), dtype=tensors[0].dtype).share_memory_()
    return torch.cat(tensors, out=out)


def floor_collate_shared(samples: Samples) -> tuple[torch.Tensor, ...]:
    """The floor inside a worker: the same concatenations, written into shared memory."""
    out = (_shared_cat([s["input_ids"] for s in samples]), _shared_cat([s["labels"] for s in samples]))
    pixels = [s["pixel_values"] for s in samples if "pixel_values" in s]
    return out + (_shared_cat(pixels),) if pixels else out


def providers(kind: str) -> dict[str, Callable[[Samples], Any]]:
    """Name -> collate function for the main process; ``hf_flattening`` for text when transformers imports."""
    warmup()
    out: dict[str, Callable[[Samples], Any]] = {OURS: pack_batch, PYTHON: python_collate}
    if kind in ("text", "lists"):
        try:
            from transformers import DataCollatorWithFlattening
        except ImportError:
            pass
        else:
            out[HF] = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    out[FLOOR] = floor_collate_lists if kind == "lists" else floor_collate
    return out


def worker_providers() -> dict[str, Callable[[Samples], Any]]:
    """Name -> collate function run inside a DataLoader worker."""
    warmup()
    return {OURS: pack_batch, PYTHON: python_collate, FLOOR: floor_collate_shared}


def measure(
    funcs: dict[str, Callable[[Samples], Any]], samples: Samples, rounds: int = 7, budget_s: float = 0.02
) -> dict[str, float]:
    """Best seconds per call of each function; rounds interleaved so all see the same machine."""
    calls = {}
    for name, fn in funcs.items():
        fn(samples)
        calls[name] = max(1, int(budget_s / max(_once(fn, samples), 1e-7)))
    best = {name: float("inf") for name in funcs}
    for _ in range(rounds):
        for name, fn in funcs.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn(samples)
            best[name] = min(best[name], (time.perf_counter() - start) / calls[name])
    return best


def _once(fn: Callable[[Samples], Any], samples: Samples) -> float:
    start = time.perf_counter()
    fn(samples)
    return time.perf_counter() - start


class _Fixed(torch.utils.data.Dataset):
    def __init__(self, samples: Samples) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.samples[i]


def measure_worker(fn: Callable[[Samples], Any], samples: Samples, batches: int, planned: bool = False) -> float:
    """Seconds per batch a one-worker DataLoader delivers with ``fn`` as collate (first batch excluded);
    ``planned``: the batches are a sampler's (``PlannedBatch`` over a ``PlannedDataset``), checked by the collator."""
    index: list[int] = list(range(len(samples)))
    dataset: Any = _Fixed(samples)
    if planned:
        index, dataset = PlannedBatch(index, planned_step(samples)), PlannedDataset(dataset)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=[index] * (batches + 1), collate_fn=fn, num_workers=1, prefetch_factor=2
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader)
        next(it)  # the worker has started and collated once
        start = time.perf_counter()
        for _ in range(batches):
            batch = next(it)
        seconds = (time.perf_counter() - start) / batches
    assert isinstance(batch, (PackedBatch, dict, tuple))
    del it
    return seconds


@register("collate")
def run(config: Config) -> dict[str, Any]:
    """Seconds per batch of every provider, input and batch size, in the main process and in a worker."""
    sizes = QUICK if config.quick else FULL
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker, and so the floor is not a multi-threaded copy
    try:
        with warnings.catch_warnings():
            # Qwen2-VL grids without image_token_id: the text positions stay 1-D, which is what is timed here
            warnings.filterwarnings("ignore", message=".*image_token_id is not set")
            rows = _run(config, sizes)
    finally:
        torch.set_num_threads(threads)
    return {"collate": rows}


def _run(config: Config, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for kind in INPUTS:
        funcs = providers(kind)
        for batch_size in sizes["batch_sizes"]:
            samples = make_samples(kind, batch_size, config.seed)
            planned = planned_samples(samples)
            checked: dict[str, Callable[..., Any]]
            checked = {**funcs, CHECKED: lambda _samples, planned=planned: pack_batch(planned)}
            times = measure(checked, samples, sizes["rounds"], sizes["budget_s"])
            rows += _rows(times, kind, batch_size, "process", samples)
        for batch_size in sizes["worker_batch_sizes"] if kind != "lists" else ():
            samples = make_samples(kind, batch_size, config.seed)
            times = {
                name: measure_worker(fn, samples, sizes["worker_batches"]) for name, fn in worker_providers().items()
            }
            times[CHECKED] = measure_worker(pack_batch, samples, sizes["worker_batches"], planned=True)
            rows += _rows(times, kind, batch_size, "worker", samples)
        last = [r for r in rows if r["input"] == kind and r["where"] == "process"][-len(funcs) - 1 :]
        ours = next(r for r in last if r["provider"] == OURS)
        config.say(
            f"  {kind}, batch {ours['batch_size']}: pack_batch {ours['seconds'] * 1e3:.2f} ms, "
            f"{ours['vs_python']:.1f}x faster than per-sample Python, {ours['vs_floor']:.2f}x the floor"
            + (f", {ours['vs_hf']:.1f}x faster than DataCollatorWithFlattening" if "vs_hf" in ours else "")
            + f"; loads checked {ours['checked_vs_ours']:.2f}x its time"
        )
    return rows


def _rows(times: dict[str, float], kind: str, batch_size: int, where: str, samples: Samples) -> list[dict[str, Any]]:
    tokens = sum(len(s["input_ids"]) for s in samples)
    rows: list[dict[str, Any]]
    rows = [
        {
            "provider": name,
            "batch_size": batch_size,
            "input": kind,
            "where": where,
            "seconds": t,
            "tokens": tokens,
            "vs_floor": t / times[FLOOR],
            "vs_python": times[PYTHON] / t,
        }
        for name, t in times.items()
    ]
    for row in rows:
        if row["provider"] == OURS:
            row["checked_vs_ours"] = times[CHECKED] / row["seconds"]
    if HF in times:
        for row in rows:
            row["vs_hf"] = times[HF] / row["seconds"]
    return rows
