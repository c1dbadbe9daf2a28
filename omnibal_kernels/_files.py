"""Atomic file writes: every file the package writes appears whole or not at all.

``atomic_write(path)`` hands out a temporary file in the target's folder; when the ``with`` block ends without
an exception the file is flushed, fsynced and renamed over ``path`` with ``os.replace`` (atomic on POSIX and
Windows within one file system), and the folder is fsynced so the rename survives a power loss. An exception
removes the temporary file and leaves ``path`` as it was. A process killed mid-write (SIGKILL, power loss)
leaves ``path`` as it was too, plus at most a hidden ``.<name>.<random>.tmp`` beside it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Optional, Union

__all__ = ["atomic_write", "write_json"]

PathLike = Union[str, "os.PathLike[str]"]


def _fsync_folder(folder: Path) -> None:
    # A rename is durable only once its folder is synced; Windows cannot open folders (nothing to do there).
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse to fsync a folder; the data itself is synced already
    finally:
        os.close(fd)


def _open_temporary(path: Path) -> tuple[int, Path]:
    """A new file beside ``path``, opened for writing with the permissions ``open(path, "w")`` would give."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            # Mode 0o666 is narrowed by the umask, as for any new file (mkstemp would give 0o600).
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file beside {path}")


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write ``path`` atomically: ``with atomic_write(p, "w") as f: f.write(...)``.

    Args:
        path: the file to write; its folder must exist.
        mode: ``"wb"`` (default) or ``"w"`` (text, ``encoding`` default UTF-8).
        encoding: text encoding for ``mode="w"``.

    Yields:
        The open temporary file.

    Raises:
        OSError: the folder does not exist, is not a folder, or cannot be written (naming ``path``);
            ``IsADirectoryError`` when ``path`` is a folder.
        ValueError: an unsupported ``mode``.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        fd, tmp = _open_temporary(path)
    except OSError as exc:
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None  # name the file asked for, not the temporary
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # keep the mode of a file being replaced
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def write_json(path: PathLike, value: Any, *, indent: Optional[int] = None) -> None:
    """Write ``value`` as JSON (one trailing newline) into ``path`` atomically; its folder must exist.

    Raises:
        TypeError: ``value`` holds something JSON cannot represent (``path`` is left as it was).
        OSError: as :func:`atomic_write`.
    """
    text = json.dumps(value, indent=indent) + "\n"  # before the file is opened: a bad value writes nothing
    with atomic_write(path, "w") as f:
        f.write(text)
