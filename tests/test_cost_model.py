"""CostModel: the six terms, JSON, sample and pack costs with ViT sequences, the named models, the fit.

The FLOP counts of ``from_config`` are checked twice for the tiny configs of ``test_for_model``: against values
worked out by hand below, and against ``torch.utils.flop_counter`` counting the real model's forward (eager
attention, which computes every query-key pair: twice the causal half the LLM term counts).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import Lengths
from omnibal_kernels.balance import CostModel, plan_packs
from omnibal_kernels.balance.cost import TERMS, PackRows, pack_features

TILE_LENGTHS = Lengths([3, 0, 1], [900, 40, 300], vit_seqlens=[1, 1, 1, 1], vit_seqlens_offsets=[0, 3, 3, 4])


def _model() -> CostModel:
    return CostModel(
        vit_linear=2.0, vit_quadratic=0.5, llm_linear=0.1, llm_quadratic=1e-3, per_sample=7.0, per_pack=11.0
    )


# ------------------------------------------------------------------------------------------------ the terms


def test_keyword_construction_defaults_to_zero_and_checks_terms():
    assert CostModel().to_dict() == dict.fromkeys(TERMS, 0.0)
    assert CostModel(per_pack=3).per_pack == 3.0 and isinstance(CostModel(per_pack=3).per_pack, float)
    with pytest.raises(ValueError, match="per_sample must be finite and >= 0"):
        CostModel(per_sample=-1.0)
    with pytest.raises(ValueError, match="vit_linear"):
        CostModel(vit_linear=float("nan"))
    with pytest.raises(TypeError, match="llm_linear must be a number"):
        CostModel(llm_linear="1")
    with pytest.raises(TypeError, match="per_pack must be a number"):
        CostModel(per_pack=True)


def test_json_round_trip_missing_keys_and_unknown_keys(tmp_path):
    model = _model()
    assert CostModel.from_json(model.to_json()) == model
    path = tmp_path / "cost.json"
    assert model.to_json(path) == path.read_text()
    assert set(json.loads(path.read_text())) == set(TERMS)
    assert CostModel.from_json(path) == model and CostModel.from_json(str(path)) == model
    assert CostModel.from_json('{"llm_linear": 2}') == CostModel(llm_linear=2.0)
    with pytest.raises(ValueError, match="unknown key.*'tokens'.*'vit'"):
        CostModel.from_json('{"vit": 1, "tokens": 2, "llm_linear": 1}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"per_pack": -2}')
    with pytest.raises(ValueError, match=f"{bad}: CostModel: per_pack"):
        CostModel.from_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        CostModel.from_json(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        CostModel.from_json(bad)
    with pytest.raises(FileNotFoundError):
        CostModel.from_json(tmp_path / "missing.json")


def test_named_models_keep_their_numbers():
    # InternViT-300M on 1,025-token tiles + 7B: (2 * 0.3e9 * 1025 + 4 * 1025**2 * 1024 * 24) * 3 / 1e9, ...
    assert CostModel.internvl_7b().terms() == [2154.84192, 0.0, 42.0, 0.000786432]
    assert CostModel.internvl_7b().per_sample == 0.0 and CostModel.internvl_7b().per_pack == 0.0
    assert CostModel.tokens_only().terms() == [0.0, 0.0, 1.0, 0.0]
    qwen = CostModel.from_shapes(
        vit_params=0.675e9,
        vit_layers=32,
        vit_hidden=1280,
        vit_tokens_per_unit=1,
        vit_units_attend_jointly=True,
        llm_params=7.0e9,
        llm_layers=32,
        llm_hidden=4096,
    )
    assert qwen.terms() == [4.05, 0.00049152, 42.0, 0.000786432]


# ------------------------------------------------------------------------------------------------ costs


def test_sample_cost_formula_with_vit_sequences():
    lengths = Lengths([5, 0, 4], [100, 30, 50], vit_seqlens=[2, 3, 4], vit_seqlens_offsets=[0, 2, 2, 3])
    m = _model()
    want = [
        2 * 5 + 0.5 * (4 + 9) + 0.1 * 100 + 1e-3 * 100**2 + 7,
        0.1 * 30 + 1e-3 * 30**2 + 7,
        2 * 4 + 0.5 * 16 + 0.1 * 50 + 1e-3 * 50**2 + 7,
    ]
    np.testing.assert_allclose(m.sample_costs(lengths), want, rtol=1e-12)


def test_default_without_sequences_is_one_sequence_per_sample():
    with_seqs = Lengths([5, 0, 4], [100, 30, 50], vit_seqlens=[5, 4], vit_seqlens_offsets=[0, 1, 1, 2])
    without = Lengths([5, 0, 4], [100, 30, 50])
    m = _model()
    np.testing.assert_array_equal(m.sample_costs(without), m.sample_costs(with_seqs))
    # the (vit, llm) arrays the planner passes: the same default
    np.testing.assert_array_equal(m.sample_costs(without.vit, without.llm), m.sample_costs(without))
    # several images cost less than one image of all their patches
    split = Lengths([5, 0, 4], [100, 30, 50], vit_seqlens=[2, 3, 2, 2], vit_seqlens_offsets=[0, 2, 2, 4])
    assert (m.sample_costs(split)[[0, 2]] < m.sample_costs(without)[[0, 2]]).all()


def _numpy_sample_costs(m: CostModel, lengths: Lengths) -> np.ndarray:
    """Reference: the cost formula one numpy array at a time, in the engine's order of operations."""
    v, t = lengths.vit.astype(np.float64), lengths.llm.astype(np.float64)
    if lengths.vit_seqlens is None:
        squares = v * v
    else:
        s = lengths.vit_seqlens.astype(np.float64)
        rows = np.repeat(np.arange(len(lengths)), np.diff(lengths.vit_seqlens_offsets))
        squares = np.bincount(rows, weights=s * s, minlength=len(lengths))  # each row summed in order
    out = np.zeros(len(lengths))
    for term, values in ((m.vit_linear, v), (m.vit_quadratic, squares), (m.llm_linear, t), (m.llm_quadratic, t * t)):
        if term != 0.0:
            out += values * term
    if m.per_sample != 0.0:
        out += m.per_sample
    return out


