"""Errors in the user's own words: the flag, the file and what was expected, never an internal name, a bare
errno or a count the user did not give."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import omnibal_kernels as ok
from omnibal_kernels.cli import main


def _error(argv: list[str]) -> str:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        status = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("omnibal-kernels: error: "), err.getvalue()
    return lines[0]


def test_a_resumed_sampler_under_context_parallelism_counts_data_parallel_groups():
    lengths = np.full(256, 100)
    options = ok.PlanOptions(vit_capacity=4, llm_capacity=400, context_parallel=ok.ContextParallelOptions(size=2))
    state = ok.BalancedBatchSampler(lengths, options, world_size=4, rank=0).state_dict()
    resumed = ok.BalancedBatchSampler(lengths, options, world_size=8, rank=0)
    with pytest.raises(ValueError, match=r"saved with 2 data-parallel groups, this sampler has 4 \(8 ranks in "):
        resumed.load_state_dict(state)


def test_a_nan_flag_value_names_the_flag():
    line = _error(["partition", "--config", "internvl-300m-7b", "--static-bytes-per-param", "nan"])
    assert "--static-bytes-per-param" in line and "cannot convert" not in line


def test_vit_on_first_stage_with_one_stage_names_that_flag():
    line = _error(["partition", "--config", "internvl-300m-7b", "--vit-on-first-stage", "--stages", "1"])
    assert "--vit-on-first-stage" in line and "at least 2 stages" in line and "fixed_starts" not in line


def test_a_fix_outside_the_stages_names_the_flag():
    line = _error(["partition", "--config", "internvl-300m-7b", "--stages", "2", "--fix", "5:3"])
    assert "--fix 5:3" in line and "fixed_starts" not in line


@pytest.mark.parametrize("content", [{"a": 1}, {}, {"samples": [{"token_num": 3}]}])
def test_a_length_file_holding_an_object_says_a_list_was_expected(tmp_path, content):
    path = tmp_path / "l.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match="expected a list of samples") as info:
        ok.load_lengths(path)
    assert "is missing" not in str(info.value)
    assert "expected a list of samples" in _error(["plan", str(path)])


def test_one_sample_object_and_meta_files_still_read(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"vit_num": 1, "token_num": 5}))
    assert ok.load_lengths(one).llm.tolist() == [5]


def test_a_missing_records_file_is_named_without_an_errno(tmp_path):
    line = _error(["lengths", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.npz")])
    assert "records file not found" in line and "missing.jsonl" in line and "[Errno" not in line


def test_an_os_error_says_which_file():
    from omnibal_kernels.cli import _said

    assert _said(PermissionError(13, "Permission denied", "/data/l.npz")) == "/data/l.npz: Permission denied"
    assert _said(ValueError("two\nlines")) == "two lines"
