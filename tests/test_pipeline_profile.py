"""Profiles: the JSON form, estimates from configs (consistent with CostModel), engine forms and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from omnibal_kernels.balance import CostModel
from omnibal_kernels.cli import main
from omnibal_kernels.pipeline import (
    CONFIGS,
    LayerProfile,
    ModelProfile,
    deepspeed_parts,
    load_config,
    load_profile,
    megatron_layout,
    partition,
    profile_from_config,
)

ROW = {"name": "a", "forward_ms": 1.0, "backward_ms": 2.0, "activation_bytes": 10, "static_bytes": 5, "output_bytes": 3}


def _write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_json_round_trip(tmp_path):
    prof = ModelProfile(
        (LayerProfile(**ROW, kind="vit", fixed_forward_ms=0.25), LayerProfile(**{**ROW, "name": "b"})),
        input_bytes=7,
        meta={"source": "test"},
    )
    path = prof.save(tmp_path / "p.json")
    again = load_profile(path)
    assert again == prof
    assert load_profile(_write(tmp_path, {"layers": [ROW]})).input_bytes == 0  # the minimal documented form


@pytest.mark.parametrize(
    "change, message",
    [
        ({"forward_ms": -1.0}, "forward_ms must be finite and >= 0"),
        ({"backward_ms": float("nan")}, "backward_ms must be finite"),
        ({"activation_bytes": -5}, r"activation_bytes must be in \[0, 2\*\*53\]"),
        ({"static_bytes": "big"}, "static_bytes must be an integer"),
        ({"output_bytes": 1.5}, "output_bytes must be an integer"),
        ({"fixed_forward_ms": -0.5}, "fixed_forward_ms must be finite and >= 0"),
        ({"fixed_backward_ms": 1e9}, r"fixed_backward_ms must be at most backward_ms"),
    ],
)
def test_bad_layer_fields_name_file_and_index(tmp_path, change, message):
    path = _write(tmp_path, {"layers": [ROW, {**ROW, "name": "b", **change}]})
    with pytest.raises(ValueError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value) and "layers[1]" in str(info.value)


def test_missing_fields_and_bad_files(tmp_path):
    row = dict(ROW)
    del row["static_bytes"]
    with pytest.raises(ValueError, match=r"layers\[0\] misses static_bytes"):
        load_profile(_write(tmp_path, {"layers": [row]}))
    with pytest.raises(ValueError, match="'layers' must be a non-empty list"):
        load_profile(_write(tmp_path, {"layers": []}))
    with pytest.raises(ValueError, match="appears more than once"):
        load_profile(_write(tmp_path, {"layers": [ROW, ROW]}))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(bad)
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "missing.json")


def test_config_flops_add_up_to_the_cost_model():
    """The layers' training FLOPs (time x throughput) sum to CostModel.from_shapes of the whole model."""
    cfg = CONFIGS["internvl-300m-7b"]
    vit = np.array([3.0, 1.0, 7.0])
    llm = np.array([900.0, 250.0, 2900.0])
    prof = profile_from_config(cfg, [(vit, llm)], tflops=100.0, efficiency=1.0)
    gflop = (prof.forward_ms + prof.backward_ms) * 100.0  # ms x TFLOP/s = GFLOP
    kinds = [layer.kind for layer in prof.layers]
    v, t = cfg.vision, cfg.llm
    vit_blocks = CostModel.from_shapes(
        vit_params=v.layers * v.layer_params,
        vit_layers=v.layers,
        vit_hidden=v.hidden,
        vit_tokens_per_unit=1025,
        vit_units_attend_jointly=False,
        llm_params=0,
        llm_layers=0,
        llm_hidden=0,
    )
    llm_blocks = CostModel.from_shapes(
        vit_params=0,
        vit_layers=0,
        vit_hidden=0,
        vit_tokens_per_unit=1,
        vit_units_attend_jointly=False,
        llm_params=t.layers * t.layer_params,
        llm_layers=t.layers,
        llm_hidden=t.hidden,
    )
    vit_sum = sum(g for g, n in zip(gflop, prof.names) if n.startswith("vit.") and n != "vit.embed")
    llm_sum = sum(g for g, k in zip(gflop, kinds) if k == "llm")
    assert vit_sum == pytest.approx(vit_blocks.sample_costs(vit, llm).sum(), rel=1e-9)
    assert llm_sum == pytest.approx(llm_blocks.sample_costs(vit, llm).sum(), rel=1e-9)
    # The 7B LLM blocks hold about 7B parameters (the config's, 16 static bytes each).
    llm_static = sum(layer.static_bytes for layer in prof.layers if layer.kind == "llm")
    assert 6.0e9 < llm_static / 16 < 7.5e9
    # Activations: about 34 * hidden bytes per token for a Llama-style layer in 16-bit.
    per_token = prof.layers[kinds.index("llm")].activation_bytes / llm.sum()
    assert 30 * t.hidden < per_token < 40 * t.hidden


