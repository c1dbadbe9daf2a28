"""What a recomputed layer costs: the profile's measured ``recompute_ms`` (in the backward) and
``checkpoint_forward_ms`` (in the forward), their JSON form, and every place that prices recomputation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.balance import CostModel
from omnibal_kernels.omniverse import affine_profile
from omnibal_kernels.omniverse.data import MicroBatches
from omnibal_kernels.omniverse.run import scaled_profile
from omnibal_kernels.pipeline import (
    LayerProfile,
    ModelProfile,
    evaluate_partition,
    partition,
    stage_kind_times,
    uniform_stages,
)
from omnibal_kernels.pipeline.costs import StageCosts

ROW = {
    "name": "a",
    "forward_ms": 2.0,
    "backward_ms": 4.0,
    "activation_bytes": 100,
    "static_bytes": 5,
    "output_bytes": 3,
}


def _chain(rng: np.random.Generator, n: int, measured: bool) -> ModelProfile:
    layers = []
    for i in range(n):
        f = float(rng.uniform(0.5, 3.0))
        extra = {}
        if measured:
            extra = {
                "recompute_ms": f * float(rng.uniform(0.8, 1.5)),
                "checkpoint_forward_ms": f * float(rng.uniform(0.0, 0.3)),
            }
        layers.append(
            LayerProfile(
                f"l{i}",
                f,
                2 * f,
                int(rng.integers(10, 100)) * 10**6,
                int(rng.integers(0, 50)) * 10**6,
                int(rng.integers(1, 10)) * 10**6,
                **extra,
            )
        )
    return ModelProfile(tuple(layers), input_bytes=10**6)


def test_old_profiles_price_recompute_as_the_forward_again():
    prof = ModelProfile.from_dict({"layers": [{**ROW, "fixed_forward_ms": 0.5}, {**ROW, "name": "b"}]})
    assert all(layer.recompute_ms is None for layer in prof.layers)
    np.testing.assert_array_equal(prof.recompute_ms, prof.forward_ms)
    np.testing.assert_array_equal(prof.fixed_recompute_ms, prof.fixed_forward_ms)
    np.testing.assert_array_equal(prof.checkpoint_forward_ms, [0.0, 0.0])
    assert "recompute_ms" not in prof.to_dict()["layers"][0]


def test_measured_fields_round_trip():
    row = {**ROW, "recompute_ms": 2.5, "checkpoint_forward_ms": 0.25, "fixed_recompute_ms": 0.5}
    prof = ModelProfile.from_dict({"layers": [row, {**ROW, "name": "b", "recompute_ms": 0.0}]})
    again = ModelProfile.from_dict(prof.to_dict())
    assert again == prof
    np.testing.assert_array_equal(again.recompute_ms, [2.5, 0.0])  # measured as nothing is not the default
    np.testing.assert_array_equal(again.fixed_recompute_ms, [0.5, 0.0])
    np.testing.assert_array_equal(again.checkpoint_forward_ms, [0.25, 0.0])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"recompute_ms": -1.0}, "recompute_ms must be finite and >= 0"),
        ({"checkpoint_forward_ms": float("nan")}, "checkpoint_forward_ms must be finite"),
        ({"recompute_ms": 1.0, "fixed_recompute_ms": 2.0}, "fixed_recompute_ms must be at most recompute_ms"),
        ({"fixed_recompute_ms": 0.5}, "fixed_recompute_ms needs recompute_ms"),
        ({"checkpoint_forward_ms": 0.1, "fixed_checkpoint_forward_ms": 0.2}, "must be at most checkpoint_forward_ms"),
        ({"recompute_ms": "slow"}, "recompute_ms"),
    ],
)
def test_bad_recompute_fields_raise_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        ModelProfile.from_dict({"layers": [{**ROW, **change}]}, source="p.json")


def test_the_fallback_is_the_same_as_measuring_the_forward_again():
    """A profile whose measured recompute cost is its forward time plans exactly as one without it."""
    prof = _chain(np.random.default_rng(3), 8, measured=False)
    same = ModelProfile(tuple(replace(layer, recompute_ms=layer.forward_ms) for layer in prof.layers))
    kw = dict(micro_batches=4, link_gb_per_s=25.0)
    budget = 0.7 * max(partition(prof, 3, **kw).memory_bytes)
    assert partition(same, 3, memory_bytes=budget, **kw) == partition(prof, 3, memory_bytes=budget, **kw)


def test_a_given_choice_pays_the_measured_cost_in_the_pass_where_it_lands():
    prof = _chain(np.random.default_rng(5), 6, measured=True)
    stages = uniform_stages(6, 2)
    chosen = [[0, 2], [4]]
    kw = dict(micro_batches=4, link_gb_per_s=0.0, recompute=chosen)
    base = evaluate_partition(prof, stages, **kw)
    none = evaluate_partition(prof, stages, micro_batches=4, link_gb_per_s=0.0, recompute="none")
    for j, layers in enumerate(chosen):
        rec = sum(prof.layers[i].recompute_ms for i in layers)
        ckpt = sum(prof.layers[i].checkpoint_forward_ms for i in layers)
        assert base.backward_ms[j] == pytest.approx(none.backward_ms[j] + rec, rel=1e-12)
        assert base.forward_ms[j] == pytest.approx(none.forward_ms[j] + ckpt, rel=1e-12)
    # the recompute cost of layer 4 doubled: the backward of its stage longer by exactly that, nothing else moves
    doubled = list(prof.layers)
    doubled[4] = replace(doubled[4], recompute_ms=2 * doubled[4].recompute_ms)
    more = evaluate_partition(ModelProfile(tuple(doubled), input_bytes=prof.input_bytes), stages, **kw)
    assert more.backward_ms[1] - base.backward_ms[1] == pytest.approx(prof.layers[4].recompute_ms, rel=1e-12)
    assert more.forward_ms == base.forward_ms and more.backward_ms[0] == base.backward_ms[0]


def test_the_plan_recomputes_the_layer_of_least_measured_cost():
    """Two layers that save the same bytes: the one whose forward is cheaper but whose measured recompute (both
    passes) costs more is kept, and the same profile without the measurements recomputes it."""
    cheap_forward = LayerProfile("a", 1.0, 2.0, 10**6, 0, 10**5, recompute_ms=3.0, checkpoint_forward_ms=0.5)
    dear_forward = LayerProfile("b", 2.0, 4.0, 10**6, 0, 10**5, recompute_ms=2.0, checkpoint_forward_ms=0.0)
    prof = ModelProfile((cheap_forward, dear_forward), input_bytes=10**5)
    full = evaluate_partition(prof, [(0, 1)], micro_batches=1, recompute="none").memory_bytes[0]
    kw = dict(micro_batches=1, memory_bytes=full - 0.5 * 10**6, recompute="plan")
    assert evaluate_partition(prof, [(0, 1)], **kw).recompute == ((1,),)
    old = ModelProfile(tuple(replace(x, recompute_ms=None, checkpoint_forward_ms=0.0) for x in prof.layers), 10**5)
    assert evaluate_partition(old, [(0, 1)], **kw).recompute == ((0,),)


def test_recompute_all_pays_both_parts():
    prof = _chain(np.random.default_rng(8), 4, measured=True)
    plan = evaluate_partition(prof, [(0, 3)], micro_batches=2, recompute="all", link_gb_per_s=0.0)
    assert plan.recompute == ((0, 1, 2, 3),)
    assert plan.forward_ms[0] == pytest.approx(float((prof.forward_ms + prof.checkpoint_forward_ms).sum()))
    assert plan.backward_ms[0] == pytest.approx(float((prof.backward_ms + prof.recompute_ms).sum()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 9))
def test_least_parts_stay_below_every_choice(seed, n):
    """The per-pass times the search bounds with are at most those of any choice costing at least as much."""
    rng = np.random.default_rng(seed)
    prof = _chain(rng, n, measured=True)
    costs = StageCosts(prof, 1, 1, 2, "1f1b", None, "none", 0.0, 0.5)
    a = int(rng.integers(0, n))
    b = int(rng.integers(a, n))
    layers = np.arange(a, b + 1)
    chosen = layers[rng.random(layers.size) < 0.6]
    rec_b = float(prof.recompute_ms[chosen].sum())
    rec_f = float(prof.checkpoint_forward_ms[chosen].sum())
    f, bb, _ = costs.parts(0, a, b, rec_b, rec_f)
    lf, lb, _ = costs.least_parts(0, a, b, rec_b + rec_f)
    assert lf <= f * (1 + 1e-12) and lb <= bb * (1 + 1e-12)


def test_stage_times_place_checkpoint_work_in_the_forward_and_scale_it():
    layers = [
        LayerProfile("v", 2.0, 4.0, 100, 0, 10, kind="vit"),
        LayerProfile(
            "l",
            3.0,
            6.0,
            100,
            0,
            10,
            kind="llm",
            fixed_forward_ms=1.0,
            recompute_ms=4.0,
            fixed_recompute_ms=1.0,
            checkpoint_forward_ms=0.5,
            fixed_checkpoint_forward_ms=0.25,
        ),
    ]
    prof = ModelProfile(tuple(layers))
    plan = evaluate_partition(prof, [(0, 1)], micro_batches=2, recompute=[[1]], link_gb_per_s=0.0)
    times = stage_kind_times(plan, prof).times({"llm": np.array([1.0, 3.0]), "vit": np.array([1.0, 1.0])})
    # the llm layer at 3x its cost: fixed parts stay, the rest triples
    np.testing.assert_allclose(times.checkpoint_forward_ms[:, 0], [0.5, 0.25 + 3 * 0.25])
    np.testing.assert_allclose(times.recompute_ms[:, 0], [4.0, 1.0 + 3 * 3.0])
    np.testing.assert_allclose(times.forward_ms[:, 0], [2.0 + 3.0 + 0.5, 2.0 + 1.0 + 3 * 2.0 + 1.0])
    np.testing.assert_allclose(times.backward_ms[:, 0], [4.0 + 6.0 + 4.0, 4.0 + 18.0 + 10.0])


def test_affine_and_scaled_profiles_carry_the_measured_cost():
    """Fixed parts of the recompute cost fitted like those of the forward, and kept when a profile is scaled."""
    model = CostModel(0.0, 0.0, 1.0, 0.0)  # an llm layer's cost is its tokens

    def measured(tokens: float) -> ModelProfile:
        layer = LayerProfile(
            "l",
            1.0 + tokens,
            2.0 + 2 * tokens,
            100,
            0,
            10,
            kind="llm",
            recompute_ms=0.5 + 1.5 * tokens,
            checkpoint_forward_ms=0.25 + 0.1 * tokens,
        )
        return ModelProfile((layer,))

    refs = [(np.array([0.0]), np.array([2.0])), (np.array([0.0]), np.array([4.0]))]
    fitted = affine_profile([measured(2.0), measured(4.0)], refs, model).layers[0]
    assert fitted.fixed_forward_ms == pytest.approx(1.0)
    assert fitted.fixed_recompute_ms == pytest.approx(0.5)
    assert fitted.fixed_checkpoint_forward_ms == pytest.approx(0.25)
    # the profile as that of micro-batches of twice the reference's tokens
    data = MicroBatches(
        "balanced", np.zeros(2), np.array([4.0, 4.0]), np.array([0, 1, 2]), np.array([[[0, 1]]]), 2, 0.0
    )
    scaled = scaled_profile(ModelProfile((fitted,)), refs[0], data, model).layers[0]
    assert scaled.recompute_ms == pytest.approx(0.5 + 1.5 * 4.0)
    assert scaled.checkpoint_forward_ms == pytest.approx(0.25 + 0.1 * 4.0)
    assert scaled.forward_ms == pytest.approx(1.0 + 4.0)