@settings(max_examples=60, deadline=None)
@given(
    seqlens=st.lists(st.lists(st.integers(0, 2**28), max_size=6), min_size=1, max_size=40),  # loads < 2**31
    tokens=st.integers(0, 2**31 - 1),
    terms=st.lists(st.sampled_from([0.0, 1e-9, 0.5, 3.0, 1e6]), min_size=5, max_size=5),
    with_sequences=st.booleans(),
)
def test_sample_costs_match_the_numpy_formula_to_the_bit(seqlens, tokens, terms, with_sequences):
    vit = [sum(row) for row in seqlens]
    llm = [(tokens * (i + 1)) % 2**31 for i in range(len(seqlens))]
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in seqlens])])
    flat = [x for row in seqlens for x in row]
    lengths = Lengths(vit, llm, vit_seqlens=flat, vit_seqlens_offsets=offsets) if with_sequences else Lengths(vit, llm)
    m = CostModel(**dict(zip(TERMS[:5], terms)))
    np.testing.assert_array_equal(m.sample_costs(lengths), _numpy_sample_costs(m, lengths))


def test_sample_costs_refuse_malformed_sequences_in_the_engine():
    from omnibal_kernels import _ext

    C = _ext.load()
    terms = [1.0, 1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="one entry per sample"):
        C.sample_costs([1, 2], [3, 4], [1.0], terms)
    with pytest.raises(ValueError, match="one entry per sample"):
        C.sample_costs([1, 2], [3, 4], [[1.0, 1.0]], terms)
    with pytest.raises(ValueError, match="5 entries"):
        C.sample_costs([1, 2], [3, 4], None, [1.0])
    with pytest.raises(ValueError, match="non-decreasing"):
        C.row_square_sums([0, 2, 1], [1, 1])
    with pytest.raises(ValueError, match="end at the number of values"):
        C.row_square_sums([0, 1, 3], [1, 1])
    with pytest.raises(TypeError, match="values must be an integer array"):
        C.row_square_sums([0, 1, 2], [1.0, 1.0])
    np.testing.assert_array_equal(C.row_square_sums([0, 2, 2, 3], [3, 4, 5]), [25.0, 0.0, 25.0])
    np.testing.assert_array_equal(
        C.sample_costs([7, 0, 5], [1, 1, 1], [25.0, 0.0, 25.0], [0.0, 1.0, 0.0, 0.0, 0.0]), [25.0, 0.0, 25.0]
    )


