"""Cost models fitted to measured time: a model timed on real packed batches, and the terms fitted to the times.

===============  ===========================================================================================
``timing``       ``measure_pack_times``: forward + backward of packed batches, CUDA events or CPU clocks
``attention``    per-sample attention for transformers models where flash-attention is not available
``samples``      model inputs (tokens, pixels) of given loads, for text, Qwen-VL and InternVL models
``models``       named tiny models, and any config built with random weights
``workload``     loads drawn from real data, and varied packs of them planned with ``plan_packs``
``run``          ``calibrate``: all of the above, then ``CostModel.fit``
===============  ===========================================================================================
"""

from .models import TINY_MODELS, TinyModel, build_model, model_config
from .run import Calibration, calibrate, pack_batches
from .samples import SampleMaker
from .timing import CLOCKS, PackTimes, measure_pack_times
from .workload import calibration_lengths, calibration_packs

__all__ = [
    "CLOCKS",
    "Calibration",
    "PackTimes",
    "SampleMaker",
    "TINY_MODELS",
    "TinyModel",
    "build_model",
    "calibrate",
    "calibration_lengths",
    "calibration_packs",
    "measure_pack_times",
    "model_config",
    "pack_batches",
]
