"""The library's warning categories.

Every warning the library gives is an :class:`OmnibalWarning`, so that a training script can turn them into
errors (``warnings.simplefilter("error", OmnibalWarning)``) or silence them as one category; the subclasses name
what a warning is about, so that one kind can be silenced where it is expected (a long-tailed data set whose
largest samples raise the capacities) while the others still speak.
"""

from __future__ import annotations

__all__ = ["CapacityWarning", "DuplicatesWarning", "OmnibalWarning", "TooFewPacksWarning"]


class OmnibalWarning(UserWarning):
    """A setting or a data set the library accepted but whose consequence the user should know."""


class CapacityWarning(OmnibalWarning):
    """The capacity search raised the capacities past those of ``target_batch_size``: packs hold more samples
    than asked for (``Capacities.predicted_batch_size`` says how many)."""


class DuplicatesWarning(OmnibalWarning):
    """Some of an epoch's samples are trained twice, to fill the ragged last optimizer step."""


class TooFewPacksWarning(OmnibalWarning):
    """A plan with fewer packs than ranks: its one step repeats packs, so each sample is trained several times
    (the sampler refuses such a plan with ``TooFewPacksError``)."""