def test_a_lengths_sums_its_squared_sequences_once():
    lengths = Lengths([7, 0, 5], [1, 1, 1], vit_seqlens=[3, 4, 5], vit_seqlens_offsets=[0, 2, 2, 3])
    squares = lengths.vit_square_sums()
    np.testing.assert_array_equal(squares, [25.0, 0.0, 25.0])
    assert lengths.vit_square_sums() is squares and not squares.flags.writeable
    assert Lengths([7], [1]).vit_square_sums() is None
    # a subset sums its own sequences
    np.testing.assert_array_equal(lengths[[2, 0]].vit_square_sums(), [25.0, 25.0])


def test_tile_models_do_not_depend_on_the_default():
    tiles = CostModel.internvl_7b()
    without = Lengths(TILE_LENGTHS.vit, TILE_LENGTHS.llm)
    np.testing.assert_array_equal(tiles.sample_costs(TILE_LENGTHS), tiles.sample_costs(without))


def test_pack_costs_from_lists_csr_and_plans():
    lengths = Lengths([5, 0, 4, 1], [100, 30, 50, 9], vit_seqlens=[2, 3, 4, 1], vit_seqlens_offsets=[0, 2, 2, 3, 4])
    m = _model()
    per_sample = m.sample_costs(lengths)
    packs = [np.array([0, 2]), np.array([1]), np.array([3, 1, 0])]
    want = [per_sample[[0, 2]].sum() + 11, per_sample[1] + 11, per_sample[[3, 1, 0]].sum() + 11]
    np.testing.assert_allclose(m.pack_costs(lengths, packs), want, rtol=1e-12)
    rows = PackRows(np.array([0, 2, 3, 6]), np.array([0, 2, 1, 3, 1, 0]))
    np.testing.assert_allclose(m.pack_costs(lengths, rows), want, rtol=1e-12)
    plan = plan_packs(lengths, PlanOptions(vit_capacity=10, llm_capacity=200, method="random"), world_size=1)
    by_plan = [plan.pack_samples[a:b] for a, b in zip(plan.pack_offsets[:-1], plan.pack_offsets[1:])]
    np.testing.assert_allclose(m.pack_costs(lengths, plan), m.pack_costs(lengths, by_plan), rtol=1e-12)
    with pytest.raises(ValueError, match="pack 1: sample id 4 is not in"):
        m.pack_costs(lengths, [np.array([0]), np.array([4])])
    with pytest.raises(ValueError, match="pack 0: must be a 1-D array of sample ids"):
        m.pack_costs(lengths, [np.array([0.5])])
    with pytest.raises(ValueError, match="pack 1: pack offsets must be non-decreasing"):
        m.pack_costs(lengths, PackRows(np.array([0, 2, 1, 2]), np.array([0, 1])))
    with pytest.raises(TypeError, match="packs must be"):
        m.pack_costs(lengths, "0,1")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.integers(1, 50), max_size=4), st.integers(1, 500)), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
)
def test_pack_costs_are_sums_of_sample_costs(samples, seed):
    seqs = [s for s, _ in samples]
    lengths = Lengths(
        [sum(s) for s in seqs],
        [t for _, t in samples],
        vit_seqlens=[x for s in seqs for x in s],
        vit_seqlens_offsets=np.cumsum([0] + [len(s) for s in seqs]),
    )
    rng = np.random.default_rng(seed)
    packs = [rng.integers(0, len(samples), rng.integers(0, 5)) for _ in range(rng.integers(1, 6))]
    m = _model()
    costs = m.sample_costs(lengths)
    np.testing.assert_allclose(m.pack_costs(lengths, packs), [costs[p].sum() + m.per_pack for p in packs], rtol=1e-12)
    np.testing.assert_allclose(pack_features(lengths, packs) @ m.coefficients(), m.pack_costs(lengths, packs))


