"""Cost model: how long a sample, and a pack, takes to train, from its loads.

Per sample, with ``v`` its ViT load, ``s_j`` its ViT sequence lengths (``Lengths.vit_seqlens``) and ``t`` its
LLM load::

    cost = vit_linear * v + vit_quadratic * sum_j s_j**2 + llm_linear * t + llm_quadratic * t**2 + per_sample

and a pack costs the sum of its samples plus ``per_pack``. Linear terms are the weight matmuls (2 FLOPs per
parameter per token); quadratic terms are attention scores and their weighted sum, which grow with the square
of each sequence that attends on its own (a sample's tokens in the LLM, one image, video frame group or tile
in the ViT); ``per_sample`` and ``per_pack`` are fixed overheads (kernel launches, Python), which only a
measured model has (:meth:`CostModel.fit`).

Without ViT sequence lengths (``Lengths.vit_seqlens is None``, or the ``(vit, llm)`` arrays of
:meth:`sample_costs`), a sample's whole ViT load is one sequence: ``sum_j s_j**2 = v**2``. That is exact for
patch models (Qwen2-VL) on one image per sample and overcharges samples of several images: give the
sequences where samples hold several. Tile models (InternVL) attend within tiles of one fixed size, so their
ViT attention is linear in tiles and lives in ``vit_linear``; their ``vit_quadratic`` is 0 (``from_shapes``,
``from_config`` and ``fit`` make it so), and the default does not matter for them.

Units: GFLOP for the named models, :meth:`from_shapes` and :meth:`from_config`; seconds for a fitted model.
Plans compare costs only, so any unit works. The planning engine reads :meth:`terms` (the four load terms);
``per_sample`` and ``per_pack`` enter :meth:`sample_costs` and :meth:`pack_costs`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union, cast

import numpy as np

from .. import _ext
from .._checks import check_finite_non_negative
from .._csr import check_offsets, offsets_from_counts, row_ids
from .._flops import GIGA, TRAIN_FACTOR
from ..lengths import Lengths
from .nnls import FitErrors, fit_relative, relative_errors, summarize_errors

__all__ = ["MAX_TERM", "CostFit", "CostModel", "PackRows", "TERMS", "pack_features", "sample_features"]

# The six terms, in the order of the JSON, the features and the fit.
TERMS = ("vit_linear", "vit_quadratic", "llm_linear", "llm_quadratic", "per_sample", "per_pack")


class PackRows(NamedTuple):
    """Packs in compressed rows: pack ``p`` holds samples ``samples[offsets[p]:offsets[p + 1]]``."""

    offsets: np.ndarray
    samples: np.ndarray


PackLike = Union[Sequence[Any], PackRows, Any]


def _pack_rows(packs: PackLike, num_samples: int) -> PackRows:
    """``packs`` (sample-id arrays, :class:`PackRows`, or a ``Plan``) as checked int64 rows of sample ids."""
    if isinstance(packs, PackRows):
        offsets, samples = packs.offsets, packs.samples
    elif hasattr(packs, "pack_offsets") and hasattr(packs, "pack_samples"):
        offsets, samples = packs.pack_offsets, packs.pack_samples
    elif (
        isinstance(packs, (str, bytes, Mapping))
        or not isinstance(packs, Sequence)
        and not isinstance(packs, np.ndarray)
    ):
        raise TypeError(f"packs must be a list of sample-id arrays, PackRows or a Plan, got {type(packs).__name__}")
    else:
        parts = [np.asarray(p) for p in packs]
        for i, p in enumerate(parts):
            if p.ndim != 1 or (p.size and p.dtype.kind not in "iu"):
                raise ValueError(f"pack {i}: must be a 1-D array of sample ids, got dtype {p.dtype}, shape {p.shape}")
        offsets = offsets_from_counts([p.shape[0] for p in parts])
        samples = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    samples = np.asarray(samples)
    if samples.ndim != 1 or (samples.size and samples.dtype.kind not in "iu"):
        raise ValueError(f"pack samples must be a 1-D integer array, got dtype {samples.dtype}, shape {samples.shape}")
    samples = samples.astype(np.int64, copy=False)
    offsets = check_offsets("pack offsets", offsets, np.size(offsets) - 1, samples.shape[0], row="pack")
    bad = np.flatnonzero((samples < 0) | (samples >= num_samples))
    if bad.size:
        row = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise ValueError(f"pack {row}: sample id {int(samples[bad[0]])} is not in [0, {num_samples})")
    return PackRows(offsets, samples)


def _vit_square_sums(lengths: Lengths) -> np.ndarray:
    """``(N,)`` ``sum_j s_j**2`` of every sample; the whole ViT load as one sequence when the loads do not say."""
    squares = lengths.vit_square_sums()
    if squares is None:
        v = lengths.vit.astype(np.float64)
        return v * v
    return squares


def sample_features(lengths: Lengths) -> np.ndarray:
    """``(N, 6)`` float64 per sample: ``v``, ``sum_j s_j**2``, ``t``, ``t**2``, 1, 0 (the order of ``TERMS``)."""
    if not isinstance(lengths, Lengths):
        raise TypeError(f"lengths must be a Lengths, got {type(lengths).__name__}")
    t = lengths.llm.astype(np.float64)
    out = np.zeros((len(lengths), len(TERMS)))
    out[:, 0] = lengths.vit
    out[:, 1] = _vit_square_sums(lengths)
    out[:, 2] = t
    out[:, 3] = t * t
    out[:, 4] = 1.0
    return out


def pack_features(lengths: Lengths, packs: PackLike) -> np.ndarray:
    """``(P, 6)`` float64 per pack: its samples' :func:`sample_features` summed, and 1 for ``per_pack``.

    ``pack_features(lengths, packs) @ [model's six terms]`` is ``model.pack_costs(lengths, packs)``.
    """
    per_sample = sample_features(lengths)
    rows = _pack_rows(packs, len(lengths))
    num_packs = rows.offsets.shape[0] - 1
    pack_of = row_ids(rows.offsets)
    out = np.ones((num_packs, len(TERMS)))
    for j in range(len(TERMS) - 1):
        out[:, j] = np.bincount(pack_of, weights=per_sample[rows.samples, j], minlength=num_packs)
    return out


# The largest cost term: a cost model in any unit (FLOPs, seconds) is far below it, and with it the cost of any
# loads the length types hold (int64, squared), summed over any epoch, stays finite in float64.
MAX_TERM = 1e100


def _scaled_terms(terms: np.ndarray, unit: float) -> list[float]:
    """Terms fitted to times in ``unit`` as terms of the times themselves; a ValueError where float64 cannot
    hold one (a positive term that would round to 0, or one past :data:`MAX_TERM`)."""
    out = []
    for name, term in zip(TERMS, terms):
        value = float(term) * unit
        if (term > 0 and value == 0.0) or value > MAX_TERM:
            raise ValueError(
                f"fit: the {name} term of these times would be {float(term):.3g} x {unit:.3g}, outside what a cost "
                f"term holds (a positive term above 0 in float64, at most {MAX_TERM:g}); give the times in another "
                "unit (e.g. milliseconds or microseconds)"
            )
        out.append(value)
    return out


@dataclass(frozen=True)
class CostModel:
    """Per-sample and per-pack training cost as linear and quadratic terms of the loads (see the module docstring).

    The default, ``CostModel.internvl_7b()``, is an InternVL-Chat-like model: InternViT-300M on 448x448
    tiles (1,025 tokens each, attended within the tile, so the ViT cost is linear in tiles) and a 7B LLM
    (32 layers, hidden 4096, causal attention over each sample's tokens). Every term is finite, non-negative
    and at most :data:`MAX_TERM`; all default to 0.
    """

    vit_linear: float = 0.0
    vit_quadratic: float = 0.0
    llm_linear: float = 0.0
    llm_quadratic: float = 0.0
    per_sample: float = 0.0
    per_pack: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            term = check_finite_non_negative(f.name, getattr(self, f.name), "CostModel")
            if term > MAX_TERM:
                raise ValueError(
                    f"CostModel: {f.name} must be at most {MAX_TERM:g} (larger terms make an epoch's cost overflow), "
                    f"got {term!r}"
                )
            object.__setattr__(self, f.name, term)

    @classmethod
    def from_shapes(
        cls,
        *,
        vit_params: float,
        vit_layers: int,
        vit_hidden: int,
        vit_tokens_per_unit: int,
        vit_units_attend_jointly: bool,
        llm_params: float,
        llm_layers: int,
        llm_hidden: int,
    ) -> CostModel:
        """Builds the cost terms (GFLOP) from model shapes.

        Args:
            vit_params, vit_layers, vit_hidden: size of the vision encoder.
            vit_tokens_per_unit: ViT tokens per unit of ViT load (1,025 per InternVL tile, 1 per patch).
            vit_units_attend_jointly: True when a ViT sequence's units attend together (patch based ViTs such
                as Qwen2-VL's: the quadratic term); False when each unit is attended alone (InternVL tiles:
                the attention is linear in units).
            llm_params, llm_layers, llm_hidden: size of the language model (causal attention).
        """
        s = float(vit_tokens_per_unit)
        vit_matmul = 2.0 * vit_params * s
        # QK^T and AV: 2 matmuls x 2 FLOPs per multiply-add x s^2 x hidden, per layer (bidirectional).
        vit_attention = 4.0 * s * s * vit_hidden * vit_layers
        if vit_units_attend_jointly:
            vit_lin, vit_quad = vit_matmul, vit_attention
        else:
            vit_lin, vit_quad = vit_matmul + vit_attention, 0.0
        llm_lin = 2.0 * llm_params
        # Causal attention: half of the s^2 scores, so 2 * t^2 * hidden per layer.
        llm_quad = 2.0 * llm_hidden * llm_layers
        f = TRAIN_FACTOR / GIGA
        return cls(vit_lin * f, vit_quad * f, llm_lin * f, llm_quad * f)

    @classmethod
    def internvl_7b(cls) -> CostModel:
        """InternViT-300M (24 layers, hidden 1024, 448px tiles) + a 7B LLM (32 layers, hidden 4096)."""
        return cls.from_shapes(
            vit_params=0.3e9,
            vit_layers=24,
            vit_hidden=1024,
            vit_tokens_per_unit=1025,
            vit_units_attend_jointly=False,
            llm_params=7.0e9,
            llm_layers=32,
            llm_hidden=4096,
        )

    @classmethod
    def tokens_only(cls) -> CostModel:
        """Cost = LLM tokens (no ViT, no attention term)."""
        return cls(0.0, 0.0, 1.0, 0.0)

    @classmethod
    def from_config(cls, config: Any) -> CostModel:
        """Training GFLOP of a transformers model, per term, from the shapes in its config.

        Args:
            config: a ``PretrainedConfig`` (Llama, Qwen2, Qwen2-VL, Qwen2.5-VL, InternVL), or the path of a
                folder holding its ``config.json`` (or of that file), read with ``transformers.AutoConfig``.

        Returns:
            A model in GFLOP with ``per_sample = per_pack = 0``; ViT units are patches for Qwen-VL (``vit_seqlens``
            one per image or video frame group) and tiles for InternVL. What is counted: see
            :mod:`omnibal_kernels.balance.flops`.

        Raises:
            ValueError: an unsupported model type, or a config without a field the count needs.
        """
        from .flops import config_flops, read_model_config

        if isinstance(config, (str, os.PathLike)):
            config = read_model_config(config)
        terms = config_flops(config)
        return cls(*(x / GIGA for x in terms))

    def terms(self) -> list[float]:
        """``[vit_linear, vit_quadratic, llm_linear, llm_quadratic]``: the load terms the planning engine reads."""
        return [float(self.vit_linear), float(self.vit_quadratic), float(self.llm_linear), float(self.llm_quadratic)]

    def coefficients(self) -> np.ndarray:
        """``(6,)`` float64 of the six terms, in the order of :data:`TERMS`."""
        return np.array([getattr(self, name) for name in TERMS])

    def scaled(self, factor: float) -> CostModel:
        """Every term times ``factor`` (non-negative): the same model in another unit."""
        factor = check_finite_non_negative("factor", factor, "CostModel")
        return CostModel(**{name: getattr(self, name) * factor for name in TERMS})

    def sample_costs(self, lengths: Union[Lengths, np.ndarray], llm: Optional[np.ndarray] = None) -> np.ndarray:
        """``(N,)`` float64 cost of every sample, ``per_sample`` included.

        Args:
            lengths: the loads (their ``vit_seqlens`` used when present); or, with ``llm``, the ``(N,)`` ViT
                loads, each one sequence.
            llm: ``(N,)`` LLM loads, when ``lengths`` is the ViT loads.
        """
        if llm is None:
            if not isinstance(lengths, Lengths):
                raise TypeError(f"lengths must be a Lengths, got {type(lengths).__name__}")
            # One pass in the engine, the same operations in the same order as below; the squared sequence
            # lengths summed once per Lengths (an epoch's plan reads them again, and they can be many per sample).
            terms = self.coefficients()[:5].tolist()  # per_pack aside
            squares = lengths.vit_square_sums() if self.vit_quadratic != 0.0 else None
            return _ext.load().sample_costs(lengths.vit, lengths.llm, squares, terms)
        v, t = np.asarray(lengths), np.asarray(llm)
        # One elementwise operation at a time, in a fixed order, every load taken as float64 (no matrix
        # product, whose summation order and fused multiply-adds vary with the BLAS): the same costs, to the
        # bit, on every rank and platform. A zero term adds exactly 0 to every (finite) cost and is skipped.
        f64 = np.float64
        out = np.zeros(np.broadcast_shapes(np.shape(v), np.shape(t)))
        scratch = np.empty_like(out)
        if self.vit_linear != 0.0:
            out += np.multiply(v, self.vit_linear, out=scratch, dtype=f64)
        if self.vit_quadratic != 0.0:
            out += np.multiply(np.multiply(v, v, dtype=f64), self.vit_quadratic, out=scratch)
        if self.llm_linear != 0.0:
            out += np.multiply(t, self.llm_linear, out=scratch, dtype=f64)
        if self.llm_quadratic != 0.0:
            np.multiply(t, t, out=scratch, dtype=f64)
            out += np.multiply(scratch, self.llm_quadratic, out=scratch)
        if self.per_sample != 0.0:
            out += self.per_sample
        return out

    def pack_costs(self, lengths: Lengths, packs: PackLike) -> np.ndarray:
        """``(P,)`` float64 cost of every pack: its samples' costs plus ``per_pack``.

        Args:
            lengths: the loads of every sample.
            packs: a list of sample-id arrays (one per pack), :class:`PackRows` (CSR offsets and samples), or a
                ``Plan`` (its packs).

        Raises:
            ValueError: a sample id outside ``[0, N)`` (naming the pack), malformed offsets.
        """
        return pack_features(lengths, packs) @ self.coefficients()

    def to_dict(self) -> dict[str, float]:
        """The six terms by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, terms: Mapping[str, Any], where: str = "cost model") -> CostModel:
        """A model from a mapping of the six terms (missing ones are 0; unknown keys are a ValueError)."""
        if not isinstance(terms, Mapping):
            raise ValueError(f"{where}: must be a JSON object of {', '.join(TERMS)}, got {type(terms).__name__}")
        unknown = sorted(set(terms) - set(TERMS))
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; the terms are {', '.join(TERMS)}"
            )
        try:
            return cls(**{str(k): v for k, v in terms.items()})
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from exc

    def to_json(self, path: Optional[Union[str, os.PathLike[str]]] = None) -> str:
        """The six terms as a JSON object; with ``path``, also written there (atomically). Returns the text."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            from .._files import atomic_write

            with atomic_write(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, source: Union[str, os.PathLike[str]]) -> CostModel:
        """A model from JSON text (a string starting with ``{``) or from a JSON file (a path).

        Raises:
            ValueError: not a JSON object, unknown keys (naming them), a term that is negative or not a number
                (every message names the file when there is one).
            FileNotFoundError: a path that does not exist.
        """
        if isinstance(source, str) and source.lstrip().startswith("{"):
            where, text = "cost model JSON", source
        elif isinstance(source, (str, os.PathLike)):
            where = str(source)
            try:
                text = Path(source).read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text ({exc})") from exc
        else:
            raise TypeError(f"from_json takes JSON text or a path, got {type(source).__name__}")
        try:
            terms = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from exc
        return cls.from_dict(terms, where)

    @classmethod
    def fit(
        cls,
        lengths: Lengths,
        packs: PackLike,
        seconds: Any,
        *,
        holdout: float = 0.5,
        seed: int = 0,
        reference: Optional[CostModel] = None,
        loss: str = "huber",
    ) -> CostFit:
        """Fits the six terms to measured pack times (non-negative least squares on the relative error).

        Args:
            lengths: the loads of every sample.
            packs: the measured packs (as for :meth:`pack_costs`), ``P`` of them.
            seconds: ``(P,)`` positive measured time of every pack (e.g. ``measure_pack_times(...).seconds``).
            holdout: the share of packs, drawn at random with ``seed``, left out of the fit and predicted to
                report the model's error on packs it has not seen (0: fit on all, no held-out error).
            seed: the seed of that draw.
            reference: another model (e.g. ``CostModel.from_config(config)``, in FLOPs) to compare: scaled by
                the one factor that fits the same packs best, its errors are reported beside the fit's.
            loss: ``"huber"`` (default: robust to a few packs the terms cannot describe) or ``"squared"``; see
                :func:`omnibal_kernels.balance.nnls.fit_relative`. The reference's factor is fitted the same way.

        Returns:
            :class:`CostFit`: the fitted model (in seconds: its ``pack_costs`` predict the time) and its errors.
            Terms the packs cannot tell apart (all-zero features, such as the ViT terms of text-only data, or
            ``sum s_j**2`` equal to ``v`` for tiles) are 0.

        Raises:
            ValueError: ``seconds`` not positive and finite or not one per pack, ``holdout`` outside ``[0, 1)``,
                fewer than two packs to fit on, an unknown ``loss``.
        """
        features = pack_features(lengths, packs)
        measured = np.asarray(seconds, dtype=np.float64)
        if measured.shape != (features.shape[0],):
            raise ValueError(f"seconds must hold one time per pack ({features.shape[0]}), got shape {measured.shape}")
        if not (np.isfinite(measured).all() and (measured > 0).all()):
            raise ValueError("seconds must be positive and finite")
        if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 <= holdout < 1:
            raise ValueError(f"holdout must be a share in [0, 1), got {holdout!r}")
        order = np.random.default_rng(seed).permutation(features.shape[0])
        held = int(round(holdout * features.shape[0]))
        fit_rows, held_rows = np.sort(order[held:]), np.sort(order[:held])
        if fit_rows.shape[0] < 2:
            raise ValueError(
                f"fit needs at least 2 packs to fit on, got {fit_rows.shape[0]} "
                f"({features.shape[0]} packs, holdout {holdout})"
            )
        # the fit is of relative errors, the same in any unit: it runs on times of median 1, whose squares and
        # sums float64 holds whatever the unit, and its terms are scaled back
        unit = float(np.median(measured[fit_rows]))
        terms = fit_relative(features[fit_rows], measured[fit_rows] / unit, loss)
        model = cls(*_scaled_terms(terms, unit))
        scaled_reference = None
        if reference is not None:
            if not isinstance(reference, CostModel):
                raise TypeError(f"reference must be a CostModel, got {type(reference).__name__}")
            costs = features[fit_rows] @ reference.coefficients()
            if not (costs > 0).any():
                raise ValueError("reference: predicts no cost for any pack to fit on")
            factor = fit_relative(costs[:, None], measured[fit_rows] / unit, loss)[0]
            scaled_reference = reference.scaled(float(_scaled_terms(np.array([factor]), unit)[0]))
        return CostFit.of(model, features, measured, fit_rows, held_rows, scaled_reference)


@dataclass(frozen=True)
class CostFit:
    """A cost model fitted to measured pack times, and how well it predicts them.

    Attributes:
        model: the fitted model; ``model.pack_costs(lengths, packs)`` predicts seconds.
        seconds: ``(P,)`` the measured times.
        predicted: ``(P,)`` the model's prediction of every pack.
        fit_packs: indices of the packs fitted on; heldout_packs: of those left out.
        fit_error: relative errors on the fitted packs; heldout_error: on the held-out ones (None without any).
        reference: the reference model scaled to seconds by one least-squares factor (None without one);
            reference_fit_error, reference_heldout_error: its errors on the same packs.
    """

    model: CostModel
    seconds: np.ndarray
    predicted: np.ndarray
    fit_packs: np.ndarray
    heldout_packs: np.ndarray
    fit_error: FitErrors
    heldout_error: Optional[FitErrors]
    reference: Optional[CostModel] = None
    reference_fit_error: Optional[FitErrors] = None
    reference_heldout_error: Optional[FitErrors] = None

    @classmethod
    def of(
        cls,
        model: CostModel,
        features: np.ndarray,
        measured: np.ndarray,
        fit_rows: np.ndarray,
        held_rows: np.ndarray,
        reference: Optional[CostModel],
    ) -> CostFit:
        """The fit's errors on its packs (``features``: the packs' :func:`pack_features`)."""

        def errors(m: CostModel, rows: np.ndarray) -> Optional[FitErrors]:
            if not rows.size:
                return None
            return summarize_errors(relative_errors(features[rows] @ m.coefficients(), measured[rows]))

        predicted = features @ model.coefficients()
        fit_error = cast(FitErrors, errors(model, fit_rows))  # fit checks there are at least 2 packs to fit on
        return cls(
            model,
            measured,
            predicted,
            fit_rows,
            held_rows,
            fit_error,
            errors(model, held_rows),
            reference,
            errors(reference, fit_rows) if reference else None,
            errors(reference, held_rows) if reference else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The model's terms, the pack counts and every error, as plain JSON-able values."""

        def err(e: Optional[FitErrors]) -> Optional[dict[str, float]]:
            return None if e is None else e._asdict()

        out: dict[str, Any] = {
            "model": self.model.to_dict(),
            "fit_packs": int(self.fit_packs.size),
            "heldout_packs": int(self.heldout_packs.size),
            "fit_error": err(self.fit_error),
            "heldout_error": err(self.heldout_error),
        }
        if self.reference is not None:
            out.update(
                reference=self.reference.to_dict(),
                reference_fit_error=err(self.reference_fit_error),
                reference_heldout_error=err(self.reference_heldout_error),
            )
        return out
