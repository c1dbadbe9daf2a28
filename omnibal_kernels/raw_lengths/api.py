"""Length files from raw data sets: chunks over worker processes, shards, resumable runs, merged parts.

:func:`lengths_from_raw` counts every sample of a raw data set (a JSON / JSON Lines file, a list of records or
a ``datasets.Dataset``) for one model and returns a :class:`RawLengths`: the loads of the kept samples, their
indices in the data, and every problem found. The samples of the requested range are cut into chunks of
``chunk_size``; chunks run in ``num_workers`` processes (each loads the tokenizer once) and, with ``work_dir``,
each finished chunk is saved there so that a run that dies resumes where it stopped. ``shard=(i, n)`` counts
the ``i``-th of ``n`` contiguous slices of the data; :func:`merge_length_parts` joins the parts in order.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from .._progress import progress_bar
from .._files import atomic_write
from ..lengths import Lengths, write_lengths
from .count import ISSUE_KINDS, ON_ERROR, ChunkCounter, ChunkResult, load_tokenizer
from .records import RecordError
from .spec import load_model_spec

__all__ = ["RawLengths", "lengths_from_raw", "merge_length_parts", "parse_shard"]

_PART_VERSION = 1
# bytes of a JSON Lines file scanned for line ends at a time
_SCAN_BLOCK = 1 << 26


# --------------------------------------------------------------------------------------------- result


@dataclasses.dataclass
class RawLengths:
    """Loads of the kept samples of a raw data set (or of one shard of it) and what was found on the way."""

    index: np.ndarray
    """``(K,)`` int64 indices, in the data, of the samples whose loads are given, increasing"""
    vit: np.ndarray
    """``(K,)`` int64 ViT load (InternVL tiles, Qwen2-VL patches)"""
    llm: np.ndarray
    """``(K,)`` int64 LLM tokens (chat-templated text plus image tokens)"""
    start: int
    """first sample index of the counted range"""
    stop: int
    """one past the last sample index of the counted range"""
    num_samples: int
    """samples in the whole data set"""
    issues: list
    """``{"index", "kind", "message", "kept"}`` per problem, in sample order"""
    settings: dict
    """the model settings and options the loads were counted with"""

    @property
    def loads(self) -> Lengths:
        """The kept samples' loads as a :class:`~omnibal_kernels.Lengths` (for ``write_lengths``)."""
        return Lengths(self.vit, self.llm)

    @property
    def skipped(self) -> np.ndarray:
        """``(S,)`` int64 indices of the samples in the range that have no loads, increasing."""
        mask = np.ones(self.stop - self.start, dtype=bool)
        mask[self.index - self.start] = False
        return np.flatnonzero(mask).astype(np.int64) + self.start

    def counts(self) -> dict[str, int]:
        """Problems per kind (every kind listed, zeros included)."""
        out = {kind: 0 for kind in ISSUE_KINDS}
        for issue in self.issues:
            out[issue["kind"]] = out.get(issue["kind"], 0) + 1
        return out

    def report(self) -> dict:
        """A JSON-ready summary: sample counts, problems per kind, skipped indices and every problem."""
        return {"num_samples": self.num_samples, "start": self.start, "stop": self.stop,
                "kept": int(self.index.shape[0]), "skipped": self.skipped.tolist(), "counts": self.counts(),
                "issues": self.issues, "settings": self.settings}

    def write(self, path: str | Path) -> tuple[Path, Path]:
        """Write the length file (``.json`` OmniBal list or ``.npz``) and ``<stem>.report.json`` next to it,
        each atomically; returns both paths. The length file lists the kept samples in data order; the
        report's ``skipped`` indices say which samples of the data set it leaves out."""
        path = Path(path)
        fmt = path.suffix.lstrip(".").lower()
        if fmt not in ("json", "npz"):
            raise ValueError(f"output: {str(path)!r} needs a .json or .npz suffix")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_lengths(path, self.loads, fmt=fmt)
        report = path.with_name(path.stem + ".report.json")
        _write_json(report, self.report())
        return path, report

    def save_part(self, path: str | Path) -> Path:
        """Write this shard as one ``.npz`` part for :func:`merge_length_parts` (atomically)."""
        path = Path(path)
        meta = json.dumps({"version": _PART_VERSION, "start": self.start, "stop": self.stop,
                           "num_samples": self.num_samples, "issues": self.issues, "settings": self.settings})
        _write_npz(path, index=self.index, vit=self.vit, llm=self.llm, meta=np.array(meta))
        return path


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    """``numpy.savez`` into ``path``, atomically (its folder is made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def _write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON into ``path``, atomically (its folder is made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as f:
        f.write(json.dumps(obj))


# --------------------------------------------------------------------------------------------- sources


class _Records:
    """Records held in memory (a JSON list file, a Python list)."""

    def __init__(self, records: Sequence[Any], identity: str) -> None:
        self.records, self.identity = records, identity

    def __len__(self) -> int:
        return len(self.records)

    def chunk(self, a: int, b: int) -> list:
        return list(self.records[a:b])


class _JsonLines:
    """A JSON Lines file; only line offsets are kept, each chunk parses its own lines (in its worker)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        st = path.stat()
        self.identity = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        with open(path, "rb") as f:
            if st.st_size == 0:
                starts = ends = np.zeros(0, dtype=np.int64)
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    # in blocks, so that memory holds the line offsets (16 bytes a sample), not the file
                    found = []
                    for lo in range(0, st.st_size, _SCAN_BLOCK):
                        block = np.frombuffer(mm, dtype=np.uint8, count=min(_SCAN_BLOCK, st.st_size - lo),
                                              offset=lo)
                        found.append(np.flatnonzero(block == ord("\n")).astype(np.int64) + lo)
                        del block
                    newlines = np.concatenate(found)
                starts = np.concatenate([[0], newlines + 1])
                ends = np.concatenate([newlines, [st.st_size]])
        # Blank lines are not samples (as in the records reader of today's `lengths`).
        keep = ends - starts > 0
        short = np.flatnonzero(keep & (ends - starts <= 4))
        if short.size:
            with open(path, "rb") as f:
                for i in short:
                    f.seek(int(starts[i]))
                    keep[i] = bool(f.read(int(ends[i] - starts[i])).strip())
        self.starts, self.ends = starts[keep], ends[keep]

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def chunk(self, a: int, b: int) -> list:
        out = []
        with open(self.path, "rb") as f:
            f.seek(int(self.starts[a]) if b > a else 0)
            blob = f.read(int(self.ends[b - 1] - self.starts[a])) if b > a else b""
        base = int(self.starts[a]) if b > a else 0
        for i in range(a, b):
            line = blob[int(self.starts[i]) - base:int(self.ends[i]) - base]
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                out.append(RecordError(f"sample {i}: {self.path}: the line is not JSON ({exc})"))
        return out


