"""Tensors allocated in shared memory, for batches built inside DataLoader workers.

A worker sends every tensor of a batch to the main process through shared memory: a tensor allocated there
from the start passes as it is, any other is copied into a new segment first (what ``default_collate``
avoids by allocating in shared memory too). Every storage costs a shared-memory segment and a file
descriptor, so the parts of one batch share one storage where they can. torch is imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["in_worker", "shared_tensors"]

# Byte alignment of every part inside the shared storage (a cache line; any dtype's element size divides it).
_ALIGN = 64


def in_worker() -> bool:
    """Whether this process is a DataLoader worker (where a batch goes to the main process next)."""
    import torch.utils.data

    return torch.utils.data.get_worker_info() is not None


def shared_tensors(*parts: tuple[tuple[int, ...], Any]) -> list[Any]:
    """Uninitialized contiguous tensors, one per ``(shape, dtype)`` part, all views of one shared storage.

    Each part starts at a multiple of 64 bytes of the storage. A part with zero elements is an empty view.
    """
    import torch

    offsets = []
    nbytes = 0
    for shape, dtype in parts:
        nbytes = -(-nbytes // _ALIGN) * _ALIGN
        offsets.append(nbytes)
        numel = 1
        for size in shape:
            numel *= int(size)
        nbytes += numel * torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    out = []
    for (shape, dtype), offset in zip(parts, offsets):
        view = torch.empty(0, dtype=dtype)
        # torch's stubs require a stride here; it defaults to the contiguous one
        view.set_(storage, offset // view.element_size(), tuple(shape))  # type: ignore[call-overload]
        out.append(view)
    return out
