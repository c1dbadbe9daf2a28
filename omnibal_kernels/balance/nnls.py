"""Non-negative least squares: ``min ||A x - b||`` subject to ``x >= 0``, by Lawson and Hanson's active set method.

The cost model's terms are fitted with it (a negative time per token has no meaning). Lawson and Hanson
(Solving Least Squares Problems, 1974, chapter 23) move one column at a time from the zero set into the
passive set, the one whose gradient most wants to grow, solve the unconstrained problem on the passive set,
and step back toward the previous feasible point whenever that solution has a negative entry. Every loop
lowers the residual, so it ends; the result satisfies the Karush-Kuhn-Tucker conditions (zero-set gradients at
most ``tol``). Small dense problems only (the six cost terms): each inner solve is a ``numpy.linalg.lstsq``.

``fit_relative`` fits the cost terms to measured times on the relative error, by squares or by Huber's loss
(iteratively reweighted, each round an NNLS).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["NNLSResult", "nnls"]


class NNLSResult(NamedTuple):
    """x: ``(n,)`` the non-negative solution; residual: ``||A x - b||``; iterations: passive-set solves."""

    x: np.ndarray
    residual: float
    iterations: int


def _passive_solve(a: np.ndarray, b: np.ndarray, passive: np.ndarray) -> np.ndarray:
    z = np.zeros(a.shape[1])
    if passive.any():
        z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
    return z


def nnls(a: np.ndarray, b: np.ndarray, *, tol: float | None = None, max_iter: int | None = None) -> NNLSResult:
    """Solves ``min ||a @ x - b||_2`` over ``x >= 0``.

    Args:
        a: ``(m, n)`` float matrix.
        b: ``(m,)`` float vector.
        tol: a zero-set column enters only when its gradient ``a.T @ (b - a @ x)``, with ``a``'s columns scaled to
            unit norm, exceeds this (default: a multiple of the machine epsilon scaled by the norm of ``b``).
        max_iter: bound on passive-set solves (default ``3 * n``; each solve adds or removes a column).

    Returns:
        :class:`NNLSResult`.

    Raises:
        ValueError: shapes that do not match, or values that are not finite.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"nnls needs a (m, n) and b (m,), got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("nnls: a and b must be finite")
    m, n = a.shape
    # Columns of unit norm: the cost terms' features differ by orders of magnitude, and lstsq's cut of small
    # singular values would otherwise drop a column that is only small in its unit, not dependent.
    original = a
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    if tol is None:
        tol = 10.0 * max(m, n) * np.finfo(np.float64).eps * max(np.linalg.norm(a, 1), 1.0) * max(np.linalg.norm(b), 1.0)
    max_iter = 3 * n if max_iter is None else max_iter
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    # Columns whose entry made no progress (dependent on the passive ones, to rounding): never tried again.
    blocked = np.zeros(n, dtype=bool)
    iterations = 0
    while iterations < max_iter:
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & ~blocked & (gradient > tol)
        if not candidates.any():
            break
        entering = int(np.argmax(np.where(candidates, gradient, -np.inf)))
        passive[entering] = True
        z = _passive_solve(a, b, passive)
        iterations += 1
        if z[entering] <= 0:
            passive[entering] = False
            blocked[entering] = True
            continue
        while not (z[passive] > 0).all() and iterations < max_iter:
            # Step from x toward z until the first passive entry reaches zero; it leaves the passive set.
            shrinking = np.flatnonzero(passive & (z <= 0))
            steps = x[shrinking] / (x[shrinking] - z[shrinking])
            x = x + steps.min() * (z - x)
            x[shrinking[steps == steps.min()]] = 0.0
            passive &= x > 0
            x[~passive] = 0.0
            z = _passive_solve(a, b, passive)
            iterations += 1
        x = np.where(passive, np.maximum(z, 0.0), 0.0)
        blocked[:] = False
    x = x / norms
    return NNLSResult(x, float(np.linalg.norm(original @ x - b)), iterations)


class FitErrors(NamedTuple):
    """Summary of ``|predicted - measured| / measured`` over a set of packs."""

    median: float
    p90: float
    max: float


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``(predicted - measured) / measured``, element-wise."""
    return (np.asarray(predicted, np.float64) - measured) / measured


def summarize_errors(errors: np.ndarray) -> FitErrors:
    """Median, 90th percentile and maximum of ``|errors|``."""
    e = np.abs(np.asarray(errors, np.float64))
    return FitErrors(float(np.median(e)), float(np.percentile(e, 90)), float(e.max()))


# Huber's threshold in robust standard deviations of the residuals: 95% of least squares' efficiency on
# normal errors (Huber, Robust Statistics, 1981), while a few packs far off do not steer the fit.
HUBER_K = 1.345
# Reweighting rounds of the Huber fit (it settles in a few; the weights change little after).
_HUBER_ROUNDS = 20
LOSSES = ("huber", "squared")


def _solve_relative(unit: np.ndarray, weights: np.ndarray) -> np.ndarray:
    root = np.sqrt(weights)
    return nnls(unit * root[:, None], root).x


def fit_relative(features: np.ndarray, measured: np.ndarray, loss: str = "huber") -> np.ndarray:
    """Non-negative ``x`` fitting ``features @ x`` to ``measured`` on the relative error
    ``features @ x / measured - 1``, so that small and large packs count alike.

    ``loss="squared"`` minimizes the sum of squared relative errors; ``"huber"`` (iteratively reweighted, each
    round a weighted non-negative least squares) counts errors beyond ``HUBER_K`` robust standard deviations
    (1.4826 times their median absolute value) linearly, so a few packs the terms cannot describe (say packs that
    skip the vision tower, whose fixed cost the terms do not hold) or a run disturbed throughout do not pull
    every other prediction off.

    A column that is all zero, or equal to an earlier one up to a positive factor (``sum s_j**2`` of tile data,
    whose sequences are all 1, equals the ViT load), gets 0: its term cannot be told apart from the data.
    Columns are scaled to unit norm for the solve (the terms differ by many orders of magnitude).

    Args:
        features: ``(m, n)`` non-negative features of ``m`` packs.
        measured: ``(m,)`` positive measurements.
        loss: ``"huber"`` or ``"squared"``.

    Returns:
        ``(n,)`` non-negative coefficients.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    weighted = features / measured[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    keep = norms > 0
    unit = np.where(keep, weighted / np.where(keep, norms, 1.0), 0.0)
    for j in range(unit.shape[1]):
        for k in range(j):
            if keep[j] and keep[k] and np.allclose(unit[:, j], unit[:, k], rtol=0.0, atol=1e-12):
                keep[j] = False
    x = np.zeros(features.shape[1])
    if not keep.any():
        return x
    weights = np.ones(features.shape[0])
    solution = _solve_relative(unit[:, keep], weights)
    for _ in range(_HUBER_ROUNDS if loss == "huber" else 0):
        residual = np.abs(unit[:, keep] @ solution - 1.0)
        scale = 1.4826 * float(np.median(residual))
        if scale <= 1e-12:
            break  # an exact fit: nothing to reweight
        weights = np.minimum(1.0, HUBER_K * scale / np.maximum(residual, 1e-300))
        solution = _solve_relative(unit[:, keep], weights)
    x[keep] = solution / norms[keep]
    return x