class _Dataset:
    """A ``datasets.Dataset``: rows are read chunk by chunk (columns -> row dicts)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.identity = f"datasets:{getattr(ds, '_fingerprint', id(ds))}:{len(ds)}"

    def __len__(self) -> int:
        return len(self.ds)

    def chunk(self, a: int, b: int) -> list:
        cols = self.ds[a:b]
        names = list(cols)
        return [dict(zip(names, values)) for values in zip(*(cols[n] for n in names))]


def _source(data: Any) -> Any:
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise ValueError(f"data: {str(path)!r} is not a file")
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
        if head.startswith(b"["):
            try:
                records = json.loads(path.read_text())
            except ValueError as exc:
                raise ValueError(f"data: {path} is not valid JSON ({exc})") from exc
            st = path.stat()
            return _Records(records, f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}")
        return _JsonLines(path)
    if hasattr(data, "column_names") and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _Dataset(data)
    if isinstance(data, Sequence):
        digest = hashlib.sha1(json.dumps(list(data), default=repr, sort_keys=True).encode()).hexdigest()
        return _Records(data, f"records:{len(data)}:{digest}")
    raise TypeError(f"data must be a path, a list of records or a datasets.Dataset, got {type(data).__name__}")


# --------------------------------------------------------------------------------------------- workers

_WORKER: dict = {}


def _counter(options: dict) -> ChunkCounter:
    tok = load_tokenizer(options["tokenizer"], options["trust_remote_code"])
    spec = load_model_spec(options["tokenizer"], options["model"], tok).with_overrides(**options["overrides"])
    return ChunkCounter(spec, tok, image_root=options["image_root"], max_length=options["max_length"],
                        on_error=options["on_error"], add_special_tokens=options["add_special_tokens"],
                        exif_transpose=options["exif_transpose"])


def _init_worker(source: Any, options: dict) -> None:
    # One tokenizer per process; its own thread pool would only compete with the other workers.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["source"], _WORKER["counter"] = source, _counter(options)


def _count_chunk(bounds: tuple[int, int]) -> tuple[int, int, ChunkResult]:
    a, b = bounds
    counter: ChunkCounter = _WORKER["counter"]
    return a, b, counter.count(_WORKER["source"].chunk(a, b), a)


def _chunk_file(work_dir: Path, a: int, b: int) -> Path:
    return work_dir / f"chunk-{a:012d}-{b:012d}.npz"


def _save_chunk(path: Path, result: ChunkResult) -> None:
    meta = np.array(json.dumps(result.issues))
    _write_npz(path, index=result.index, vit=result.vit, llm=result.llm, issues=meta)


def _load_chunk(path: Path) -> ChunkResult:
    with np.load(path) as z:
        return ChunkResult(z["index"], z["vit"], z["llm"], json.loads(str(z["issues"])))


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


def lengths_from_raw(data: Any, tokenizer: str | Path, model: str, *, image_root: Optional[str | Path] = None,
                     max_length: Optional[int] = None, on_error: str = "error", num_workers: Optional[int] = None,
                     chunk_size: int = 1024, shard: Optional[tuple[int, int]] = None,
                     work_dir: Optional[str | Path] = None, stale_work_dir: str = "error",
                     progress: Optional[bool] = None,
                     trust_remote_code: bool = False, add_special_tokens: Optional[bool] = None,
                     exif_transpose: bool = False, overrides: Optional[dict] = None) -> RawLengths:
    """Count every sample's ViT load and LLM tokens of a raw data set as the model's processor would.

    Args:
        data: a ``.json`` (list) or ``.jsonl`` file, a list of records, or a ``datasets.Dataset`` (cast image
            columns to ``datasets.Image(decode=False)`` so that only headers are read). Layouts: see
            :mod:`omnibal_kernels.raw_lengths.records`.
        tokenizer: the folder ``save_pretrained`` wrote for the model or its processor: tokenizer, chat
            template and image-processor settings are all read from it (:func:`load_model_spec`).
        model: ``"internvl"``, ``"qwen2vl"`` or ``"qwen2.5vl"``.
        image_root: folder that relative image and video paths are taken from (default: as given).
        max_length: samples with more LLM tokens are a problem of kind ``over_max_length``.
        on_error: ``"error"`` raises :class:`~omnibal_kernels.raw_lengths.count.SampleError` (a ``ValueError``
            naming the sample and kind) at the first problem; ``"skip"`` leaves every problem sample out;
            ``"report"`` keeps the samples whose loads are still defined (``placeholder_mismatch``,
            ``over_max_length``) and leaves out the others. Every problem is listed in ``issues`` either way.
        num_workers: worker processes (None: one per CPU, at most one per chunk; 0 or 1: in this process).
        chunk_size: samples per chunk (the unit of work, progress and resuming).
        shard: ``(i, n)``: count only the ``i``-th of ``n`` contiguous slices of the data.
        work_dir: keep each finished chunk there; a later call with the same data and options resumes from them.
        stale_work_dir: when ``work_dir`` holds chunks of another run (other data, options or range):
            ``"error"`` raises, ``"restart"`` deletes them (with a note on stderr) and starts over.
        progress: a progress bar on stderr (None: when stderr is a terminal).
        trust_remote_code: passed to ``AutoTokenizer.from_pretrained`` (InternVL-Chat checkpoints need it).
        add_special_tokens: whether the tokenizer adds its special tokens (BOS/EOS) to the rendered chat; None
            (default) as a processor's ``apply_chat_template(tokenize=True)``: added unless the chat already
            starts with the BOS token.
        exif_transpose: swap width and height of images whose EXIF orientation rotates them by 90 degrees.
        overrides: model settings to replace after reading the folder (``ModelSpec`` field names, e.g.
            ``{"max_num": 6}`` for an InternVL run trained with ``max_dynamic_patch=6``).

    Returns:
        :class:`RawLengths`.

    Raises:
        ValueError: bad arguments, a folder without the model's settings, a ``work_dir`` holding another run's
            chunks, or (``on_error="error"``) the first problem sample.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if stale_work_dir not in ("error", "restart"):
        raise ValueError(f"stale_work_dir must be 'error' or 'restart', got {stale_work_dir!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    special = None if add_special_tokens is None else bool(add_special_tokens)
    options = dict(tokenizer=str(Path(tokenizer)), model=model, trust_remote_code=bool(trust_remote_code),
                   image_root=None if image_root is None else str(image_root), max_length=max_length,
                   on_error=on_error, add_special_tokens=special,
                   exif_transpose=bool(exif_transpose), overrides=dict(overrides or {}))
    # Built here first so that a bad folder, template or option fails before any worker starts.
    counter = _counter(options)
    source = _source(data)
    n = len(source)
    i, k = shard if shard is not None else (0, 1)
    if not (isinstance(i, int) and isinstance(k, int) and 0 <= i < k):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    start, stop = i * n // k, (i + 1) * n // k
    settings = {"model": model, "spec": dataclasses.asdict(counter.spec),
                "options": {key: options[key] for key in ("max_length", "on_error", "add_special_tokens",
                                                          "exif_transpose", "image_root")},
                "tokenizer": options["tokenizer"], "tokenizer_fingerprint": _fingerprint(Path(tokenizer)),
                "data": source.identity, "shards": k}
    bounds = [(a, min(a + chunk_size, stop)) for a in range(start, stop, chunk_size)]
    results: dict[int, ChunkResult] = {}
    wd = None if work_dir is None else Path(work_dir)
    if wd is not None:
        wd.mkdir(parents=True, exist_ok=True)
        run_file = wd / "run.json"
        run = {"settings": settings, "start": start, "stop": stop, "chunk_size": chunk_size}
        if run_file.is_file() and json.loads(run_file.read_text()) != json.loads(json.dumps(run)):
            if stale_work_dir != "restart":
                raise ValueError(f"work_dir: {wd} holds chunks of another run (other data, options or range); "
                                 "remove it or give another folder")
            print(f"omnibal-kernels: {wd} holds chunks of another run; starting over", file=sys.stderr)
            for old in wd.glob("chunk-*.npz"):
                old.unlink()
            run_file.unlink()
        if not run_file.is_file():
            _write_json(run_file, run)
        for a, b in bounds:
            if _chunk_file(wd, a, b).is_file():
                results[a] = _load_chunk(_chunk_file(wd, a, b))
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
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
            with ctx.Pool(workers, initializer=_init_worker, initargs=(source, options)) as pool:
                for a, b, result in pool.imap_unordered(_count_chunk, todo):
                    done(a, b, result)
    finally:
        bar.close()
    parts = [results[a] for a, _ in bounds]
    return RawLengths(
        index=np.concatenate([p.index for p in parts]) if parts else np.zeros(0, np.int64),
        vit=np.concatenate([p.vit for p in parts]) if parts else np.zeros(0, np.int64),
        llm=np.concatenate([p.llm for p in parts]) if parts else np.zeros(0, np.int64),
        start=start, stop=stop, num_samples=n, issues=[d for p in parts for d in p.issues], settings=settings)


def merge_length_parts(paths: Iterable[str | Path]) -> RawLengths:
    """Join the parts written by ``save_part`` for shards ``0 .. n-1`` of one run, in sample order.

    Raises:
        ValueError: a file that is not a part, parts of different runs (data, model, options), a shard
            missing or given twice, or ranges that do not tile the data set.
    """
    loaded = []
    for p in paths:
        p = Path(p)
        try:
            with np.load(p) as z:
                meta = json.loads(str(z["meta"]))
                loaded.append((p, meta, z["index"], z["vit"], z["llm"]))
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"--merge: {p} is not a length part written with --shard ({exc})") from exc
    if not loaded:
        raise ValueError("--merge: no parts given")
    first = loaded[0][1]
    for p, meta, *_ in loaded:
        if meta.get("version") != _PART_VERSION or meta["settings"] != first["settings"] \
                or meta["num_samples"] != first["num_samples"]:
            raise ValueError(f"--merge: {p} is a part of another run than {loaded[0][0]} "
                             "(other data, model, options or shard count)")
    loaded.sort(key=lambda t: t[1]["start"])
    n, shards = first["num_samples"], first["settings"]["shards"]
    if len(loaded) != shards:
        raise ValueError(f"--merge: the run has {shards} shards but {len(loaded)} parts were given")
    edge = 0
    for p, meta, *_ in loaded:
        if meta["start"] != edge:
            raise ValueError(f"--merge: {p} starts at sample {meta['start']}, expected {edge} "
                             "(a shard is missing or given twice)")
        edge = meta["stop"]
    if edge != n:
        raise ValueError(f"--merge: the parts end at sample {edge} of {n}")
    return RawLengths(index=np.concatenate([t[2] for t in loaded]).astype(np.int64),
                      vit=np.concatenate([t[3] for t in loaded]).astype(np.int64),
                      llm=np.concatenate([t[4] for t in loaded]).astype(np.int64),
                      start=0, stop=n, num_samples=n, issues=[d for t in loaded for d in t[1]["issues"]],
                      settings=first["settings"])
