"""The library's warning category.

Every warning the library gives is an :class:`OmnibalWarning`, so that a training script can turn them into
errors (``warnings.simplefilter("error", OmnibalWarning)``) or silence them as one category, and the test suite
can hold every test to provoking none it does not expect.
"""

from __future__ import annotations

__all__ = ["OmnibalWarning", "TooFewPacksWarning"]


class OmnibalWarning(UserWarning):
    """A setting or a data set the library accepted but whose consequence the user should know."""


class TooFewPacksWarning(OmnibalWarning):
    """A plan with fewer packs than ranks: its one step repeats packs, so each sample is trained several times
    (the sampler refuses such a plan with ``TooFewPacksError``)."""
