"""Files the package writes: whole or not at all (atomic), and only what the reader accepts."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels._files import atomic_write
from omnibal_kernels.balance import Plan
from omnibal_kernels.lengths import write_lengths

ROOT = Path(__file__).resolve().parents[2]


def _plan() -> Plan:
    lengths = ok.Lengths(np.zeros(50, np.int64), np.arange(1, 51))
    return ok.plan_packs(lengths, ok.PlanOptions(vit_capacity=0, llm_capacity=200), world_size=2)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ------------------------------------------------------------------ a writer that fails midway


class _Midway(RuntimeError):
    pass


def _savez_that_fails_midway(file, **arrays):
    """Writes part of an archive, then fails, as a full disk or an interrupt would."""
    (open(file, "wb") if isinstance(file, (str, os.PathLike)) else file).write(b"PK\x03\x04 half an archive")
    raise _Midway("interrupted")


def test_plan_save_interrupted_midway_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.npz"
    first = _plan()
    first.save(target)
    before = target.read_bytes()
    monkeypatch.setattr(np, "savez", _savez_that_fails_midway)
    with pytest.raises(_Midway):
        _plan().save(target)
    assert target.read_bytes() == before and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert Plan.load(target).fingerprint() == first.fingerprint()
    with pytest.raises(_Midway):  # no old file: none is left behind
        monkeypatch.setattr(np, "savez", _savez_that_fails_midway)
        _plan().save(tmp_path / "new.npz")
    assert not (tmp_path / "new.npz").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", ["json", "npz"])
def test_write_lengths_interrupted_midway_keeps_the_old_file(tmp_path, monkeypatch, suffix):
    target = tmp_path / f"lengths.{suffix}"
    write_lengths(target, {"vit": np.array([1, 2]), "llm": np.array([10, 20])})
    before = target.read_bytes()
    if suffix == "npz":
        monkeypatch.setattr(np, "savez", _savez_that_fails_midway)
        loads = {"vit": np.array([3]), "llm": np.array([30])}
    else:

        class Failing(np.ndarray):  # the records run out midway, after the file has begun
            def tolist(self):
                yield from (1, 2)
                raise _Midway("interrupted")

        loads = {"vit": np.zeros(4, np.int64), "llm": np.arange(4).view(Failing)}
        monkeypatch.setattr("omnibal_kernels.lengths.write._as_load_array", lambda values, *a, **k: values)
    with pytest.raises(_Midway):
        write_lengths(target, loads)
    assert target.read_bytes() == before and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert ok.load_lengths(target).llm.tolist() == [10, 20]


def test_atomic_write_keeps_permissions_and_names_the_target_in_errors(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    with atomic_write(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        with atomic_write(tmp_path / "file" / "out.npz"):
            pass
    assert info.value.filename == str(tmp_path / "file" / "out.npz")
    with pytest.raises(IsADirectoryError):
        with atomic_write(tmp_path):
            pass
    with pytest.raises(FileNotFoundError):
        with atomic_write(tmp_path / "missing" / "out.npz"):
            pass
    assert _leftovers(tmp_path) == []


def test_plan_save_appends_npz_like_numpy_and_returns_the_path(tmp_path):
    plan = _plan()
    assert plan.save(tmp_path / "plan") == tmp_path / "plan.npz"
    assert plan.save(tmp_path / "p.npz") == tmp_path / "p.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz", "plan.npz"]
    assert Plan.load(tmp_path / "plan.npz").fingerprint() == plan.fingerprint()


# ------------------------------------------------------------------ a process killed mid-write

_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from omnibal_kernels import _files
    from omnibal_kernels.lengths import write_lengths

    target, how = sys.argv[1], sys.argv[2]

    def stop_here():
        print("writing", flush=True)
        time.sleep(120)

    if how == "raw":  # killed with 4 MB of a file written and more to come
        with _files.atomic_write(target) as f:
            f.write(b"x" * (4 << 20))
            f.flush()
            stop_here()
    else:  # killed after a whole length file reached the temporary file, before the rename
        real_fsync = os.fsync
        def fsync(fd):
            real_fsync(fd)
            stop_here()
        _files.os.fsync = fsync
        n = 100_000
        write_lengths(target, (np.ones(n, np.int64), np.full(n, 7, np.int64)))
""")


