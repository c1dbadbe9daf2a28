"""nnls against brute force: on small problems, every subset of columns is tried as the free set."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.balance.nnls import fit_relative, nnls


def _brute_force(a: np.ndarray, b: np.ndarray) -> float:
    """The least residual over every non-negative least-squares solution on a subset of the columns."""
    best = float(np.linalg.norm(b))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            z = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)[0]
            if (z >= 0).all():
                best = min(best, float(np.linalg.norm(a[:, list(cols)] @ z - b)))
    return best


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(0, 2**32 - 1), st.booleans())
def test_nnls_matches_brute_force(m, n, seed, duplicate):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, n)) * 10.0 ** rng.integers(-3, 4, size=n)
    if duplicate and n > 1:
        a[:, -1] = 2.0 * a[:, 0]  # dependent columns
    b = rng.normal(size=m)
    result = nnls(a, b)
    assert (result.x >= 0).all()
    assert result.residual == pytest.approx(float(np.linalg.norm(a @ result.x - b)))
    assert result.residual <= _brute_force(a, b) * (1 + 1e-7) + 1e-9
    # the Karush-Kuhn-Tucker conditions: no column at zero wants to grow
    gradient = a.T @ (b - a @ result.x)
    scale = np.linalg.norm(a, axis=0) * max(np.linalg.norm(b), 1.0)
    assert (gradient[result.x == 0] <= 1e-7 * scale[result.x == 0] + 1e-9).all()


def test_nnls_exact_non_negative_solution_and_bad_input():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    x = np.array([3.0, 0.5])
    np.testing.assert_allclose(nnls(a, a @ x).x, x, rtol=1e-12)
    # the unconstrained solution is negative in one entry: nnls clips it to 0 and refits the other
    b = np.array([1.0, -4.0, 0.0])
    result = nnls(a, b)
    assert result.x[1] == 0.0 and result.x[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs a"):
        nnls(a, b[:2])
    with pytest.raises(ValueError, match="finite"):
        nnls(a, np.array([1.0, np.nan, 0.0]))


def test_fit_relative_weights_by_the_measurement_and_drops_duplicates():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, 40)
    features = np.c_[x, 3.0 * x, x * x, np.zeros(40), np.ones(40)]
    measured = 2.0 * x + 0.5 * x * x + 1.0
    coef = fit_relative(features, measured)
    np.testing.assert_allclose(coef, [2.0, 0.0, 0.5, 0.0, 1.0], rtol=1e-9, atol=1e-12)
