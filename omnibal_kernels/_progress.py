"""Progress bars on stderr for long work: tqdm when it is installed and stderr is a terminal, else silent."""

from __future__ import annotations

import sys
from typing import Any, Optional


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: Optional[int], desc: str, enabled: Optional[bool] = None) -> Any:
    """A tqdm bar on stderr, or a silent stand-in. ``enabled=None``: only when stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
