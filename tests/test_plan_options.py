"""PlanOptions: checked once where built, the one way every planning entry takes its settings, the sampler's
per-group options, and the per-epoch seed of the engine."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omnibal_kernels as ok
from omnibal_kernels.balance import CostModel, IsfOptions, PlanOptions, epoch_seed, plan_packs, search_capacity
from omnibal_kernels.lengths import Lengths, default_lengths
from omnibal_kernels.sampler import BalancedBatchSampler
from omnibal_kernels.streaming import BalancedPacker, streaming_report


@pytest.fixture(scope="module")
def real() -> Lengths:
    lengths = default_lengths()
    return lengths[np.sort(np.random.default_rng(2).choice(len(lengths), 3000, replace=False))]


# ------------------------------------------------------------------------------------------- the object


def test_exported_at_top_level_and_frozen():
    assert ok.PlanOptions is PlanOptions and ok.IsfOptions is IsfOptions
    options = PlanOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3  # type: ignore[misc]
    assert options.cost_model == CostModel.internvl_7b() and options.isf == IsfOptions()
    assert PlanOptions(cost_model=None) == options  # None is the default model
    assert hash(options) == hash(PlanOptions())


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(method="greedy"), ValueError, "method must be one of"),
        (dict(oversize="keep"), ValueError, "oversize must be one of"),
        (dict(vit_capacity=4), ValueError, "give both vit_capacity and llm_capacity"),
        (dict(vit_capacity=-1, llm_capacity=10), ValueError, "vit_capacity must be >= 0"),
        (dict(vit_capacity=0, llm_capacity=0), ValueError, "llm_capacity must be >= 1"),
        (dict(vit_capacity=1.5, llm_capacity=10), TypeError, "vit_capacity must be an int"),
        (dict(vit_capacity=2**48 + 1, llm_capacity=10), ValueError, r"vit_capacity must be at most 2\*\*48"),
        (dict(target_batch_size=0), ValueError, "target_batch_size must be a positive number"),
        (dict(target_batch_size=float("nan")), ValueError, "target_batch_size must be a positive number"),
        (dict(target_batch_size=True), TypeError, "target_batch_size must be a positive number"),
        (
            dict(target_batch_size="4"),
            TypeError,
            r"target_batch_size must be a positive number \(int or float\), got str",
        ),
        (dict(drop_last="yes"), TypeError, "drop_last must be a bool"),
        (dict(seed=2**64), ValueError, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
        (dict(seed="0"), TypeError, "seed must be an int"),
        (dict(cost_model="internvl"), TypeError, "cost_model must be a CostModel"),
        (dict(isf=50), TypeError, "isf must be an IsfOptions"),
        (dict(isf=IsfOptions(vit_threshold=3)), ValueError, "apply to method='isf' only"),
        (
            dict(method="isf", vit_capacity=4, llm_capacity=40, isf=IsfOptions(llm_threshold=41)),
            ValueError,
            "must not exceed the capacities",
        ),
    ],
)
def test_bad_fields_fail_where_the_options_are_built(fields, error, message):
    with pytest.raises(error, match=message):
        PlanOptions(**fields)


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(iterations=0), ValueError, "iterations must be >= 1"),
        (dict(iterations=10**7), ValueError, "iterations must be at most"),
        (dict(iterations=2.0), TypeError, "iterations must be an int"),
        (dict(vit_threshold=-1), ValueError, "vit_threshold must be >= 0"),
    ],
)
def test_bad_isf_fields(fields, error, message):
    with pytest.raises(error, match=message):
        IsfOptions(**fields)


def test_values_are_normalized_and_replace_checks_again():
    options = PlanOptions(
        vit_capacity=np.int64(12),
        llm_capacity=np.int32(5000),
        target_batch_size=np.float32(3),
        drop_last=np.bool_(True),
    )
    assert (type(options.vit_capacity), type(options.llm_capacity)) == (int, int)
    assert type(options.target_batch_size) is float and options.drop_last is True
    with pytest.raises(ValueError, match="method must be one of"):
        options.replace(method="greedy")
    # thresholds with searched capacities are checked once the capacities are known
    isf = PlanOptions(method="isf", isf=IsfOptions(vit_threshold=30))
    with pytest.raises(ValueError, match="must not exceed the capacities"):
        isf.replace(vit_capacity=18, llm_capacity=6016)
    assert PlanOptions(method="isf", vit_capacity=18, llm_capacity=6016).isf_thresholds() == (18, 6016 - 128)


# ------------------------------------------------------------------------------------------- one way in


ENTRIES = {
    "plan_packs": plan_packs,
    "search_capacity": search_capacity,
    "BalancedBatchSampler": BalancedBatchSampler,
    "BalancedPacker": BalancedPacker,
    "streaming_report": streaming_report,
}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_planning_entries_take_the_options_object_and_no_copy_of_its_fields(name):
    params = set(inspect.signature(ENTRIES[name]).parameters)
    fields = {f.name for f in dataclasses.fields(PlanOptions)} | {f.name for f in dataclasses.fields(IsfOptions)}
    assert "options" in params
    assert not params & (fields | {"context_parallel_size"}), f"{name} copies planning fields as keywords"


def test_a_field_given_as_a_keyword_is_a_type_error_naming_it(real):
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        plan_packs(real, world_size=4, seed=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'target_batch_size'"):
        BalancedBatchSampler(real, world_size=1, rank=0, target_batch_size=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="options must be a PlanOptions, got dict"):
        plan_packs(real, {"seed": 1}, world_size=4)  # type: ignore[arg-type]


def test_plan_packs_plans_with_the_options_it_is_given(real):
    options = PlanOptions(
        method="isf",
        vit_capacity=16,
        llm_capacity=5000,
        oversize="single",
        drop_last=True,
        seed=5,
        isf=IsfOptions(iterations=30, llm_threshold=4500),
    )
    plan = plan_packs(real, options, world_size=4, epoch=2)
    assert plan.fingerprint() == plan_packs(real, options=options, world_size=4, epoch=2).fingerprint()
    assert (plan.method, plan.llm_threshold, plan.seed, plan.epoch) == ("isf", 4500, 5, 2)
    reseeded = plan_packs(real, options.replace(seed=6), world_size=4, epoch=2)
    assert reseeded.seed == 6 and reseeded.fingerprint() != plan.fingerprint()
    searched = plan_packs(real, PlanOptions(target_batch_size=3), world_size=4)
    caps = search_capacity(real, PlanOptions(target_batch_size=3))
    assert (searched.vit_capacity, searched.llm_capacity) == (caps.vit_capacity, caps.llm_capacity)


def test_search_capacity_takes_options(real):
    options = PlanOptions(method="isf", target_batch_size=3, seed=2, isf=IsfOptions(iterations=20))
    caps = search_capacity(real, options, world_size=4)
    assert caps == search_capacity(real, options=options, world_size=4)
    assert caps != search_capacity(real, options.replace(target_batch_size=5), world_size=4)
    with pytest.raises(ValueError, match="nothing to search"):
        search_capacity(real, PlanOptions(vit_capacity=16, llm_capacity=5000))


def test_sampler_packer_and_report_take_options(real):
    options = PlanOptions(vit_capacity=16, llm_capacity=5376, drop_last=True, seed=3)
    a = BalancedBatchSampler(real, options, world_size=2, rank=1, micro_steps_per_step=2)
    assert a.options == (options,) and (a.seed, a.drop_last) == (3, True)
    c = BalancedBatchSampler(real, options.replace(seed=4), world_size=2, rank=1, micro_steps_per_step=2)
    assert c.seed == 4 and c.fingerprint() != a.fingerprint()

    source = [(int(v), int(t)) for v, t in zip(real.vit, real.llm)]
    packs = list(BalancedPacker(source, lambda s: s, options, buffer_size=500, world_size=2, rank=0))
    assert sum(len(p) for p in packs) > 0
    report = streaming_report(real, options, buffer_size=500, world_size=2)
    assert report.streaming.num_samples > 0
    with pytest.raises(ValueError, match="a stream needs vit_capacity and llm_capacity"):
        BalancedPacker(source, lambda s: s, PlanOptions(), world_size=2, rank=0)
    with pytest.raises(ValueError, match="a stream needs vit_capacity and llm_capacity"):
        streaming_report(real, PlanOptions(), world_size=2)


def test_isf_options_reach_the_sampler_and_its_state(real):
    caps = PlanOptions(method="isf", vit_capacity=16, llm_capacity=5376)
    default = BalancedBatchSampler(real, caps, world_size=2, rank=0)
    fewer = BalancedBatchSampler(real, caps.replace(isf=IsfOptions(iterations=3)), world_size=2, rank=0)
    assert (
        fewer.plans()[0].fingerprint()
        == plan_packs(real, caps.replace(isf=IsfOptions(iterations=3)), world_size=2).fingerprint()
    )
    assert fewer.fingerprint() != default.fingerprint()
    with pytest.raises(ValueError, match="other lengths or options"):
        fewer.load_state_dict(default.state_dict())


# ------------------------------------------------------------------------------------------- per group


# The groups' own targets may be raised for their longest samples; this test is about the options per group.
@pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")
def test_per_group_options_as_a_sequence(real):
    groups = (real.llm > np.median(real.llm)).astype(np.int64)
    shared = PlanOptions(seed=1)
    per_group = [shared.replace(vit_capacity=12, llm_capacity=3000), shared.replace(vit_capacity=18, llm_capacity=6016)]
    sampler = BalancedBatchSampler(real, per_group, world_size=2, rank=0, groups=groups)
    assert sampler.capacities == [(12, 3000), (18, 6016)]
    for g, plan in enumerate(sampler.plans()):
        assert (plan.vit_capacity, plan.llm_capacity) == sampler.capacities[g]
    # searched per group, one target each
    targets = BalancedBatchSampler(
        real, [shared.replace(target_batch_size=2), shared], world_size=2, rank=0, groups=groups
    )
    assert targets.capacities == [
        search_capacity(real[targets.groups[0]], PlanOptions(target_batch_size=2))[:2],
        search_capacity(real[targets.groups[1]], PlanOptions(target_batch_size=4))[:2],
    ]


def test_per_group_options_must_agree_on_the_shared_fields(real):
    groups = np.arange(len(real)) % 2
    caps = PlanOptions(vit_capacity=18, llm_capacity=6016)
    with pytest.raises(ValueError, match=r"options has 3 entries for 2 groups"):
        BalancedBatchSampler(real, [caps] * 3, world_size=1, rank=0, groups=groups)
    with pytest.raises(ValueError, match=r"group 1 differ from group 0's in seed"):
        BalancedBatchSampler(real, [caps, caps.replace(seed=1)], world_size=1, rank=0, groups=groups)
    with pytest.raises(ValueError, match=r"group 1 differ from group 0's in method"):
        BalancedBatchSampler(real, [caps, caps.replace(method="random")], world_size=1, rank=0, groups=groups)
    with pytest.raises(TypeError, match=r"group 1: options must be a PlanOptions, got dict"):
        BalancedBatchSampler(real, [caps, {"seed": 1}], world_size=1, rank=0, groups=groups)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="options must be a PlanOptions or a sequence"):
        BalancedBatchSampler(real, {"seed": 1}, world_size=1, rank=0)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the seed


def _splitmix64(z: int) -> int:
    """One SplitMix64 output from state ``z`` (Steele, Lea and Flood 2014), written out in Python."""
    mask = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(-(2**63), 2**64 - 1), epoch=st.integers(0, 2**63 - 1))
def test_epoch_seed_is_two_splitmix64_steps_of_the_engine(seed, epoch):
    mask = (1 << 64) - 1
    assert epoch_seed(seed, epoch) == _splitmix64(_splitmix64(seed & mask) ^ epoch)


def test_epoch_seed_known_values():
    # the published first output of SplitMix64 from state 0, then one more step with epoch 0
    assert _splitmix64(0) == 0xE220A8397B1DCDAF
    assert epoch_seed(0, 0) == _splitmix64(0xE220A8397B1DCDAF)
