"""Length files from raw data sets: chunks over worker processes, shards, resumable runs.

:func:`lengths_from_raw` counts every sample of a raw data set (a JSON / JSON Lines file, a list of records or
a ``datasets.Dataset``) for one model and returns a :class:`RawLengths`: the loads of the kept samples, their
indices in the data, and every problem found. The samples of the requested range are cut into chunks of
``chunk_size``; chunks run in ``num_workers`` processes (each loads the tokenizer once; :mod:`.pool`) and, with
``work_dir``, each finished chunk is saved there so that a run that dies resumes where it stopped.
``shard=(i, n)`` counts the ``i``-th of ``n`` contiguous slices of the data; :func:`merge_length_parts` joins
the parts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

from .._files import write_json
from .._progress import progress_bar
from .count import ChunkCounter, ChunkResult
from .media import pil_pixel_limit
from .options import CountOptions
from .pool import WorkerDied, count_in_workers
from .result import RawLengths, check_sample_arrays, joined_loads, sample_arrays, write_npz
from .sources import open_source
from .spec import load_model_spec
from .tokens import load_tokenizer

__all__ = ["lengths_from_raw", "parse_shard"]


class CounterArgs(NamedTuple):
    """What a worker process builds its counter from: the model folder and the run's options."""

    tokenizer: str
    options: CountOptions


def make_counter(args: CounterArgs) -> ChunkCounter:
    """The counter for one run (in this process or in a worker)."""
    options = args.options
    tok = load_tokenizer(args.tokenizer, options.trust_remote_code)
    spec = load_model_spec(args.tokenizer, options.model, tok).with_overrides(**options.overrides)
    return ChunkCounter(spec, tok, options)


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha1()
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in (".json", ".jinja", ".txt", ".model", ".tiktoken"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``; a ``ValueError`` naming ``--shard`` otherwise."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like i/n (e.g. 0/8), got {text!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {text}: need 0 <= i < n")
    return i, n


# ---------------------------------------------------------------------------------------- the work folder


# What a saved chunk holds; a work folder of another format holds another run's chunks.
_CHUNK_FORMAT = 2


def _chunk_file(work_dir: Path, a: int, b: int) -> Path:
    return work_dir / f"chunk-{a:012d}-{b:012d}.npz"


def _save_chunk(path: Path, result: ChunkResult) -> None:
    write_npz(path, issues=np.array(json.dumps(result.issues)), **sample_arrays(result))


def _load_chunk(path: Path, labels: bool) -> Optional[ChunkResult]:
    """A saved chunk (with label tokens when the run counts them); None (the file removed, with a note) when it
    cannot be read or its arrays disagree."""
    try:
        with np.load(path, allow_pickle=False) as z:
            chunk = ChunkResult(
                z["index"],
                z["vit"],
                z["llm"],
                z["vit_seqlens"],
                z["vit_seqlens_offsets"],
                z["label"] if labels else None,
                json.loads(str(z["issues"])),
            )
        check_sample_arrays(chunk)
        return chunk
    except Exception as exc:  # zipfile, zlib, numpy and json each raise their own types for a damaged file
        print(f"omnibal-kernels: {path} is damaged ({type(exc).__name__}); counting its chunk again", file=sys.stderr)
        path.unlink()
        return None


def _resume(
    wd: Path, run: dict, stale_work_dir: str, bounds: list[tuple[int, int]], labels: bool
) -> dict[int, ChunkResult]:
    """Open the work folder for ``run``; the chunks of ``bounds`` already saved there."""
    wd.mkdir(parents=True, exist_ok=True)
    run_file = wd / "run.json"
    if run_file.is_file() and json.loads(run_file.read_text()) != json.loads(json.dumps(run)):
        if stale_work_dir != "restart":
            raise ValueError(
                f"work_dir: {wd} holds chunks of another run (other data, options, range or chunk "
                "format); remove it or give another folder"
            )
        print(f"omnibal-kernels: {wd} holds chunks of another run; starting over", file=sys.stderr)
        for old in wd.glob("chunk-*.npz"):
            old.unlink()
        run_file.unlink()
    if not run_file.is_file():
        write_json(run_file, run)
    results = {}
    for a, b in bounds:
        if _chunk_file(wd, a, b).is_file():
            saved = _load_chunk(_chunk_file(wd, a, b), labels)
            if saved is not None:
                results[a] = saved
    return results


# ---------------------------------------------------------------------------------------- the run


