"""The command line under bad files and flags: one line ``omnibal-kernels: error: ...`` and status 2, never a
traceback; in process and through ``python -m omnibal_kernels``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.balance import Plan
from omnibal_kernels.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """main(argv) in process: (status, stdout, stderr); argparse's own usage errors exit with status 2."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def _expand(args: list[str], files: dict[str, Path]) -> list[str]:
    """``{name}`` in each argument replaced by that file's path."""
    out = []
    for arg in args:
        for name, path in files.items():
            arg = arg.replace("{" + name + "}", str(path))
        out.append(arg)
    return out


def _assert_one_line_error(status: int, err: str, *fragments: str) -> None:
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omnibal-kernels: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    np.save(tmp_path / "ok.npy", np.arange(100, 400))
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "folder.npz").mkdir()
    (tmp_path / "regular").write_text("not a folder")
    (tmp_path / "corrupt.npz").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "two.json").write_text('[{"token_num": 1}]\n[{"token_num": 2}]')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "utf16.json").write_bytes('[{"token_num": 1}]'.encode("utf-16"))
    records = [{"image_sizes": [[448, 448]], "text_tokens": 12}, {"image_sizes": [], "text_tokens": "12"}]
    (tmp_path / "string_counts.json").write_text(json.dumps(records))
    (tmp_path / "records.json").write_text(json.dumps(records[:1]))
    (tmp_path / "bad.jsonl").write_text('{"image_sizes": [], "text_tokens": 3}\n{"text_tokens": 4,}\n')
    return {p.name: p for p in tmp_path.iterdir()} | {"dir": tmp_path}


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["plan", "{folder.json}"], ["folder.json: is a directory"]),
        (["plan", "{dir}"], ["is a directory"]),
        (["plan", "{corrupt.npz}"], ["corrupt.npz: not a readable .npz file"]),
        (["plan", "{two.json}"], ["two.json: ", "after the closing ']'"]),
        (["plan", "{empty.json}"], ["empty.json: no samples"]),
        (["plan", "{utf16.json}"], ["UTF-16"]),
        (["plan", "{ok.npy}", "--out", "{regular}/plan.npz"], ["regular", "is not a directory"]),
        (["plan", "{ok.npy}", "--out", "{dir}/missing/plan.npz"], ["missing", "does not exist"]),
        (["plan", "{ok.npy}", "--out", "{folder.npz}"], ["Is a directory", "folder.npz"]),
        (
            ["plan", "{ok.npy}", "--vit-capacity", "1", "--llm-capacity", "9223372036854775808"],
            ["llm_capacity must be at most 2**48"],
        ),
        (
            ["plan", "{ok.npy}", "--vit-capacity", "9223372036854775807", "--llm-capacity", "1000"],
            ["vit_capacity must be at most 2**48"],
        ),
        (["plan", "{ok.npy}", "--vit-capacity", "-1", "--llm-capacity", "1000"], ["vit_capacity"]),
        (["plan", "{ok.npy}", "--epoch", str(2**64)], ["epoch must be a non-negative int below 2**63"]),
        (["plan", "{ok.npy}", "--epoch", "-1"], ["epoch"]),
        (["plan", "{ok.npy}", "--seed", str(2**64)], ["seed must be in"]),
        (["plan", "{ok.npy}", "--world-size", "0"], ["world_size"]),
        (["plan", "{ok.npy}", "--world-size", str(2**63)], ["world_size"]),
        (["plan", "{ok.npy}", "--target-batch-size", "nan"], ["target_batch_size"]),
        (["plan", "{ok.npy}", "--target-batch-size=-inf"], ["target_batch_size"]),
        (["plan", "{ok.npy}", "--vit-capacity", "0", "--llm-capacity", "10"], ["exceed the capacities"]),
        (
            ["lengths", "{string_counts.json}", "-o", "{dir}/out.json"],
            ["string_counts.json: record 1: 'text_tokens' must be a token count or a token list, got '12'"],
        ),
        (["lengths", "{bad.jsonl}", "-o", "{dir}/out.json"], ["bad.jsonl: line 2 is not a JSON record"]),
        (["lengths", "{folder.json}", "-o", "{dir}/out.json"], ["folder.json: is a directory"]),
        (["lengths", "{dir}/missing.json", "-o", "{dir}/out.json"], ["missing.json"]),
        (["lengths", "{records.json}", "-o", "{regular}/out.json"], ["regular/out.json"]),
        (["lengths", "{records.json}", "-o", "{dir}/out.txt"], ["out.txt", "use a .json, .jsonl or .npz suffix"]),
        (["lengths", "{records.json}", "-o", "{dir}/out.json", "--num-image-token", str(2**63)], ["num_image_token"]),
        (["lengths", "{records.json}", "-o", "{dir}/out.json", "--num-image-token", "-1"], ["num_image_token"]),
        (["lengths", "{records.json}", "-o", "{dir}/out.json", "--max-num", str(2**31)], ["max_num must be <= 256"]),
        (
            ["lengths", "{records.json}", "-o", "{dir}/out.json", "--model", "qwen2vl", "--patch-size", str(2**63)],
            ["patch_size"],
        ),
    ],
)
def test_bad_files_and_flags_print_one_line_and_exit_2(files, capsys, args, fragments):
    argv = _expand(args, files)
    status, out, err = _run([*argv, "--no-progress"] if argv[0] == "lengths" else argv, capsys)
    _assert_one_line_error(status, err, *fragments)
    assert not (files["dir"] / "out.json").exists()


