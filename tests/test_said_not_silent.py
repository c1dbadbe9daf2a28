"""What the library accepts but the user must know is said (a warning of its own category), and what it cannot
honour is refused: a plan whose one step repeats packs, a process rank outside its world, an efficiency above
the peak."""

from __future__ import annotations

import io
import warnings
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels import Lengths, PlanOptions, TooFewPacksWarning, plan_packs, write_lengths
from omnibal_kernels.balance import TooFewPacksError
from omnibal_kernels.cli import main


def _lengths(n: int, seed: int = 0) -> Lengths:
    rng = np.random.default_rng(seed)
    return Lengths(rng.integers(0, 4, n), rng.integers(20, 400, n))


CAPS = PlanOptions(vit_capacity=8, llm_capacity=800)


def test_plan_packs_warns_when_its_one_step_repeats_packs():
    with pytest.warns(TooFewPacksWarning, match=r"for world_size 5000: .* each pack about \d+\.\d times"):
        plan = plan_packs(_lengths(2000), CAPS, world_size=5000)
    assert plan.num_packs < 5000 and issubclass(TooFewPacksWarning, ok.OmnibalWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ok.OmnibalWarning)
        plan_packs(_lengths(2000), CAPS, world_size=8)  # enough packs: nothing to say


def test_cli_plan_says_it_in_one_line(tmp_path):
    path = tmp_path / "l.npz"
    write_lengths(path, _lengths(2000))
    err = io.StringIO()
    with warnings.catch_warnings(), redirect_stderr(err), redirect_stdout(io.StringIO()):
        warnings.simplefilter("always", TooFewPacksWarning)  # shown, as outside the test suite
        status = main(["plan", str(path), "--world-size", "5000", "--vit-capacity", "8", "--llm-capacity", "800"])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert status == 0 and len(lines) == 1 and lines[0].startswith("omnibal-kernels: warning: only ")


@pytest.mark.property
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 400), seed=st.integers(0, 3))
def test_plan_packs_warns_where_the_sampler_refuses(n, world, seed):
    lengths = _lengths(n, seed)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plan = plan_packs(lengths, CAPS, world_size=world)
    warned = any(issubclass(w.category, TooFewPacksWarning) for w in said)
    assert warned == (plan.num_packs < world)
    try:
        ok.BalancedBatchSampler(lengths, CAPS, world_size=world, rank=0)
    except TooFewPacksError:
        return
    assert not warned  # a plan the sampler takes repeats no pack within its step


@pytest.mark.parametrize(
    "world, rank, says",
    [
        ("8", "9", "RANK=9 is not a rank of WORLD_SIZE=8"),
        ("8", "8", "RANK=8 is not a rank of WORLD_SIZE=8"),
        ("8", "-1", "must be a positive and a non-negative integer"),
        ("0", "0", "must be a positive and a non-negative integer"),
        ("eight", "1", "must be a positive and a non-negative integer"),
    ],
)
def test_collator_refuses_an_environment_rank_outside_the_world(monkeypatch, world, rank, says):
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(ValueError, match=says):
        ok.PackCollator(context_parallel=ok.ContextParallelOptions(size=4), warmup=False)


@pytest.mark.parametrize("efficiency", [5.0, 0.0, -0.5, float("nan"), float("inf")])
def test_efficiency_is_a_share_of_the_peak(efficiency):
    from omnibal_kernels.pipeline import profile_from_config

    pack = (np.full(4, 4.0), np.full(4, 1000.0))
    with pytest.raises(ValueError, match="efficiency must be in"):
        profile_from_config("internvl-300m-7b", [pack], efficiency=efficiency)


_FLAGS = {
    "--efficiency": lambda x: 0 < x <= 1,
    "--tflops": lambda x: x > 0,
    "--static-bytes-per-param": lambda x: x >= 0,
    "--memory-gb": lambda x: x > 0,
    "--link-gb-per-s": lambda x: x >= 0,
}


@pytest.mark.property
@given(
    flag=st.sampled_from(sorted(_FLAGS)),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=5)),
)
@example(flag="--efficiency", value="--")  # argparse drops a "--" value and would store an empty list
@settings(deadline=None)  # the first example imports the command line
def test_any_partition_flag_value_is_taken_or_named(flag, value):
    from omnibal_kernels.cli import build_parser

    argv = ["partition", "--config", "internvl-300m-7b", f"{flag}={value}"]
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if np.isfinite(number) and _FLAGS[flag](number):
        parsed = build_parser().parse_args(argv)
        assert getattr(parsed, flag[2:].replace("-", "_")) == number
        return
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        status = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert status == 2 and len(lines) == 1 and flag in lines[0], err.getvalue()
