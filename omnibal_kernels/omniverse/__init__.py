"""Data, model and memory balance composed in one run, against the OmniBal paper's Table 2.

``omniverse(model, Layout(gpus, pp, tp, micro_batches, memory_gb), lengths)`` simulates one epoch of the
baseline (random padded micro-batches, a uniform layer split, every layer recomputed), each balance alone,
the paper's cumulative ``data+model`` and all three, on one model, parallel layout and data set; ``omnibal-kernels
omniverse`` is its command line. Importing it loads no torch.
"""

from .compose import CONFIGURATIONS, Configuration, OmniverseResult
from .data import DATA_CHOICES, MicroBatches, balanced_micro_batches, padded_micro_batches, resample
from .epoch import EpochTimes, epoch_times, micro_batch_scales
from .layout import Hardware, Layout
from .run import affine_profile, omniverse, scaled_profile

__all__ = [
    "CONFIGURATIONS",
    "Configuration",
    "DATA_CHOICES",
    "EpochTimes",
    "Hardware",
    "Layout",
    "MicroBatches",
    "OmniverseResult",
    "affine_profile",
    "balanced_micro_batches",
    "epoch_times",
    "micro_batch_scales",
    "omniverse",
    "padded_micro_batches",
    "resample",
    "scaled_profile",
]