def test_config_from_internvl_json(tmp_path):
    cfg = {
        "vision_config": {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "image_size": 448,
            "patch_size": 14,
        },
        "llm_config": {
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 92553,
        },
        "downsample_ratio": 0.5,
    }
    loaded = load_config(_write(tmp_path, cfg, "config.json"))
    assert loaded.vision == CONFIGS["internvl-300m-7b"].vision and loaded.llm == CONFIGS["internvl-300m-7b"].llm
    assert loaded.vit_tokens_per_tile == 1025 and loaded.llm_tokens_per_tile == 256
    del cfg["llm_config"]["intermediate_size"]
    with pytest.raises(ValueError, match="llm_config: missing intermediate_size"):
        load_config(_write(tmp_path, cfg, "config.json"))


def test_engine_forms():
    prof = profile_from_config("internvl-300m-7b", [(np.array([8.0, 8.0]), np.array([2000.0, 3000.0]))])
    n_vit = sum(layer.kind == "vit" for layer in prof.layers)
    plan = partition(prof, 4, micro_batches=16, fixed_starts={1: n_vit})
    parts = deepspeed_parts(plan)
    assert parts[0] == 0 and parts[-1] == len(prof) and parts[1] == n_vit
    meg = megatron_layout(plan, prof)
    assert sum(meg["decoder_layers_per_stage"]) == CONFIGS["internvl-300m-7b"].llm.layers
    assert meg["vision_on_first_stage_only"] and meg["vision_layers_per_stage"][0] == n_vit
    layout = meg["pipeline_model_parallel_layout"].split("|")
    assert len(layout) == 4 and layout[1].startswith("E") and layout[-1].endswith("L")
    assert [int(p.strip("EL").split("*")[-1]) if "*" in p else p.count("t") for p in layout] == meg[
        "decoder_layers_per_stage"
    ]


