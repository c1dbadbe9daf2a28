"""The one implementation of offsets (``cu_seqlens``, CSR rows): built from counts, checked, the int32 limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnibal_kernels._csr import (
    INT32_MAX,
    check_int32_total,
    check_offset_values,
    offsets_from_counts,
    row_sums,
    row_totals,
)


@given(st.lists(st.integers(0, 2**40), max_size=50))
def test_offsets_of_counts_pass_the_check_and_give_the_counts_back(counts: list[int]) -> None:
    offsets = offsets_from_counts(counts)
    assert offsets.dtype == np.int64 and offsets.shape == (len(counts) + 1,)
    assert np.diff(offsets).tolist() == counts
    check_offset_values("offsets", offsets, sum(counts))


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=12), st.integers(-5, 5))
def test_the_check_refuses_exactly_what_breaks_a_rule(values: list[int], end_shift: int) -> None:
    """Any int32 offsets (differences that wrap around in int32 included): a ValueError naming the argument iff
    they do not start at 0, decrease somewhere or do not end at the total."""
    offsets = np.array(values, dtype=np.int32)
    total = values[-1] + end_shift
    broken = values[0] != 0 or any(b < a for a, b in zip(values, values[1:])) or values[-1] != total
    if broken:
        with pytest.raises(ValueError, match="cu_seqlens"):
            check_offset_values("cu_seqlens", offsets, total, row="sequence")
    else:
        check_offset_values("cu_seqlens", offsets, total, row="sequence")


def test_messages_name_the_argument_the_row_and_the_place() -> None:
    with pytest.raises(ValueError, match=r"^f: x must start at 0, got 1$"):
        check_offset_values("x", np.array([1, 2]), where="f")
    with pytest.raises(ValueError, match=r"^pack 1: x must be non-decreasing, but x\[2\] = 2 < x\[1\] = 3$"):
        check_offset_values("x", np.array([0, 3, 2]), row="pack")
    with pytest.raises(ValueError, match=r"x must end at the number of tokens \(4\), got x\[-1\] = 3"):
        check_offset_values("x", np.array([0, 3]), 4, total_of="tokens")


def test_the_int32_limit() -> None:
    check_int32_total("cu_seqlens", INT32_MAX)
    with pytest.raises(ValueError, match=r"^f: 2147483648 patches in total overflow int32 vit_cu_seqlens"):
        check_int32_total("vit_cu_seqlens", INT32_MAX + 1, "patches", where="f")


def test_empty_counts_give_one_offset() -> None:
    assert offsets_from_counts([]).tolist() == [0]
    assert offsets_from_counts(np.zeros(0, np.int32)).tolist() == [0]


@pytest.mark.property
@given(st.lists(st.lists(st.integers(0, 9), max_size=4), min_size=1, max_size=8), st.integers(0, 3))
def test_row_sums_of_any_rows_match_a_plain_loop(rows: list[list[int]], trailing_empty: int) -> None:
    # any rows, empty ones first, between or last included: each sum is its own row's, never a neighbour's
    rows = rows + [[]] * trailing_empty
    offsets = offsets_from_counts([len(r) for r in rows])
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    expected = [sum(r) for r in rows]
    assert row_sums(offsets, values).tolist() == expected
    assert row_totals(offsets, values).tolist() == [float(e) for e in expected]


def test_pipeline_pack_costs_keep_the_last_sample_before_an_empty_pack() -> None:
    from omnibal_kernels.pipeline.micro_batches import pack_kind_costs

    whole = pack_kind_costs(np.zeros(2), np.array([100.0, 200.0]), np.array([0, 2]))
    then_empty = pack_kind_costs(np.zeros(2), np.array([100.0, 200.0]), np.array([0, 2, 2]))
    for kind, cost in whole.items():
        assert then_empty[kind].tolist() == [cost[0], 0.0]