def _check_run(chunk_size: object, stale_work_dir: object) -> None:
    if stale_work_dir not in ("error", "restart"):
        raise ValueError(f"stale_work_dir must be 'error' or 'restart', got {stale_work_dir!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _settings(args: CounterArgs, counter: ChunkCounter, data: Any, identity: str, shards: int) -> dict:
    """What the loads depend on (compared when resuming and merging), and where the files were."""
    options = args.options
    opts = ("max_length", "on_error", "add_special_tokens", "exif_transpose", "max_frames", "max_image_pixels")
    where = str(data) if isinstance(data, (str, os.PathLike)) else None
    return {
        "model": options.model,
        "spec": dataclasses.asdict(counter.spec),
        "options": {**{key: getattr(options, key) for key in opts}, "labels": counter.labels},
        "tokenizer_fingerprint": _fingerprint(Path(args.tokenizer)),
        "data": identity,
        "shards": shards,
        "paths": {"data": where, "tokenizer": args.tokenizer, "image_root": options.image_root},
    }


def lengths_from_raw(
    data: Any,
    tokenizer: str | Path,
    options: CountOptions,
    *,
    num_workers: Optional[int] = None,
    chunk_size: int = 1024,
    shard: Optional[tuple[int, int]] = None,
    work_dir: Optional[str | Path] = None,
    stale_work_dir: str = "error",
    progress: Optional[bool] = None,
) -> RawLengths:
    """Count every sample's ViT load, ViT sequences, LLM tokens and label tokens of a raw data set as the
    model's processor and chat template would.

    Args:
        data: a ``.json`` (list) or ``.jsonl`` file (UTF-8, a byte order mark allowed; lines holding only
            whitespace are not samples), a list of records, or a ``datasets.Dataset`` (cast image columns to
            ``datasets.Image(decode=False)`` so that only headers are read). Layouts: see
            :mod:`omnibal_kernels.raw_lengths.records`.
        tokenizer: the folder ``save_pretrained`` wrote for the model or its processor: tokenizer, chat
            template and image-processor settings are all read from it (:func:`load_model_spec`).
        options: how samples are counted (:class:`~omnibal_kernels.raw_lengths.CountOptions`: the model family,
            ``image_root``, the bounds, ``on_error``, label tokens).
        num_workers: worker processes (None: one per CPU, at most one per chunk; 0 or 1: in this process).
            A chunk whose worker dies is counted again once in a new worker (:mod:`.pool`).
        chunk_size: samples per chunk (the unit of work, progress and resuming).
        shard: ``(i, n)``: count only the ``i``-th of ``n`` contiguous slices of the data.
        work_dir: keep each finished chunk there; a later call with the same data and options resumes from them.
        stale_work_dir: when ``work_dir`` holds chunks of another run (other data, options or range):
            ``"error"`` raises, ``"restart"`` deletes them (with a note on stderr) and starts over.
        progress: a progress bar on stderr (None: when stderr is a terminal).

    Returns:
        :class:`RawLengths`, with the ViT sequences of every kept sample (one per InternVL tile, one per Qwen2-VL
        image and video frame group) and, when counted, their label tokens; ``settings["options"]["labels"]``
        says whether they are.

    Raises:
        ValueError: bad arguments, a folder without the model's settings, ``labels=True`` for a template that
            marks nothing, a ``work_dir`` holding another run's chunks, or (``on_error="error"``) the first
            problem sample.
        WorkerDied: a chunk whose worker process died twice (a ``ChildProcessError`` naming its samples); the
            chunks finished before stay in ``work_dir``.
    """
    if not isinstance(options, CountOptions):
        raise TypeError(f"options must be a CountOptions, got {type(options).__name__}")
    _check_run(chunk_size, stale_work_dir)
    if options.max_image_pixels is None:
        options = options.replace(max_image_pixels=pil_pixel_limit())
    args = CounterArgs(str(Path(tokenizer)), options)
    # Built here first so that a bad folder, template or option fails before any worker starts.
    counter = make_counter(args)
    source = open_source(data)
    n = len(source)
    i, k = shard if shard is not None else (0, 1)
    if not (isinstance(i, int) and isinstance(k, int) and 0 <= i < k):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    start, stop = i * n // k, (i + 1) * n // k
    settings = _settings(args, counter, data, source.identity, k)
    bounds = [(a, min(a + chunk_size, stop)) for a in range(start, stop, chunk_size)]
    wd = None if work_dir is None else Path(work_dir)
    results: dict[int, ChunkResult] = {}
    if wd is not None:
        identity = {key: value for key, value in settings.items() if key != "paths"}
        run = {
            "settings": identity,
            "image_root": options.image_root,
            "start": start,
            "stop": stop,
            "chunk_size": chunk_size,
            "chunk_format": _CHUNK_FORMAT,
        }
        results = _resume(wd, run, stale_work_dir, bounds, counter.labels)
    todo = [(a, b) for a, b in bounds if a not in results]
    bar = progress_bar(stop - start, "counting samples", progress)
    bar.update(sum(b - a for a, b in bounds if a in results))
    workers = (os.cpu_count() or 1) if num_workers is None else int(num_workers)
    workers = min(workers, len(todo))

    def done(a: int, b: int, result: ChunkResult) -> None:
        results[a] = result
        if wd is not None:
            _save_chunk(_chunk_file(wd, a, b), result)
        bar.update(b - a)

    try:
        if workers <= 1:
            for a, b in todo:
                done(a, b, counter.count(source.chunk(a, b), a))
        else:
            count_in_workers(source, args, make_counter, todo, workers, done)
    except WorkerDied as exc:
        kept = (
            f"the {len(results)} chunks finished are kept in {wd}: run again to resume"
            if wd is not None
            else "give work_dir to keep the finished chunks"
        )
        raise WorkerDied(f"{exc}; {kept} (a smaller chunk size narrows down the sample)") from None
    finally:
        bar.close()
    parts = [results[a] for a, _ in bounds]
    return RawLengths(
        start=start,
        stop=stop,
        num_samples=n,
        issues=[d for p in parts for d in p.issues],
        settings=settings,
        shard=(i, k),
        **joined_loads(parts, counter.labels),
    )
