"""The compiled extension's boundary: what its bindings accept and refuse, and the named results they return.

Planning goes through ``plan_packs``, which validates first; these call ``_C`` directly, as a user of the
extension could, so every check here is the binding's own.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels._ext import load as load_ext

C = load_ext()


def _loads(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 7, n), rng.integers(1, 3001, n)


def _packs(result) -> list[list[int]]:
    offsets, samples = result.offsets, result.samples
    return [samples[offsets[p] : offsets[p + 1]].tolist() for p in range(len(offsets) - 1)]


def _balanced(vit, llm, items=None, singles=None, vit_capacity=12, llm_capacity=4096, world_size=4):
    costs = np.abs(np.asarray(llm, dtype=np.float64))  # loads are checked past the costs
    return C.plan_balanced(
        vit, llm, items, singles, vit_capacity, llm_capacity, costs, 0.0, 4, world_size, False, 3, 1024
    )


# Array arguments of the bindings: (binding, argument) -> call with that argument replaced.
def _calls(vit, llm):
    items = np.arange(len(vit), dtype=np.int64)
    return {
        ("random_next_fit", "vit"): lambda a: C.random_next_fit(a, llm, None, 12, 4096, 0),
        ("isf", "llm"): lambda a: C.isf(vit, a, None, 12, 4096, 12, 3968, 5, 0),
        ("plan_balanced", "items"): lambda a: _balanced(vit, llm, items=a),
        ("plan_balanced", "singles"): lambda a: _balanced(vit, llm, items=items[:100], singles=a),
        ("shuffle", "values"): lambda a: C.shuffle(a, 0),
        ("load_stats", "llm"): lambda a: C.load_stats(vit, a, 256),
    }


ARRAY_ARGS = list(_calls(*np.zeros((2, 1), np.int64)))


# --- no silent casts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, bool, object])
@pytest.mark.parametrize("binding,arg", ARRAY_ARGS)
def test_non_integer_arrays_are_a_type_error_naming_the_argument(binding, arg, dtype):
    vit, llm = _loads()
    # integral values too: a float array is refused for its type, not for what its values happen to be
    bad = (np.arange(3) if arg in ("items", "singles", "values") else llm).astype(dtype)
    with pytest.raises(TypeError, match=rf"^{arg} must be an integer array"):
        _calls(vit, llm)[binding, arg](bad)


def test_a_float_sequence_is_a_type_error():
    vit, llm = _loads()
    with pytest.raises(TypeError, match="^items must be an integer array, got dtype float64"):
        C.random_next_fit(vit, llm, [0.0, 1.5], 12, 4096, 0)
    with pytest.raises(TypeError, match="^values must be an integer array"):
        C.shuffle("not numbers", 0)


def test_float_scalars_are_refused():
    vit, llm = _loads()
    with pytest.raises(TypeError):
        C.random_next_fit(vit, llm, None, 12.5, 4096, 0)
    with pytest.raises(TypeError):
        C.assign_random(10.0, 2, False, 0)


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.uint64]),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 120),
)
def test_integer_arrays_of_any_width_give_the_int64_result(dtype, seed, n):
    rng = np.random.default_rng(seed)
    vit, llm = rng.integers(0, 7, n), rng.integers(1, 120, n)
    items = rng.permutation(n)[: max(1, n // 2)]
    narrow = {name: a.astype(dtype) for name, a in (("vit", vit), ("llm", llm), ("items", items))}
    expected = _balanced(vit, llm, items=items, vit_capacity=8, llm_capacity=200)
    got = _balanced(narrow["vit"], narrow["llm"], items=narrow["items"], vit_capacity=8, llm_capacity=200)
    assert _packs(got.packs) == _packs(expected.packs)
    np.testing.assert_array_equal(got.assignment.step_packs, expected.assignment.step_packs)
    np.testing.assert_array_equal(C.shuffle(narrow["items"], seed), C.shuffle(items, seed))
    assert _packs(C.isf(narrow["vit"], narrow["llm"], None, 8, 200, 8, 180, 3, seed)) == _packs(
        C.isf(vit, llm, None, 8, 200, 8, 180, 3, seed)
    )


def test_uint64_values_above_int64_are_refused():
    with pytest.raises(ValueError, match=r"^values holds a value above 2\*\*63 - 1"):
        C.shuffle(np.array([1, 2**63 + 5], dtype=np.uint64), 0)


def test_empty_sequences_are_empty_id_sets():
    vit, llm = _loads()
    assert _packs(C.random_next_fit(vit, llm, [], 12, 4096, 0)) == []
    plan = _balanced(vit, llm, items=[], singles=[0, 1])
    assert sorted(plan.packs.samples.tolist()) == [0, 1]
    assert C.shuffle([], 0).tolist() == []


# --- values checked -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", ["items", "singles"])
@pytest.mark.parametrize("bad", [-1, 200, 10**12])
def test_sample_ids_out_of_range_are_refused(arg, bad):
    vit, llm = _loads(200)
    ids = np.array([3, bad, 5])
    with pytest.raises(ValueError, match=rf"^{arg}\[1\] = {bad} is not a sample id in \[0, 200\)"):
        _calls(vit, llm)["plan_balanced", arg](ids)
    with pytest.raises(ValueError, match=rf"^items\[1\] = {bad} is not a sample id"):
        C.isf(vit, llm, ids, 12, 4096, 12, 3968, 5, 0)


@pytest.mark.parametrize("method", ["random_next_fit", "isf", "plan_balanced"])
@pytest.mark.parametrize("which,load", [("vit", 2**31), ("llm", 2**32 + 7), ("llm", -1), ("vit", -(2**40))])
def test_loads_outside_int32_are_refused_not_wrapped(method, which, load):
    # 2**32 + 7 kept as int32 would be a 7-token sample: a plan that looks valid and is wrong.
    vit, llm = _loads(200)
    (vit if which == "vit" else llm)[17] = load
    calls = {
        "random_next_fit": lambda: C.random_next_fit(vit, llm, None, 12, 4096, 0),
        "isf": lambda: C.isf(vit, llm, None, 12, 4096, 12, 3968, 5, 0),
        "plan_balanced": lambda: _balanced(vit, llm),
    }
    with pytest.raises(ValueError, match=rf"^{which} load of sample 17 is {load}, outside \[0, 2147483647\]"):
        calls[method]()


def test_the_largest_load_is_kept_exactly():
    vit, llm = _loads(50)
    llm[7] = 2**31 - 1
    packs = _packs(C.random_next_fit(vit, llm, None, 12, 2**31 - 1, 0))
    assert [7] in packs and sorted(i for pack in packs for i in pack) == list(range(50))


def test_loads_must_be_one_dimensional_and_of_one_length():
    vit, llm = _loads(200)
    with pytest.raises(ValueError, match="^vit and llm must have the same length, got 200 and 199"):
        C.random_next_fit(vit, llm[:-1], None, 12, 4096, 0)
    with pytest.raises(ValueError, match="^llm must be 1-D, got 2 dimensions"):
        C.load_stats(vit, llm.reshape(20, 10), 256)
    with pytest.raises(ValueError, match="^items must be 1-D"):
        C.random_next_fit(vit, llm, np.zeros((2, 2), np.int64), 12, 4096, 0)


@pytest.mark.parametrize(
    "vit_capacity,llm_capacity,name", [(-1, 4096, "vit_capacity"), (12, 2**48 + 1, "llm_capacity")]
)
def test_capacities_out_of_range_are_refused(vit_capacity, llm_capacity, name):
    vit, llm = _loads()
    with pytest.raises(ValueError, match=rf"^{name} must be in \[0, 2\*\*48\]"):
        C.random_next_fit(vit, llm, None, vit_capacity, llm_capacity, 0)
    with pytest.raises(ValueError, match=rf"^{name} must be in \[0, 2\*\*48\]"):
        _balanced(vit, llm, vit_capacity=vit_capacity, llm_capacity=llm_capacity)


def test_scalar_options_are_checked():
    vit, llm = _loads()
    with pytest.raises(ValueError, match="^world_size must be >= 1, got 0"):
        _balanced(vit, llm, world_size=0)
    with pytest.raises(ValueError, match="^world_size must be >= 1"):
        C.assign_random(10, 0, False, 0)
    with pytest.raises(ValueError, match="^num_packs must be >= 0"):
        C.assign_random(-1, 2, False, 0)
    costs = llm.astype(np.float64)
    with pytest.raises(ValueError, match="^rounds must be >= 1, got 0"):
        C.plan_balanced(vit, llm, None, None, 12, 4096, costs, 0.0, 0, 4, False, 3, 1024)
    with pytest.raises(TypeError, match="^sample_costs must be a float64 array"):
        C.plan_balanced(vit, llm, None, None, 12, 4096, llm, 0.0, 4, 4, False, 3, 1024)
    with pytest.raises(ValueError, match=r"^sample_costs must be \(N,\) or \(N, 2\) with one row per sample"):
        C.plan_balanced(vit, llm, None, None, 12, 4096, costs[1:], 0.0, 4, 4, False, 3, 1024)
    for bad in (-1.0, float("nan"), float("inf")):
        poisoned = costs.copy()
        poisoned[2] = bad
        with pytest.raises(ValueError, match=r"^sample_costs\[2\] = .* is not a finite cost >= 0"):
            C.plan_balanced(vit, llm, None, None, 12, 4096, poisoned, 0.0, 4, 4, False, 3, 1024)
    with pytest.raises(ValueError, match="^per_pack must be a finite cost >= 0"):
        C.plan_balanced(vit, llm, None, None, 12, 4096, costs, -1.0, 4, 4, False, 3, 1024)
    with pytest.raises(ValueError, match="^work_per_sample must be >= 0"):
        C.plan_balanced(vit, llm, None, None, 12, 4096, costs, 0.0, 4, 4, False, 3, -1)
    with pytest.raises(ValueError, match="^llm_bin must be >= 1"):
        C.load_stats(vit, llm, 0)


# --- named results ------------------------------------------------------------------------------------------


def test_results_are_named_read_only_and_not_positional():
    vit, llm = _loads(200)
    plan = _balanced(vit, llm, world_size=4)
    packs, assignment = plan.packs, plan.assignment
    assert packs.offsets[0] == 0 and packs.offsets[-1] == len(packs.samples) == 200
    assert assignment.step_packs.shape[1] == 4 and assignment.step_packs.dtype == np.int64
    assert assignment.duplicated_slots == assignment.step_packs.size - (len(packs.offsets) - 1)
    assert assignment.dropped_packs.tolist() == []
    assert repr(packs) == f"Packs(num_packs={len(packs.offsets) - 1}, num_samples=200)"
    for result, field in ((packs, "offsets"), (assignment, "step_packs"), (plan, "packs")):
        with pytest.raises(AttributeError):
            setattr(result, field, None)
    for result in (
        packs,
        assignment,
        plan,
        C.random_next_fit(vit, llm, None, 12, 4096, 0),
        C.assign_random(9, 2, True, 0),
        C.load_stats(vit, llm, 256),
        C.parse_length_records(b"[]", "vit_num", "token_num"),
    ):
        with pytest.raises(TypeError):
            _a, _b = result  # no tuple unpacking: fields are read by name


def test_assign_random_result():
    a = C.assign_random(9, 2, True, 0)
    assert a.step_packs.shape == (4, 2) and a.duplicated_slots == 0 and len(a.dropped_packs) == 1
    assert sorted(a.step_packs.ravel().tolist() + a.dropped_packs.tolist()) == list(range(9))


def test_length_records_and_load_stats_results():
    ok = C.parse_length_records(b'[{"vit_num": 2, "token_num": 10}, {"token_num": 7}]', "vit_num", "token_num")
    assert (ok.vit.tolist(), ok.llm.tolist(), ok.error, ok.error_sample) == ([2, 0], [10, 7], "", -1)
    bad = C.parse_length_records(b'[{"vit_num": 2, "token_num": 10}, {"vit_num": 1}]', "vit_num", "token_num")
    assert bad.error.startswith("'token_num' is missing") and bad.error_sample == 1
    s = C.load_stats(np.array([1, 5]), np.array([300, 10]), 256)
    assert (s.vit_sum, s.llm_sum, s.vit_max, s.llm_max, s.llm_sum_binned) == (6, 310, 5, 300, 768)
