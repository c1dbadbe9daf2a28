"""Chunks counted in worker processes that may die: each worker holds one chunk at a time, so a death is seen
at once (its pipe closes) and its chunk is known.

A chunk whose worker dies (the out-of-memory killer's SIGKILL, a crash in a native library) is counted again
in a new worker, once; if that worker dies too, the run stops with :class:`WorkerDied` naming the chunk.
Every finished chunk is handed to ``done`` as it arrives, so the caller keeps it for the resume.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional, cast

__all__ = ["WorkerDied", "count_in_workers"]

# How often a chunk may be started: once, and once again after its worker died.
_TRIES = 2
# Seconds a worker gets to exit after it is told to stop (or terminated) before it is killed.
_JOIN_SECONDS = 5.0


class WorkerDied(ChildProcessError):
    """The worker processes counting one chunk died on every try; names the chunk's samples."""


def _died_how(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (", as the out-of-memory killer does" if -code == signal.SIGKILL else "")
    return f"exit status {code}"


def _send(conn: Connection, message: tuple) -> None:
    try:
        conn.send(message)
    except Exception:  # an exception or result that does not pickle: its text instead
        kind, bounds, payload = message
        conn.send(
            (kind, bounds, RuntimeError(f"{type(payload).__name__} in a worker process: {traceback.format_exc()}"))
        )


def _worker(conn: Connection, source: Any, args: Any, make_counter: Callable[[Any], Any]) -> None:
    # One tokenizer per process; its own thread pool would only compete with the other workers.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Ctrl-C reaches the whole process group: the main process stops the workers, they do not stop themselves.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        counter = make_counter(args)
    except Exception as exc:
        _send(conn, ("failed", None, exc))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the main process is gone
            return
        if task is None:
            return
        a, b = task
        try:
            result = counter.count(source.chunk(a, b), a)
        except Exception as exc:
            _send(conn, ("failed", task, exc))
            return
        _send(conn, ("done", task, result))


class _Workers:
    """The running workers, each with the chunk it holds."""

    def __init__(self, source: Any, args: Any, make_counter: Callable[[Any], Any]) -> None:
        methods = multiprocessing.get_all_start_methods()
        # fork: the workers share the source's offsets and the parent's imports without pickling them.
        self.ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        self.args = (source, args, make_counter)
        self.held: dict[Connection, tuple[Any, Optional[tuple[int, int]]]] = {}
        self.retired: list[Any] = []

    def start(self, bounds: tuple[int, int]) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        proc.start()
        child.close()  # the worker holds the only other end: its death closes the pipe
        self.held[parent] = (proc, bounds)
        self.give(parent, bounds)

    def give(self, conn: Connection, bounds: Optional[tuple[int, int]]) -> None:
        """Hand the worker its next chunk (None: stop). A worker that died meanwhile is seen by ``wait``."""
        proc, _ = self.held[conn]
        try:
            conn.send(bounds)
        except OSError:
            pass
        if bounds is None:
            self.retired.append(self.retire(conn))
        else:
            self.held[conn] = (proc, bounds)

    def retire(self, conn: Connection) -> Any:
        proc, _ = self.held.pop(conn)
        conn.close()
        return proc

    def stop(self) -> None:
        """Wait for the workers told to stop; end those still counting (after an error in this process)."""
        busy = [self.retire(conn) for conn in list(self.held)]
        for proc in busy:
            proc.terminate()
        for proc in busy + self.retired:
            proc.join(_JOIN_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()


def count_in_workers(
    source: Any,
    args: Any,
    make_counter: Callable[[Any], Any],
    todo: list[tuple[int, int]],
    workers: int,
    done: Callable[[int, int, Any], None],
) -> None:
    """Count the chunks ``todo`` (``(a, b)`` sample ranges) in ``workers`` processes.

    Each process builds its counter with ``make_counter(args)`` and counts ``source.chunk(a, b)``;
    ``done(a, b, result)`` runs in this process as each chunk finishes, in any order.

    Raises:
        WorkerDied: a chunk whose worker died on both tries (see the module docstring).
        Exception: what a worker raised (a :class:`~omnibal_kernels.raw_lengths.SampleError`, a bad option),
            after every worker is stopped.
    """
    pending = collections.deque(todo)
    starts: collections.Counter = collections.Counter()
    pool = _Workers(source, args, make_counter)
    try:
        while pending and len(pool.held) < workers:
            bounds = pending.popleft()
            starts[bounds] += 1
            pool.start(bounds)
        while pool.held:
            for ready in wait(list(pool.held)):
                conn = cast(Connection, ready)
                proc, held = pool.held[conn]
                try:
                    kind, task, payload = conn.recv()
                except (EOFError, OSError):  # the worker died holding its chunk
                    pool.retire(conn).join()
                    bounds = cast(tuple[int, int], held)  # a worker in `held` always holds a chunk
                    if starts[bounds] >= _TRIES:
                        a, b = bounds
                        raise WorkerDied(
                            f"samples {a}..{b - 1}: the worker process counting them died "
                            f"{starts[bounds]} times ({_died_how(proc.exitcode)})"
                        ) from None
                    starts[bounds] += 1
                    pool.start(bounds)
                    continue
                if kind == "failed":
                    raise payload
                done(task[0], task[1], payload)
                nxt = pending.popleft() if pending else None
                if nxt is not None:
                    starts[nxt] += 1
                pool.give(conn, nxt)
    finally:
        pool.stop()
