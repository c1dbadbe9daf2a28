"""Helpers for runs that start several local processes (gloo process groups in tests, examples, benchmarks)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for ``MASTER_PORT`` of a local process group.

    The port is released before it is returned, so another process may take it first; local runs start their
    group right away, which makes a collision unlikely.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
