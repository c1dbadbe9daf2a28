"""``omnibal-kernels plan --cost-model NAME|FILE.json|CONFIG_DIR`` and the epoch fields of ``--json``; the named
cost models against transformers' own configs of the same shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from omnibal_kernels import CostModel, Lengths, PlanOptions, balance_report, plan_packs, write_lengths
from omnibal_kernels.balance.cost_models import NAMED_COST_MODELS, cost_model_from_spec, named_cost_model
from omnibal_kernels.cli import main
from omnibal_kernels.synthetic import synthetic_lengths

# The bundled data's longest samples raise the capacities of target_batch_size.
pytestmark = pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")

EPOCH_KEYS = ("epoch_cost", "epoch_ideal", "epoch_bound", "epoch_over_ideal", "epoch_over_bound")


def _plan_json(capsys, *args: str) -> dict:
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def length_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lengths") / "l.npz"
    write_lengths(path, synthetic_lengths("patch_multires", 3_000, seed=0))
    return path


def test_json_reports_the_epoch_against_its_ideal_and_bound(capsys, length_file) -> None:
    out = _plan_json(capsys, str(length_file), "--world-size", "16", "--cost-model", "qwen2_vl_7b")
    model = named_cost_model("qwen2_vl_7b")
    assert out["cost_model"] == model.to_dict()
    lengths = synthetic_lengths("patch_multires", 3_000, seed=0)
    plan = plan_packs(lengths, PlanOptions(cost_model=model), world_size=16)
    report = balance_report(plan, lengths, model)
    for key in EPOCH_KEYS:
        assert out[key] == pytest.approx(getattr(report, key), rel=1e-12)
    assert out["epoch_ideal"] <= out["epoch_bound"] <= out["epoch_cost"]
    assert out["epoch_over_bound"] == pytest.approx(out["epoch_cost"] / out["epoch_bound"])
    assert out["epoch_over_ideal"] == pytest.approx(out["epoch_cost"] / out["epoch_ideal"])


def test_each_form_of_the_cost_model_flag(capsys, tmp_path, length_file) -> None:
    by_name = {
        name: _plan_json(capsys, str(length_file), "--cost-model", name) for name in ("internvl_7b", "tokens_only")
    }
    assert by_name["tokens_only"]["cost_model"] == CostModel.tokens_only().to_dict()
    default = _plan_json(capsys, str(length_file))

    def timeless(out: dict) -> dict:
        return {k: v for k, v in out.items() if k != "seconds"}

    assert timeless(by_name["internvl_7b"]) == timeless(default)
    fitted = CostModel(vit_linear=1e-6, llm_linear=2e-6, per_sample=1e-4, per_pack=3e-3)
    fitted.to_json(tmp_path / "fitted.json")
    out = _plan_json(capsys, str(length_file), "--cost-model", str(tmp_path / "fitted.json"))
    assert out["cost_model"] == fitted.to_dict()
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2VLConfig(
        vision_config=dict(embed_dim=64, depth=2, mlp_ratio=2, num_heads=2, hidden_size=32),
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            vocab_size=100,
        ),
    )
    config.save_pretrained(tmp_path / "qwen")
    out = _plan_json(capsys, str(length_file), "--cost-model", str(tmp_path / "qwen"))
    assert out["cost_model"] == CostModel.from_config(config).to_dict()


@pytest.mark.parametrize(
    "value, says",
    [
        ("no_such_model", "neither a named cost model"),
        ("{missing}.json", "neither a named cost model"),
        ("{bad}", "llm_linear must be finite and >= 0"),
        ("{notjson}", "not JSON"),
        ("{folder}", "not a transformers config"),
    ],
)
def test_bad_cost_models_are_one_line_errors_naming_the_flag(capsys, tmp_path, length_file, value, says) -> None:
    (tmp_path / "bad.json").write_text('{"llm_linear": -1}')
    (tmp_path / "notjson.json").write_text("llm_linear = 1")
    (tmp_path / "folder").mkdir()
    value = value.format(
        missing=tmp_path / "missing",
        bad=tmp_path / "bad.json",
        notjson=tmp_path / "notjson.json",
        folder=tmp_path / "folder",
    )
    assert main(["plan", str(length_file), "--cost-model", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnibal-kernels: error: --cost-model: ") and says in err
    assert "\n" not in err


def test_named_models_match_transformers_configs_of_their_shapes() -> None:
    transformers = pytest.importorskip("transformers")
    qwen2_7b = dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
    )
    configs = {
        "qwen2_vl_7b": transformers.Qwen2VLConfig(
            vision_config=dict(embed_dim=1280, depth=32, mlp_ratio=4, num_heads=16, hidden_size=3584),
            text_config=qwen2_7b,
        ),
        "qwen2_5_vl_7b": transformers.Qwen2_5_VLConfig(
            vision_config=dict(
                hidden_size=1280,
                depth=32,
                intermediate_size=3420,
                num_heads=16,
                out_hidden_size=3584,
                window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31],
            ),
            text_config=qwen2_7b,
        ),
        "llama_7b": transformers.LlamaConfig(
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
        ),
    }
    for name, config in configs.items():
        assert named_cost_model(name) == CostModel.from_config(config), name
    assert set(NAMED_COST_MODELS) >= {"internvl_7b", "tokens_only", *configs}
    with pytest.raises(ValueError, match="unknown cost model 'gpt'"):
        named_cost_model("gpt")
    with pytest.raises(TypeError, match="name or a path"):
        cost_model_from_spec(3)


def test_sampler_and_streaming_report_under_the_given_cost_model() -> None:
    from omnibal_kernels import BalancedBatchSampler, streaming_report

    lengths = synthetic_lengths("video_mix", 4_000, seed=0)
    model = CostModel(**{**named_cost_model("qwen2_5_vl_7b").to_dict(), "per_pack": 1e4})
    groups = (lengths.vit > 10_000).astype(np.int64)
    sampler = BalancedBatchSampler(lengths, PlanOptions(cost_model=model), world_size=8, rank=0, groups=groups)
    report = sampler.report()
    costs = model.sample_costs(lengths)
    # every micro-step's pack: its samples' costs (with their ViT sequences) plus per_pack
    assert report.epoch_ideal * 8 == pytest.approx(
        sum(costs[np.asarray(b, np.int64)].sum() + model.per_pack for r in range(8) for b in sampler.rank_batches(r)),
        rel=1e-9,
    )
    assert report.epoch_cost >= report.epoch_ideal
    stream = streaming_report(
        lengths, PlanOptions(vit_capacity=30_000, llm_capacity=12_000, cost_model=model), buffer_size=512, world_size=8
    )
    plan_cost = stream.streaming.epoch_cost
    assert stream.streaming.epoch_bound <= plan_cost
    assert stream.offline is not None and stream.offline.epoch_bound == pytest.approx(stream.streaming.epoch_bound)


def test_report_uses_the_vit_sequences_and_per_pack() -> None:
    # one sample of two images: charged per image, not as one sequence; every pack pays per_pack
    lengths = Lengths(
        np.array([10, 4]), np.array([5, 5]), vit_seqlens=np.array([6, 4, 4]), vit_seqlens_offsets=np.array([0, 2, 3])
    )
    model = CostModel(vit_quadratic=1.0, per_pack=100.0)
    plan = plan_packs(lengths, PlanOptions(vit_capacity=10, llm_capacity=5, cost_model=model), world_size=1)
    report = balance_report(plan, lengths, model)
    assert report.epoch_cost == pytest.approx(36 + 16 + 16 + 2 * 100)
    assert report.epoch_bound == pytest.approx(report.epoch_cost)
