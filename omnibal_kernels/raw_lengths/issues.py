"""What can be wrong with one sample, and what a run does about it (``on_error``).

Every problem is one issue ``{"index", "kind", "message", "kept"}`` of one of :data:`ISSUE_KINDS`, for the
sample's index in the data set. ``on_error="error"`` raises :class:`SampleError` at the first one; ``"skip"``
leaves every problem sample out; ``"report"`` keeps the samples whose loads are still defined (the kinds in
:data:`COUNTABLE`) and leaves out the others.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COUNTABLE", "ISSUE_KINDS", "IssueLog", "ON_ERROR", "SampleError"]

ISSUE_KINDS = (
    "bad_record",
    "missing_media",
    "unreadable_media",
    "bad_media_size",
    "over_max_image_pixels",
    "over_max_frames",
    "template_error",
    "placeholder_mismatch",
    "over_max_length",
)
# Kinds after which the sample still has well-defined loads (kept under on_error="report").
COUNTABLE = ("placeholder_mismatch", "over_max_length")
ON_ERROR = ("error", "skip", "report")


class SampleError(ValueError):
    """A sample that fails a check under ``on_error="error"``; names the sample index and the kind."""

    def __init__(self, index: int, kind: str, message: str) -> None:
        super().__init__(f"sample {index}: {kind}: {message}")
        self.index, self.kind, self.detail = index, kind, message

    def __reduce__(self) -> tuple:  # rebuilt from its parts when it crosses a process boundary
        return (SampleError, (self.index, self.kind, self.detail))


class IssueLog:
    """The issues of one chunk of ``n`` samples whose first one is sample ``start`` of the data."""

    def __init__(self, on_error: str, start: int, n: int) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.on_error, self.start = on_error, start
        self.issues: list[dict] = []
        self.countable = np.ones(n, dtype=bool)
        """``(n,)`` whether each sample still gets loads"""

    def note(self, j: int, kind: str, message: str) -> None:
        """Sample ``start + j`` has a problem of ``kind``.

        Raises:
            SampleError: under ``on_error="error"``.
        """
        if self.on_error == "error":
            raise SampleError(self.start + j, kind, message)
        keep = self.on_error == "report" and kind in COUNTABLE
        self.issues.append({"index": self.start + j, "kind": kind, "message": message, "kept": keep})
        if not keep:
            self.countable[j] = False

    def sorted(self) -> list[dict]:
        """The issues in sample order (a sample's own issues in the order they were found)."""
        return sorted(self.issues, key=lambda d: d["index"])
