"""Argument checks and error types of the planning functions (the planning results are in test_balance.py)."""

from __future__ import annotations

import numpy as np
import pytest

from omnibal_kernels import PlanOptions
from omnibal_kernels.balance import TooFewPacksError, plan_packs, search_capacity
from omnibal_kernels.balance.report import mean_over_max as _mean_over_max
from omnibal_kernels.lengths import Lengths


def _lengths() -> Lengths:
    rng = np.random.default_rng(0)
    return Lengths(rng.integers(0, 6, 200), rng.integers(10, 900, 200))


def test_search_capacity_checks_method_and_oversize():
    with pytest.raises(ValueError, match="method must be one of"):
        search_capacity(
            _lengths(),
            PlanOptions(
                target_batch_size=4,
                method="greedy",
            ),
        )
    with pytest.raises(ValueError, match="oversize must be one of"):
        search_capacity(
            _lengths(),
            PlanOptions(
                target_batch_size=4,
                oversize="keep",
            ),
        )
    with pytest.raises(TypeError, match="target_batch_size"):
        search_capacity(
            _lengths(),
            PlanOptions(target_batch_size=True),
        )


@pytest.mark.parametrize("target", ["4", None, [4]])
def test_a_target_batch_size_that_is_no_number_is_a_type_error(target):
    with pytest.raises(TypeError, match="target_batch_size must be a positive number .*str|NoneType|list"):
        plan_packs(_lengths(), PlanOptions(target_batch_size=target), world_size=2)
    with pytest.raises(ValueError, match="target_batch_size must be a positive number"):
        plan_packs(_lengths(), PlanOptions(target_batch_size=-1), world_size=2)


def test_search_capacity_takes_numpy_targets_and_plain_arrays():
    lengths = _lengths()
    expected = search_capacity(
        lengths,
        PlanOptions(target_batch_size=4.0),
    )
    assert (
        search_capacity(
            lengths,
            PlanOptions(target_batch_size=np.float32(4.0)),
        )
        == expected
    )
    assert (
        search_capacity(
            lengths,
            PlanOptions(target_batch_size=np.int64(4)),
        )
        == expected
    )
    assert (
        search_capacity(
            (lengths.vit, lengths.llm),
            PlanOptions(target_batch_size=4.0),
        )
        == expected
    )
    assert expected.llm_threshold == expected.llm_capacity - 128


def test_too_few_packs_is_its_own_value_error():
    with pytest.raises(TooFewPacksError, match="no step is left") as info:
        plan_packs(
            _lengths()[np.arange(3)], PlanOptions(vit_capacity=100, llm_capacity=10_000, drop_last=True), world_size=8
        )
    assert isinstance(info.value, ValueError)


def test_efficiency_of_no_steps_and_of_idle_steps():
    assert _mean_over_max(np.zeros((0, 4))) == 1.0
    assert _mean_over_max(np.array([[0.0, 0.0], [1.0, 3.0]])) == pytest.approx((1.0 + 2.0 / 3.0) / 2)