def test_cli_partition_json_keys(tmp_path, capsys):
    assert (
        main(
            [
                "partition",
                "--config",
                "internvl-6b-20b",
                "--stages",
                "8",
                "--memory-gb",
                "80",
                "--micro-batches",
                "16",
                "--pack-samples",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for key in ("stages", "recompute", "step_ms", "bubble", "peak_bytes"):
        assert key in out and key in out["uniform"]
    assert out["stages"][0][0] == 0 and out["stages"][-1][1] == len(out["layer_names"]) - 1
    assert all(b + 1 == a for (_, b), (a, _) in zip(out["stages"], out["stages"][1:]))
    assert max(out["peak_bytes"]) <= 80 * 2**30
    assert out["step_ms"] <= out["uniform"]["step_ms"]
    # No memory limit: memory is no constraint, nothing is recomputed.
    assert main(["partition", "--config", "internvl-300m-7b", "--stages", "8", "--json"]) == 0
    captured = capsys.readouterr()
    free = json.loads(captured.out)
    assert free["recompute"] == [[]] * 8
    peak = max(free["peak_bytes"]) / 2**30
    assert captured.err.startswith("omnibal-kernels: warning: no --memory-gb") and f"{peak:.1f} GiB" in captured.err


def test_cli_partition_default_micro_batches_are_the_guides():
    from omnibal_kernels.cli import build_parser

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "pipeline.md").read_text()
    default = build_parser().parse_args(["partition", "--stages", "2"]).micro_batches
    assert f"--micro-batches {default}" in guide and re.search(rf"\b{default}\s+micro-batches", guide)


def test_cli_partition_profile_file_and_errors(tmp_path, capsys):
    rows = [{**ROW, "name": f"l{i}", "forward_ms": float(i + 1)} for i in range(6)]
    path = _write(tmp_path, {"layers": rows})
    assert main(["partition", str(path), "--stages", "2", "--micro-batches", "4", "--fix", "1:4"]) == 0
    text = capsys.readouterr().out
    assert "exact search" in text and "uniform split" in text and "l4 .. l5" in text
    assert main(["partition", str(tmp_path / "none.json"), "--stages", "2"]) == 2
    assert main(["partition", "--config", "internvl-6b-20b", "--stages", "2", "--memory-gb", "10"]) == 2
    assert main(["partition", str(path), "--stages", "2", "--fix", "x"]) == 2
    assert main(["partition", "--stages", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("omnibal-kernels: error: ") for line in err)


def test_cli_profile_from_config_writes_json(tmp_path, capsys):
    out = tmp_path / "prof.json"
    assert main(["profile", "--config", "internvl-300m-7b", "--out", str(out)]) == 0
    prof = load_profile(out)
    assert len(prof) == 1 + 24 + 1 + 32 + 1
    assert main(["profile", "--model", "no_such_module:f"]) == 2


def test_engine_forms_for_virtual_stages():
    prof = profile_from_config("internvl-300m-7b", [(np.array([8.0, 8.0]), np.array([2000.0, 3000.0]))])
    plan = partition(prof, 2, micro_batches=8, schedule="interleaved", virtual_stages=2)
    assert plan.num_stages == 4 and plan.num_ranks == 2 and plan.rank_stages(1) == [1, 3]
    meg = megatron_layout(plan, prof)
    assert meg["virtual_pipeline_model_parallel_size"] == 2
    assert len(meg["decoder_layers_per_stage"]) == 4 and sum(meg["decoder_layers_per_stage"]) == 32
    assert len(meg["pipeline_model_parallel_layout"].split("|")) == 4
    with pytest.raises(ValueError, match="one stage per rank"):
        deepspeed_parts(plan)
    zbv = partition(prof, 2, micro_batches=8, schedule="zbv", virtual_stages=2)
    assert zbv.stage_ranks == (0, 1, 1, 0) and zbv.rank_stages(0) == [0, 3]


def test_cli_partition_schedules(capsys):
    assert (
        main(
            [
                "partition",
                "--config",
                "internvl-300m-7b",
                "--stages",
                "2",
                "--micro-batches",
                "8",
                "--schedule",
                "interleaved",
                "--virtual-stages",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["virtual_stages"] == 2 and len(out["stages"]) == 4 and out["stage_ranks"] == [0, 1, 0, 1]
    assert "deepspeed_parts" not in out and out["megatron"]["virtual_pipeline_model_parallel_size"] == 2
    assert out["lower_bound_ms"] <= out["step_ms"]
    assert main(["partition", "--config", "internvl-300m-7b", "--stages", "2", "--schedule", "zbv"]) == 0
    text = capsys.readouterr().out
    assert "2 ranks x 2 stages" in text and "rank" in text
    assert (
        main(
            [
                "partition",
                "--config",
                "internvl-300m-7b",
                "--stages",
                "2",
                "--schedule",
                "1f1b",
                "--virtual-stages",
                "2",
            ]
        )
        == 2
    )
    assert "virtual_stages" in capsys.readouterr().err
