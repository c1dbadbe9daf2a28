"""Every bad value a user can give the command line (a flag, a config field, a JSON term, a profile field) is
one line naming it and exit status 2, never a traceback: each is checked where it is read."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnibal_kernels import CostModel, Lengths, write_lengths
from omnibal_kernels.cli import main

LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=1000,
)
INTERNVL_VISION = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, image_size=448, patch_size=14)
LAYER = dict(name="a", forward_ms=1.0, backward_ms=2.0, activation_bytes=10, static_bytes=5, output_bytes=3)
CAPS = ["--vit-capacity", "8", "--llm-capacity", "2000"]


def _run(argv: list[str], out: io.StringIO | None = None) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(out or io.StringIO()):
        status = main(argv)
    return status, err.getvalue()


def _one_line(status: int, err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("omnibal-kernels: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.fixture(scope="module")
def lengths_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lengths") / "l.npz"
    write_lengths(path, Lengths(np.arange(200) % 3, 100 + np.arange(200)))
    return path


def _config_dir(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": 256.5}, "hidden_size"),
        ({"vocab_size": None}, "vocab_size"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"hidden_size": 10**160}, "hidden_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"intermediate_size": "wide"}, "intermediate_size"),
    ],
)
def test_bad_config_fields_are_one_line_naming_the_field(tmp_path, lengths_file, change, field):
    folder = _config_dir(tmp_path / "model", {**LLAMA, **change})
    _one_line(*_run(["plan", str(lengths_file), "--cost-model", str(folder)]), "--cost-model", field)


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5, "half"])
def test_bad_internvl_downsample_ratio_is_one_line(tmp_path, lengths_file, ratio):
    config = {
        "model_type": "internvl",
        "vision_config": {"model_type": "internvl_vision", **INTERNVL_VISION},
        "text_config": {**LLAMA, "model_type": "qwen2"},
        "downsample_ratio": ratio,
    }
    folder = _config_dir(tmp_path / "internvl", config)
    _one_line(*_run(["plan", str(lengths_file), "--cost-model", str(folder)]), "downsample_ratio")


def test_from_config_refuses_a_zero_width():
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"hidden_size must be an integer in \[1, "):
        CostModel.from_config(SimpleNamespace(**{**LLAMA, "hidden_size": 0}))


def test_a_huge_integer_term_in_a_cost_model_json_is_one_line(tmp_path, lengths_file):
    path = tmp_path / "cost.json"
    path.write_text('{"llm_linear": ' + "9" * 400 + "}")
    with pytest.raises(ValueError, match="llm_linear must be finite and >= 0, got an integer of 400 digits"):
        CostModel.from_json(path)
    _one_line(*_run(["plan", str(lengths_file), "--cost-model", str(path)]), "llm_linear")


def test_a_huge_integer_static_bytes_in_a_profile_is_one_line(tmp_path):
    path = tmp_path / "profile.json"
    layers = [{**LAYER, "name": f"l{i}"} for i in range(4)]
    text = json.dumps({"layers": layers}).replace('"static_bytes": 5', '"static_bytes": ' + "9" * 320, 1)
    path.write_text(text)
    _one_line(*_run(["partition", str(path), "--stages", "2"]), "static_bytes", "2**53")


@pytest.mark.parametrize("device, says", [("cuda:7", "CUDA"), ("bogus", "'cpu', 'cuda' or 'cuda:N'"), ("mps", "cpu")])
def test_calibrate_devices_are_checked_before_any_work(tmp_path, device, says):
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the device")
    status, err = _run(["calibrate", "tiny-llama", "-o", str(tmp_path / "c.json"), "--device", device])
    _one_line(status, err, "--device", says)


# ------------------------------------------------------------------------------------------------ properties

_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.integers(10**300, 10**320),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.lists(st.integers(-2, 600), max_size=3),
)
_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"]
_FIELDS += ["intermediate_size", "vocab_size"]


@pytest.mark.property
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_FIELDS), value=_ANY_VALUE)
def test_any_config_field_value_is_taken_or_named(tmp_path_factory, lengths_file, field, value):
    folder = _config_dir(tmp_path_factory.mktemp("cfg"), {**LLAMA, field: value})
    status, err = _run(["plan", str(lengths_file), "--cost-model", str(folder), "--json", *CAPS])
    if status != 0:
        _one_line(status, err, "--cost-model")
        # our checks name the field; transformers' own (a rule between fields, such as RoPE's even head_dim)
        # name what they check, after the file
        assert field in err or "not a transformers config" in err, err


_TERMS = ["vit_linear", "vit_quadratic", "llm_linear", "llm_quadratic", "per_sample", "per_pack"]


@pytest.mark.property
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(term=st.sampled_from(_TERMS), value=st.one_of(_ANY_VALUE, st.floats(1e90, 1.7e308)))
def test_any_cost_term_is_taken_or_named_and_costs_stay_finite(tmp_path_factory, lengths_file, term, value):
    path = tmp_path_factory.mktemp("cost") / "cost.json"
    path.write_text(json.dumps({term: value}))
    out = io.StringIO()
    status, err = _run(["plan", str(lengths_file), "--cost-model", str(path), "--json", *CAPS], out)
    if status != 0:
        _one_line(status, err, "--cost-model", term)
    else:
        rows = json.loads(out.getvalue())
        for row in rows if isinstance(rows, list) else [rows]:
            assert (
                np.isfinite([row["epoch_cost"], row["epoch_bound"]]).all() and row["epoch_over_ideal"] >= 1 - 1e-12
            )  # summation order


_PROFILE_FIELDS = ["forward_ms", "backward_ms", "activation_bytes", "static_bytes", "output_bytes"]


@pytest.mark.property
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_PROFILE_FIELDS), value=_ANY_VALUE)
def test_any_profile_field_value_is_taken_or_named(tmp_path_factory, field, value):
    path = tmp_path_factory.mktemp("profile") / "p.json"
    layers = [{**LAYER, "name": f"l{i}"} for i in range(4)]
    layers[1][field] = value
    path.write_text(json.dumps({"layers": layers}))
    status, err = _run(["partition", str(path), "--stages", "2", "--micro-batches", "8"])
    if status != 0:
        _one_line(status, err, field)


# ------------------------------------------------------------------------------------------------ cost terms


def test_a_term_whose_epoch_cost_would_overflow_is_refused():
    with pytest.raises(ValueError, match="per_pack must be at most 1e\\+100"):
        CostModel(per_pack=1.7e308)
    with pytest.raises(ValueError, match="at most 1e\\+100"):
        CostModel(llm_linear=1.0).scaled(1e101)


@pytest.mark.parametrize("scale", [1e-200, 1e-12, 1.0, 1e12, 1e80])
def test_fit_is_the_same_in_any_unit_of_time(scale):
    rng = np.random.default_rng(0)
    lengths = Lengths(rng.integers(0, 5, 240), rng.integers(50, 3000, 240))
    sizes = 1 + np.arange(60) % 5  # packs of 1 to 5 samples: per_pack and per_sample apart
    packs = np.split(np.arange(sizes.sum()), np.cumsum(sizes)[:-1])
    truth = CostModel(vit_linear=2e-4, llm_linear=1e-6, llm_quadratic=1e-10, per_pack=1e-4)
    seconds = truth.pack_costs(lengths, packs)
    fit = CostModel.fit(lengths, packs, seconds * scale, holdout=0.25)
    assert fit.heldout_error.median < 1e-9
    for name in ("vit_linear", "llm_linear", "llm_quadratic", "per_pack"):
        assert getattr(fit.model, name) == pytest.approx(getattr(truth, name) * scale, rel=1e-6)


def test_fit_says_why_when_the_terms_leave_what_a_term_holds():
    lengths = Lengths(np.zeros(40, np.int64), 100 + np.arange(40))
    packs = [np.array([i]) for i in range(40)]
    with pytest.raises(ValueError, match="llm_linear term of these times .* another unit"):
        CostModel.fit(lengths, packs, 1e200 * (100 + np.arange(40.0)), holdout=0.0)
