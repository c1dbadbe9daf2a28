"""``calibrate``: time a model on varied packs of real loads and fit a cost model of seconds to the times.

The steps, each its own public function: the model (:mod:`.models`), the loads and packs (:mod:`.workload`),
each pack's samples (:mod:`.samples`) packed by ``PackCollator.for_model``, forward + backward timed
(:mod:`.timing`), and ``CostModel.fit`` on half of the packs, predicting the other half; the FLOP estimate of
the same config (``CostModel.from_config``), scaled by one factor, is fitted and reported beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ..balance.cost import CostFit, CostModel
from ..lengths import Lengths
from .models import TINY_MODELS, build_model, check_device, model_config
from .samples import SampleMaker
from .timing import PackTimes, measure_pack_times
from .workload import calibration_lengths, calibration_packs, check_image_scale

__all__ = ["Calibration", "calibrate", "pack_batches"]


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured and fitted.

    Attributes:
        fit: the fitted model (seconds) with its held-out error and the scaled FLOP estimate's.
        times: the measured time of every pack (clock, repeats, every run).
        packs: the packs timed, sample ids into ``lengths``.
        lengths: the loads the packs were drawn from.
    """

    fit: CostFit
    times: PackTimes
    packs: list[np.ndarray]
    lengths: Lengths

    def summary(self) -> dict[str, Any]:
        """The fit's dictionary (:meth:`CostFit.to_dict`) and the timing summary, for printing or JSON."""
        return {**self.fit.to_dict(), "timing": self.times.summary()}


def pack_batches(model: Any, lengths: Lengths, packs: list[np.ndarray], *, seed: int = 0) -> list[Any]:
    """The packed batch of every pack for ``model`` (``PackCollator.for_model``), samples from :class:`SampleMaker`."""
    from ..packing import PackCollator

    collator = PackCollator.for_model(model)
    maker = SampleMaker.for_config(model.config)
    return [collator(maker.samples(lengths, pack, seed=seed + i)) for i, pack in enumerate(packs)]


def calibrate(
    model: Union[str, os.PathLike[str], Any],
    *,
    lengths: Optional[Lengths] = None,
    num_packs: int = 80,
    num_samples: int = 2000,
    repeats: int = 3,
    warmup: int = 3,
    clock: str = "auto",
    holdout: float = 0.5,
    seed: int = 0,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    image_scale: Optional[float] = None,
    progress: Optional[bool] = None,
) -> Calibration:
    """Times ``model`` on ``num_packs`` varied packs and fits a :class:`~omnibal_kernels.balance.CostModel` of seconds.

    Args:
        model: a named tiny model (``omnibal_kernels.calibration.TINY_MODELS``), a folder holding a transformers
            ``config.json`` (built with random weights), or a transformers model (timed as it is).
        lengths: the loads to draw packs from (default: :func:`calibration_lengths` of the model's config).
        num_packs: packs to time (half fitted on, half predicted with the default ``holdout``).
        num_samples: samples drawn by :func:`calibration_lengths` when ``lengths`` is not given.
        repeats, warmup, clock, progress: as :func:`measure_pack_times`.
        holdout, seed: as :meth:`CostModel.fit` (``seed`` also draws the loads, packs and inputs).
        device: where a built model runs (default: CUDA when available, else the CPU).
        dtype: a built model's dtype (default: bfloat16 on CUDA, float32 on the CPU).
        image_scale: as :func:`calibration_lengths` (default: a named tiny model's own, else 1).

    Returns:
        :class:`Calibration`.
    """

    if image_scale is not None:
        check_image_scale(image_scale)
    if isinstance(model, (str, os.PathLike)):
        check_device(device)  # before the model is read or built
    if isinstance(model, (str, os.PathLike)):
        if image_scale is None and isinstance(model, str) and model in TINY_MODELS:
            image_scale = TINY_MODELS[model].image_scale
        config = model_config(model)
        model = build_model(config, device=check_device(device), dtype=dtype)
    elif hasattr(model, "config") and hasattr(model, "parameters"):
        config = model.config
    else:
        raise TypeError(
            f"model must be a model name, a config folder or a transformers model, got {type(model).__name__}"
        )
    if lengths is None:
        lengths = calibration_lengths(
            config, num_samples, seed=seed, image_scale=1.0 if image_scale is None else image_scale
        )
    packs = calibration_packs(lengths, num_packs, seed=seed)
    batches = pack_batches(model, lengths, packs, seed=seed)
    times = measure_pack_times(model, batches, repeats=repeats, warmup=warmup, clock=clock, progress=progress)
    fit = CostModel.fit(
        lengths, packs, times.seconds, holdout=holdout, seed=seed, reference=CostModel.from_config(config)
    )
    return Calibration(fit, times, packs, lengths)