def test_out_prints_the_path_it_wrote(files, capsys, monkeypatch):
    monkeypatch.chdir(files["dir"])
    status, out, err = _run(["plan", "ok.npy", "--world-size", "2", "--out", "plan"], capsys)
    assert status == 0, err
    assert out.strip().splitlines()[-1] == "plan written to plan.npz"
    assert Plan.load("plan.npz").world_size == 2 and not Path("plan").exists()


_PLAN_FLAG_VALUES = {
    "--world-size": ["0", "-3", "1", "7", str(2**24 + 1), str(2**63), "x"],
    "--target-batch-size": ["0", "-1", "nan", "inf", "1e308", "1e-300", "3", "x"],
    "--seed": ["-1", str(-(2**63) - 1), str(2**64 - 1), str(2**64), "1.5"],
    "--epoch": ["0", "-1", str(2**63 - 1), str(2**63), str(2**64)],
    "--method": ["balanced", "isf", "random", "nope"],
    "--oversize": ["error", "single", "drop", "nope"],
}
_CAPACITIES = ["-1", "0", "1", "500", str(2**48), str(2**48 + 1), str(2**63 - 1), str(2**64), str(2**200)]


# flag values may make the plan warn (capacities raised past the target's, a step that repeats packs): what is
# tested here is that nothing ends in a traceback
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.TooFewPacksWarning")
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")
@settings(max_examples=80, deadline=None)
@given(
    chosen=st.dictionaries(st.sampled_from(sorted(_PLAN_FLAG_VALUES)), st.integers(0, 10), max_size=3),
    caps=st.none() | st.tuples(st.sampled_from(_CAPACITIES), st.sampled_from(_CAPACITIES)),
    drop_last=st.booleans(),
    as_json=st.booleans(),
)
def test_no_combination_of_plan_flags_gives_a_traceback(tmp_path_factory, chosen, caps, drop_last, as_json):
    folder = tmp_path_factory.mktemp("cli")
    np.save(folder / "l.npy", np.arange(1, 301))
    argv = ["plan", str(folder / "l.npy")]
    for flag, k in chosen.items():
        values = _PLAN_FLAG_VALUES[flag]
        argv += [f"{flag}={values[k % len(values)]}"]
    if caps is not None:
        argv += [f"--vit-capacity={caps[0]}", f"--llm-capacity={caps[1]}"]
    argv += ["--drop-last"] * drop_last + ["--json"] * as_json
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse: a value that is not a number or a choice
            status = exc.code
            assert any(bad in " ".join(argv) for bad in ("=x", "=nope", "=1.5")), (argv, err.getvalue())
            parsed = False
        else:
            parsed = True
    assert status in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if status == 2 and parsed:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("omnibal-kernels: error: "), (argv, err.getvalue())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["plan", "{folder.json}"], "is a directory"),
        (["plan", "{ok.npy}", "--vit-capacity", "1", "--llm-capacity", "9223372036854775808"], "llm_capacity"),
    ],
)
def test_through_a_subprocess(files, args, fragment):
    argv = _expand(args, files)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-m", "omnibal_kernels", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    _assert_one_line_error(result.returncode, result.stderr, fragment)
    assert result.stdout == ""