@pytest.mark.parametrize("how", ["raw", "write_lengths"])
@pytest.mark.parametrize("old", [True, False])
def test_a_process_killed_mid_write_leaves_the_old_file_or_none(tmp_path, how, old):
    target = tmp_path / "lengths.json"
    if old:
        write_lengths(target, {"vit": np.array([1]), "llm": np.array([5])})
    before = target.read_bytes() if old else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(target), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = child.stdout.readline()
        assert line == "writing\n", child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    if old:
        assert target.read_bytes() == before
        assert ok.load_lengths(target).llm.tolist() == [5]
    else:
        assert not target.exists()
    assert len(_leftovers(tmp_path)) == 1  # the killed writer's temporary file, never the target


# ------------------------------------------------------------------ the writer refuses what the reader refuses

_LOADS = st.lists(
    st.one_of(
        st.integers(-5, 2**31 + 5),
        st.integers(-(2**70), 2**70),
        st.sampled_from([0, 2**31 - 1, 2**31, 2**63, -1, 1.0, 2.5, 1e30, float("nan")]),
    ),
    min_size=0,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    vit=_LOADS,
    llm=_LOADS,
    suffix=st.sampled_from(["json", "npz"]),
    dtype=st.sampled_from([None, np.int32, np.int64, np.uint64, np.float64]),
)
def test_what_write_lengths_writes_load_lengths_reads_back(tmp_path_factory, vit, llm, suffix, dtype):
    path = tmp_path_factory.mktemp("w") / f"l.{suffix}"
    try:
        arrays = [np.array(v, dtype=dtype) for v in (vit, llm)]  # dtype None: numpy's (object for huge ints)
    except (OverflowError, ValueError):
        return  # not representable in that dtype: nothing to write
    try:
        write_lengths(path, {"vit": arrays[0], "llm": arrays[1]})
    except (ValueError, TypeError) as exc:
        assert str(path) in str(exc) and ("sample" in str(exc) or "integers" in str(exc)), exc
        assert not path.exists()
        return
    loaded = ok.load_lengths(path)  # must not raise: the writer checked with the reader's rules
    assert loaded.vit.tolist() == [int(x) for x in arrays[0]] and loaded.llm.tolist() == [int(x) for x in arrays[1]]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"vit": [1], "llm": [2**31]}, "sample 0: llm is too large"),
        ({"vit": [-1, 0], "llm": [2, 3]}, "sample 0: vit is negative"),
        ({"vit": [0, 0], "llm": [2, 2**63]}, "sample 1: llm is too large"),
        ({"vit": [0], "llm": [1e30]}, "sample 0: llm is too large"),
        ({"vit": [0], "llm": [1.5]}, "sample 0: llm is not an integer"),
        ({"vit": [], "llm": []}, "no samples"),
    ],
)
@pytest.mark.parametrize("suffix", ["json", "npz"])
def test_write_lengths_refuses_values_the_reader_refuses(tmp_path, bad, message, suffix):
    path = tmp_path / f"l.{suffix}"
    loads = {k: np.array(v, dtype=np.uint64 if 2**63 in v else None) for k, v in bad.items()}
    with pytest.raises(ValueError, match=message) as info:
        write_lengths(path, loads)
    assert str(path) in str(info.value) and not path.exists()


def test_empty_length_files_are_written_and_read_only_when_asked(tmp_path):
    empty = {"vit": np.zeros(0, np.int64), "llm": np.zeros(0, np.int64)}
    for suffix in ("json", "npz"):
        path = write_lengths(tmp_path / f"e.{suffix}", empty, allow_empty=True)
        assert len(ok.load_lengths(path, allow_empty=True)) == 0
        if suffix == "json":
            assert json.loads(path.read_text()) == []
