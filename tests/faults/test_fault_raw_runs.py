"""Raw-data runs that lose a worker or are split into shards: a worker killed with SIGKILL (as the out-of-memory
killer does) is seen at once and its chunk counted again, or the run stops naming the chunk, never hangs; parts
merge in any order, from copies of the data anywhere, and a refusal says which setting differs or which file
is damaged. Every test that runs workers has a deadline: a hang fails it instead of stopping the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from PIL import Image

from omnibal_kernels.cli import main
from omnibal_kernels.raw_lengths import CountOptions, lengths_from_raw, merge_length_parts
from omnibal_kernels.raw_lengths.count import ChunkCounter
from omnibal_kernels.raw_lengths.tiny import tiny_model_folder

ROOT = Path(__file__).resolve().parents[2]
LINUX = sys.platform.startswith("linux")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("models") / "qwen2vl", "qwen2vl")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    for i in range(8):
        Image.new("RGB", (100 + 90 * i, 400 - 30 * i)).save(root / f"{i}.png")
    return root


def _records(n: int, frames: int = 0) -> list:
    """``n`` samples, some with images; with ``frames``, each sample also shows a video of that many frame files
    (whose headers are all read: a slow sample)."""
    out = []
    for i in range(n):
        rec = {
            "image": [f"{(i + j) % 8}.png" for j in range(i % 3)],
            "conversations": [
                {"from": "human", "value": "<image>" * (i % 3) + f"What is in picture {i}?"},
                {"from": "gpt", "value": "A cat " * (1 + i % 5)},
            ],
        }
        if frames:
            rec["video"] = [[f"{i % 8}.png"] * frames]  # the frames of a video have one size
            rec["conversations"][0]["value"] += "<video>"
        out.append(rec)
    return out


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (TimeoutError) instead of hanging."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _killing(chunk_start: int, marker: Path, times: int):
    """A ``ChunkCounter.count`` whose worker process SIGKILLs itself on the chunk starting at ``chunk_start``,
    the first ``times`` times (counted in ``marker``): the forked workers inherit it."""
    real = ChunkCounter.count

    def count(self, records, start):
        if start == chunk_start and os.getpid() != PARENT:
            deaths = int(marker.read_text()) if marker.exists() else 0
            if deaths < times:
                marker.write_text(str(deaths + 1))
                os.kill(os.getpid(), signal.SIGKILL)
        return real(self, records, start)

    return count


PARENT = os.getpid()


@pytest.mark.skipif(not LINUX, reason="fork and SIGKILL")
def test_a_chunk_whose_worker_dies_once_is_counted_again(folder, images, tmp_path, monkeypatch):
    records = _records(30)
    ref = lengths_from_raw(records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0)
    marker = tmp_path / "deaths"
    monkeypatch.setattr(ChunkCounter, "count", _killing(8, marker, times=1))
    with deadline(120):
        got = lengths_from_raw(
            records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=2, chunk_size=4
        )
    assert marker.read_text() == "1"
    for name in ("index", "vit", "llm"):
        assert np.array_equal(getattr(got, name), getattr(ref, name))


@pytest.mark.skipif(not LINUX, reason="fork and SIGKILL")
def test_a_chunk_whose_worker_dies_twice_stops_the_run_naming_it(folder, images, tmp_path, monkeypatch, capsys):
    records = _records(30)
    data = _jsonl(tmp_path / "data.jsonl", records)
    work = tmp_path / "work"
    marker = tmp_path / "deaths"
    monkeypatch.setattr(ChunkCounter, "count", _killing(8, marker, times=10))
    t0 = time.monotonic()
    with (
        deadline(120),
        pytest.raises(
            ChildProcessError,
            match=r"samples 8\.\.11: .*died 2 times \(killed by "
            r"SIGKILL.*kept in",
        ),
    ):
        lengths_from_raw(
            data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=2, chunk_size=4, work_dir=work
        )
    assert time.monotonic() - t0 < 60 and marker.read_text() == "2"
    finished = {p.name: p.stat().st_mtime_ns for p in work.glob("chunk-*.npz")}
    assert finished and "chunk-000000000008-000000000012.npz" not in finished
    marker.write_text("0")
    args = [
        "lengths",
        str(data),
        "--tokenizer",
        str(folder),
        "--model",
        "qwen2vl",
        "--image-root",
        str(images),
        "--workers",
        "2",
        "--chunk-size",
        "4",
        "--work-dir",
        str(tmp_path / "cli"),
        "-o",
        str(tmp_path / "o.json"),
    ]
    with deadline(120):
        assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "samples 8..11" in err and "Traceback" not in err

    monkeypatch.undo()  # the data were never the problem: the rerun resumes the finished chunks
    resumed = lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, chunk_size=4, work_dir=work
    )
    assert all((work / name).stat().st_mtime_ns == t for name, t in finished.items())
    ref = lengths_from_raw(records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0)
    assert np.array_equal(resumed.llm, ref.llm) and np.array_equal(resumed.index, ref.index)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="/proc, fork and SIGKILL")
def test_the_command_line_survives_a_worker_killed_from_outside(folder, images, tmp_path):
    records = _records(120, frames=60)
    data = _jsonl(tmp_path / "data.jsonl", records)
    work = tmp_path / "work"
    out = tmp_path / "lengths.json"
    cmd = [
        sys.executable,
        "-m",
        "omnibal_kernels",
        "lengths",
        str(data),
        "--tokenizer",
        str(folder),
        "--model",
        "qwen2vl",
        "--image-root",
        str(images),
        "--workers",
        "2",
        "--chunk-size",
        "2",
        "--work-dir",
        str(work),
        "-o",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.monotonic()
        while not list(work.glob("chunk-*.npz")) and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert proc.poll() is None and len(workers) == 2, "the run must still be counting when a worker is killed"
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    ref = lengths_from_raw(records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0)
    got = json.loads(out.read_text())
    assert [r["token_num"] for r in got] == ref.llm.tolist()


# ------------------------------------------------------------------------------------------ merging shards


def _shards(data, folder, images, n, out_dir, **kw):
    for i in range(n):
        lengths_from_raw(
            data,
            folder,
            CountOptions(model="qwen2vl", image_root=images, on_error="skip"),
            num_workers=0,
            shard=(i, n),
            **kw,
        ).save_part(out_dir / f"part_{i}.npz")
    return sorted(out_dir.glob("part_*.npz"))  # the shell's order: part_0, part_1, part_10, part_2, ...


def test_eleven_shards_of_five_samples_merge_in_the_shells_order(folder, images, tmp_path):
    records = _records(5)
    records[3]["image"] = ["missing.png"]
    data = _jsonl(tmp_path / "data.jsonl", records)
    parts = _shards(data, folder, images, 11, tmp_path)
    assert [p.name for p in parts][:3] == ["part_0.npz", "part_1.npz", "part_10.npz"]
    whole = lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images, on_error="skip"), num_workers=0
    )
    merged = merge_length_parts(parts)
    for name in ("index", "vit", "llm"):
        assert np.array_equal(getattr(merged, name), getattr(whole, name))
    assert merged.issues == whole.issues and merged.skipped.tolist() == [3]
    out = tmp_path / "merged.json"
    assert main(["lengths", "--merge", *map(str, parts), "-o", str(out)]) == 0
    assert [r["token_num"] for r in json.loads(out.read_text())] == whole.llm.tolist()
    with pytest.raises(ValueError, match=r"missing: 4\b"):
        merge_length_parts([p for p in parts if p.name != "part_4.npz"])
    with pytest.raises(ValueError, match="shard 4/11 is given twice"):
        merge_length_parts(parts + [tmp_path / "part_4.npz"])


def test_parts_from_copies_of_the_data_elsewhere_merge(folder, images, tmp_path):
    records = _records(12)
    here, there = tmp_path / "here", tmp_path / "there"
    for d in (here, there):
        d.mkdir()
    data = _jsonl(here / "data.jsonl", records)
    # The other machine: the data, the model folder and the images copied to other paths, with other times.
    shutil.copy(data, there / "train.jsonl")
    os.utime(there / "train.jsonl", (1e9, 1e9))
    other_folder = shutil.copytree(folder, there / "model")
    other_images = shutil.copytree(images, there / "images")
    lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, shard=(0, 2)
    ).save_part(tmp_path / "p0.npz")
    lengths_from_raw(
        there / "train.jsonl",
        other_folder,
        CountOptions(model="qwen2vl", image_root=other_images),
        num_workers=0,
        shard=(1, 2),
    ).save_part(tmp_path / "p1.npz")
    merged = merge_length_parts([tmp_path / "p1.npz", tmp_path / "p0.npz"])
    whole = lengths_from_raw(records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0)
    assert np.array_equal(merged.vit, whole.vit) and np.array_equal(merged.llm, whole.llm)

    # A re-copied file (new time, same bytes) resumes its chunks.
    work = tmp_path / "work"
    lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, chunk_size=5, work_dir=work
    )
    saved = {p.name: p.stat().st_mtime_ns for p in work.glob("chunk-*.npz")}
    shutil.copy(there / "train.jsonl", data)
    lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, chunk_size=5, work_dir=work
    )
    assert {p.name: p.stat().st_mtime_ns for p in work.glob("chunk-*.npz")} == saved


def test_a_refused_merge_names_the_setting_that_differs(folder, images, tmp_path):
    records = _records(10)
    data = _jsonl(tmp_path / "data.jsonl", records)
    lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, shard=(0, 2)
    ).save_part(tmp_path / "a0.npz")
    lengths_from_raw(
        data, folder, CountOptions(model="qwen2vl", image_root=images, max_length=4096), num_workers=0, shard=(1, 2)
    ).save_part(tmp_path / "a1.npz")
    with pytest.raises(ValueError, match=r"options\.max_length: 4096 in a1\.npz, None in a0\.npz"):
        merge_length_parts([tmp_path / "a0.npz", tmp_path / "a1.npz"])
    records[7]["conversations"][1]["value"] = "another answer"
    other = _jsonl(tmp_path / "other.jsonl", records)
    lengths_from_raw(
        other, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, shard=(1, 2)
    ).save_part(tmp_path / "b1.npz")
    with pytest.raises(ValueError, match=r"another run than .*a0\.npz: data: 'sha256:"):
        merge_length_parts([tmp_path / "a0.npz", tmp_path / "b1.npz"])


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "not npz"])
def test_a_damaged_part_is_one_line(folder, images, tmp_path, capsys, damage):
    data = _jsonl(tmp_path / "data.jsonl", _records(6))
    parts = _shards(data, folder, images, 2, tmp_path)
    blob = parts[1].read_bytes()
    parts[1].write_bytes(
        {
            "empty": b"",
            "truncated": blob[: len(blob) // 2],
            "garbage": os.urandom(len(blob)),
            "not npz": b"just some text\n",
        }[damage]
    )
    with pytest.raises(ValueError, match=r"part_1\.npz is damaged"):
        merge_length_parts(parts)
    status = main(["lengths", "--merge", *map(str, parts), "-o", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "part_1.npz is damaged" in err


def test_a_damaged_chunk_in_the_work_folder_is_counted_again(folder, images, tmp_path, capsys):
    records = _records(12)
    work = tmp_path / "work"
    first = lengths_from_raw(
        records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, chunk_size=5, work_dir=work
    )
    chunk = sorted(work.glob("chunk-*.npz"))[1]
    chunk.write_bytes(chunk.read_bytes()[:40])
    again = lengths_from_raw(
        records, folder, CountOptions(model="qwen2vl", image_root=images), num_workers=0, chunk_size=5, work_dir=work
    )
    assert f"{chunk} is damaged" in capsys.readouterr().err
    assert np.array_equal(again.llm, first.llm) and np.array_equal(again.index, first.index)