# ------------------------------------------------------------------------------------------------ the fit


def _random_packs(lengths: Lengths, rng: np.random.Generator, count: int) -> list[np.ndarray]:
    return [rng.choice(len(lengths), rng.integers(1, 9), replace=False) for _ in range(count)]


def _varied_lengths(rng: np.random.Generator, n: int) -> Lengths:
    images = rng.integers(0, 4, n)
    seqs = rng.integers(16, 1025, int(images.sum()))
    offsets = np.concatenate([[0], np.cumsum(images)])
    vit = np.array([seqs[a:b].sum() for a, b in zip(offsets[:-1], offsets[1:])], dtype=np.int64)
    return Lengths(vit, vit // 4 + rng.integers(10, 2000, n), vit_seqlens=seqs, vit_seqlens_offsets=offsets)


def test_fit_recovers_the_terms_of_exact_times():
    rng = np.random.default_rng(1)
    lengths = _varied_lengths(rng, 400)
    packs = _random_packs(lengths, rng, 80)
    true = CostModel(
        vit_linear=3e-6, vit_quadratic=2e-9, llm_linear=5e-6, llm_quadratic=4e-9, per_sample=2e-4, per_pack=3e-3
    )
    fit = CostModel.fit(lengths, packs, true.pack_costs(lengths, packs))
    np.testing.assert_allclose(fit.model.coefficients(), true.coefficients(), rtol=1e-6)
    assert fit.heldout_error.max < 1e-8 and fit.fit_packs.size == 40 and fit.heldout_packs.size == 40
    assert not set(fit.fit_packs) & set(fit.heldout_packs)
    np.testing.assert_allclose(fit.predicted, true.pack_costs(lengths, packs), rtol=1e-8)


def test_fit_reports_held_out_error_and_the_scaled_reference():
    rng = np.random.default_rng(2)
    lengths = _varied_lengths(rng, 300)
    packs = _random_packs(lengths, rng, 60)
    true = CostModel(vit_linear=3e-6, llm_linear=5e-6, per_pack=5e-3)
    noise = np.exp(rng.normal(0, 0.02, len(packs)))
    seconds = true.pack_costs(lengths, packs) * noise
    flops = CostModel(vit_linear=3.0, llm_linear=5.0)  # the true model without its overhead, in other units
    fit = CostModel.fit(lengths, packs, seconds, reference=flops, holdout=0.25, seed=3)
    assert fit.heldout_packs.size == 15
    held = np.abs(fit.predicted[fit.heldout_packs] / seconds[fit.heldout_packs] - 1)
    assert fit.heldout_error.median == pytest.approx(np.median(held))
    assert fit.heldout_error.median < 0.03
    # the reference lacks per_pack: worse, but scaled to the right unit (within a factor 2 of 1e-6)
    assert fit.reference_heldout_error.median > 2 * fit.heldout_error.median
    assert 0.5e-6 < fit.reference.vit_linear / 3.0 < 2e-6
    assert fit.to_dict()["reference_heldout_error"]["median"] == fit.reference_heldout_error.median


def test_huber_fit_is_not_pulled_by_a_few_packs_the_terms_cannot_describe():
    rng = np.random.default_rng(5)
    lengths = _varied_lengths(rng, 300)
    packs = _random_packs(lengths, rng, 60)
    true = CostModel(vit_linear=3e-6, llm_linear=5e-6, per_pack=5e-3)
    seconds = true.pack_costs(lengths, packs) * np.exp(rng.normal(0, 0.01, len(packs)))
    seconds[:3] *= 0.5  # three packs that skip work the terms charge for
    huber = CostModel.fit(lengths, packs, seconds, holdout=0)
    squared = CostModel.fit(lengths, packs, seconds, holdout=0, loss="squared")
    np.testing.assert_allclose(huber.model.coefficients(), true.coefficients(), rtol=0.05, atol=1e-9)
    assert np.abs(squared.model.coefficients() - true.coefficients()).max() > 0.1 * true.per_pack
    assert huber.fit_error.median < 0.02 < squared.fit_error.median
    with pytest.raises(ValueError, match="loss must be one of"):
        CostModel.fit(lengths, packs, seconds, loss="l1")


def test_fit_zeroes_terms_the_data_cannot_tell_apart():
    rng = np.random.default_rng(4)
    n = 200
    tiles = rng.integers(1, 13, n)
    lengths = Lengths(
        tiles,
        tiles * 256 + rng.integers(10, 500, n),
        vit_seqlens=np.ones(int(tiles.sum()), np.int64),
        vit_seqlens_offsets=np.concatenate([[0], np.cumsum(tiles)]),
    )
    packs = _random_packs(lengths, rng, 50)
    true = CostModel(vit_linear=1e-3, llm_linear=1e-5, per_pack=1e-3)
    fit = CostModel.fit(lengths, packs, true.pack_costs(lengths, packs), holdout=0)
    assert fit.model.vit_quadratic == 0.0 and fit.heldout_error is None  # sum s_j**2 == v for unit tiles
    assert fit.model.vit_linear == pytest.approx(1e-3, rel=1e-8)
    text = Lengths(np.zeros(n, np.int64), rng.integers(10, 500, n))
    fit = CostModel.fit(text, packs, CostModel(llm_linear=1e-5).pack_costs(text, packs))
    assert fit.model.vit_linear == fit.model.vit_quadratic == 0.0


def test_fit_checks_its_inputs():
    lengths = Lengths([1, 2, 3], [10, 20, 30])
    packs = [np.array([0]), np.array([1, 2]), np.array([2])]
    with pytest.raises(ValueError, match="one time per pack"):
        CostModel.fit(lengths, packs, [1.0, 2.0])
    with pytest.raises(ValueError, match="positive and finite"):
        CostModel.fit(lengths, packs, [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="holdout must be a share"):
        CostModel.fit(lengths, packs, [1.0, 1.0, 2.0], holdout=1.0)
    with pytest.raises(ValueError, match="at least 2 packs"):
        CostModel.fit(lengths, packs, [1.0, 1.0, 2.0], holdout=0.6)
    with pytest.raises(TypeError, match="reference must be a CostModel"):
        CostModel.fit(lengths, packs, [1.0, 1.0, 2.0], holdout=0, reference={"llm_linear": 1})


# ------------------------------------------------------------------------------------------------ from_config


transformers = pytest.importorskip("transformers")
from test_for_model import CONFIGS  # noqa: E402
from test_for_model import _model as _tiny_model  # noqa: E402

from omnibal_kernels import PlanOptions  # noqa: E402

# Forward FLOPs per unit of each term, worked out by hand for the tiny configs (hidden 32, 1 text layer,
# 2 heads of 16, 1 kv head, intermediate 64, vocabulary 128):
#   text per token: q 32*32 + k, v 2*32*16 + o 32*32 = 3072, MLP 3*32*64 = 6144, head 32*128 = 4096 MACs
#                   -> 2 * (3072 + 6144 + 4096) = 26624; causal attention 2 * 2 * 16 = 64 per t**2
#   qwen2_vl per patch: embed 3*2*2*2*32 = 768, block 4*32*32 + 2*32*64 = 8192, merger 32*32*4 + 32*32 = 5120
#                   -> 2 * 14080 = 28160; attention 4 * 32 * 1 block = 128 per s**2
#   qwen2_5_vl per patch: 768 + 2 blocks * (4*32*32 + 3*32*64 = 10240) + 5120 = 26368 -> 52736, plus the window
#                   block 4 * 32 * (8 // 2 // 2 * 2)**2 = 2048 -> 54784; the full-attention block 128 per s**2
#   internvl per tile: 16 patches + 1 class token; embed 16*3*4*4*32 = 24576, layer 17 * (4*32*32 + 2*32*64)
#                   = 139264, projector 4 tokens * (128*32 + 32*32) = 20480 -> 2 * 184320 = 368640, attention
#                   4 * 32 * 17**2 = 36992 -> 405632
HAND_FLOPS = {
    "llama": (0.0, 0.0, 26624, 64),
    "qwen2": (0.0, 0.0, 26624, 64),
    "qwen2_vl": (28160, 128, 26624, 64),
    "qwen2_5_vl": (54784, 128, 26624, 64),
    "internvl": (405632, 0.0, 26624, 64),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_from_config_matches_hand_counts(name):
    model = CostModel.from_config(CONFIGS[name]())
    want = np.array([*HAND_FLOPS[name], 0.0, 0.0]) * 3 / 1e9  # training = 3x forward, in GFLOP
    np.testing.assert_allclose(model.coefficients(), want, rtol=1e-12)


def test_from_config_reads_a_config_folder(tmp_path):
    CONFIGS["qwen2_vl"]().save_pretrained(tmp_path)
    assert CostModel.from_config(tmp_path) == CostModel.from_config(CONFIGS["qwen2_vl"]())
    assert CostModel.from_config(tmp_path / "config.json") == CostModel.from_config(tmp_path)
    with pytest.raises(FileNotFoundError):
        CostModel.from_config(tmp_path / "nothing")


def test_from_config_refuses_what_it_does_not_count():
    with pytest.raises(ValueError, match="model_type 'gpt2' is not counted"):
        CostModel.from_config(transformers.GPT2Config())


def _forward_flops(model, batch) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(**batch)
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "name,grids",
    [("llama", []), ("qwen2_vl", [(1, 4, 8), (2, 4, 4)]), ("qwen2_5_vl", [(1, 8, 8), (2, 4, 8)]), ("internvl", 3)],
)
def test_from_config_matches_the_flop_counter(name, grids):
    """Full windows (grids of 4 x 4 patch multiples) for Qwen2.5-VL, where the window count is exact."""
    from test_for_model import _internvl_sample, _qwen_sample

    from omnibal_kernels.packing import PackCollator

    model = _tiny_model(name, "eager").eval()
    rng = np.random.default_rng(0)
    if name == "llama":
        sample, units, squares = {"input_ids": rng.integers(3, 100, 23).tolist()}, 0, 0
    elif name == "internvl":
        sample, units, squares = _internvl_sample(rng, grids), grids, 0
    else:
        sample = _qwen_sample(rng, grids)
        units, squares = sum(t * h * w for t, h, w in grids), sum(t * (h * w) ** 2 for t, h, w in grids)
    t = len(sample["input_ids"])
    terms = CostModel.from_config(model.config).coefficients() * 1e9 / 3
    # eager attention computes all t**2 query-key pairs, twice the causal half of the LLM term
    want = terms[0] * units + terms[1] * squares + terms[2] * t + 2 * terms[3] * t * t
    assert _forward_flops(model, PackCollator.for_model(model)([sample])) == pytest.approx(want, rel=1e-9)
