"""The 64-bit seeds of plans: the seed check, and one epoch's seed mixed by the engine's SplitMix64.

The mixing runs in the engine (``_C.splitmix64``), the same code that expands every seed inside it, so there is
one implementation of the generator on every platform.
"""

from __future__ import annotations

from .. import _ext
from .._checks import check_epoch, check_int

__all__ = ["check_seed", "epoch_seed"]

_MASK64 = (1 << 64) - 1


def check_seed(seed: object) -> int:
    """``seed`` as an int in ``[-2**63, 2**64)``: mixed as a 64-bit word, so a wider range would collide."""
    seed = check_int("seed", seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"seed must be in [-2**63, 2**64) (it is mixed as a 64-bit word), got {seed}")
    return seed


def epoch_seed(seed: int, epoch: int) -> int:
    """The 64-bit seed of one epoch's plan: ``seed`` and ``epoch`` mixed by two SplitMix64 steps.

    Also derives other per-index seeds from one seed (a group's, a streamed buffer's): ``epoch`` is then the
    index. Raises ``ValueError``/``TypeError`` for a seed outside ``[-2**63, 2**64)`` or an epoch outside
    ``[0, 2**63)``.
    """
    seed = check_seed(seed)
    epoch = check_epoch(epoch)
    C = _ext.load()
    return int(C.splitmix64(C.splitmix64(seed & _MASK64) ^ epoch))
