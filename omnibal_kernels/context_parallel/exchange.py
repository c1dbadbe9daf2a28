"""The all-to-all of rows with its gradient: what the CP attention (K/V rows) and the vision routing (embedding
rows) exchange. Works on any process group whose backend has ``all_to_all_single`` (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["exchange_rows"]


class _Exchange(torch.autograd.Function):
    """All-to-all of rows: forward sends ``send_counts`` rows to each rank, backward returns their gradients."""

    @staticmethod
    def forward(
        ctx: Any, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: dist.ProcessGroup | None
    ) -> torch.Tensor:
        ctx.counts = (send_counts, recv_counts)
        ctx.group = group
        out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
        dist.all_to_all_single(
            out, rows.contiguous(), output_split_sizes=recv_counts, input_split_sizes=send_counts, group=group
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        send_counts, recv_counts = ctx.counts
        back = grad.new_empty((sum(send_counts), *grad.shape[1:]))
        dist.all_to_all_single(
            back, grad.contiguous(), output_split_sizes=send_counts, input_split_sizes=recv_counts, group=ctx.group
        )
        return back, None, None, None


def exchange_rows(
    rows: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group: Any = None
) -> torch.Tensor:
    """Rows sent to every rank of ``group`` and rows received from each, differentiably.

    Collective: every rank of ``group`` calls it with matching counts.

    Args:
        rows: ``(sum(send_counts), ...)`` the rows to send, grouped by destination rank in rank order.
        send_counts, recv_counts: rows to each rank / from each rank (``group``'s size entries each).
        group: the process group (None: the world).

    Returns:
        ``(sum(recv_counts), ...)`` the rows received, grouped by source rank in rank order. The backward pass
        returns the received rows' gradients to their senders by the reverse all-to-all.
    """
    return _Exchange.apply(rows, list(send_counts), list(recv_counts), group)
