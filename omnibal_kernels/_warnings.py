"""The library's warning category.

Every warning the library gives is an :class:`OmnibalWarning`, so that a training script can turn them into
errors (``warnings.simplefilter("error", OmnibalWarning)``) or silence them as one category, and the test suite
can hold every test to provoking none it does not expect.
"""

from __future__ import annotations

__all__ = ["OmnibalWarning"]


class OmnibalWarning(UserWarning):
    """A setting or a data set the library accepted but whose consequence the user should know."""
