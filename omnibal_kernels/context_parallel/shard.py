"""``shard_for_context_parallel``: one packed batch -> one shard per CP rank, each a rank's batch and attention plan.

Every rank of a CP group computes the same shards from the same batch, without communication (the layout is
a pure function of the sequence lengths and the arguments); rank ``r`` keeps ``shards[r]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, cast, overload

import numpy as np
import torch

from .._checks import check_int
from .._contracts.segments import resolve_segments
from .cost import RankTimes
from .layout import Layout
from .options import ContextParallelOptions
from .strategy import plan_layout
from .tokens import RankPlan, rank_plans

if TYPE_CHECKING:
    from .vision import VisionShard

__all__ = ["ContextParallelShard", "ContextParallelShards", "shard_for_context_parallel"]

_FN = "shard_for_context_parallel"
# Fields recomputed for every rank; the batch's own values describe the whole batch.
_RECOMPUTED = frozenset(
    {
        "cu_seqlens",
        "seq_lens",
        "max_seqlen",
        "seq_idx",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "shift_labels",
        "cu_seqlens_k",
        "max_seqlen_k",
    }
)


@dataclass(frozen=True)
class ContextParallelShard:
    """What rank ``rank`` of a CP group holds of a packed batch, and how its attention reaches the other ranks.

    Attributes:
        rank, context_parallel_size: this rank and the group size.
        strategy: the strategy that made the layout (``"auto"`` resolved).
        indices: ``(n,)`` int64, the packed-batch position of every held token in local order; ``-1`` for a
            padding token the layout adds (zigzag with ``pad_sequences=True``).
        position_ids: ``(n,)`` int64, each held token's position within its own sequence (what RoPE needs).
        batch: the rank's batch, of the input's mapping type (a ``PackedBatch`` for ``pack_batch``'s output):
            ``input_ids``, ``labels``, ``shift_labels``, ``position_ids`` ``(1, n)``, ``seq_idx`` (int32
            ``(1, n)``, local query segment), ``cu_seqlens`` (int32 ``(c + 1,)``, one query segment per held
            chunk), ``seq_lens``, ``max_seqlen``, ``cu_seqlens_k`` (int32, keys per segment: the chunk's
            sequence up to its end), ``max_seqlen_k``, the batch's other per-token fields, and, as they are,
            its Python scalars (e.g. ``use_cache``) and the fields named in ``replicate``. The Hugging Face
            flash-attention keys are left out: a rank's attention needs the other ranks' K/V, which only
            :func:`context_parallel_attention` gathers.
        cu_seqlens_q, max_seqlen_q, cu_seqlens_k, max_seqlen_k: the local query and key segments.
        key_index: ``(cu_seqlens_k[-1],)`` int64, the row of each segment's keys in ``cat(own K/V, received)``.
        send_index: int64 local rows sent to the other ranks, grouped by destination.
        send_counts, recv_counts: rows sent to / received from each rank (tuples of ``context_parallel_size`` ints).
        group_exchanges: whether any rank of the group exchanges K/V (every rank skips the collective when
            none does).
        vision: a vision-language pack's vision work and embedding routing for this rank
            (:class:`~.vision.VisionShard`; ``PackCollator.for_model`` of a vision-language model sets it), or None.
    """

    rank: int
    context_parallel_size: int
    strategy: str
    indices: torch.Tensor
    position_ids: torch.Tensor
    batch: Mapping[str, Any]
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int
    key_index: torch.Tensor
    send_index: torch.Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    group_exchanges: bool
    vision: Optional[VisionShard] = None

    @property
    def num_tokens(self) -> int:
        """Tokens this rank holds (padding included)."""
        return int(self.indices.numel())

    def __repr__(self) -> str:
        return (
            f"ContextParallelShard(rank={self.rank}, context_parallel_size={self.context_parallel_size}, "
            f"strategy={self.strategy!r}, "
            f"tokens={self.num_tokens}, received={sum(self.recv_counts)}"
            + ("" if self.vision is None else f", vision={self.vision!r}")
            + ")"
        )

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ContextParallelShard:
        mapping: Any = type(self.batch)  # a concrete mapping type that takes a dict (PackedBatch, dict)
        batch = mapping({k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in self.batch.items()})
        tensors: dict[str, Any] = {
            f.name: fn(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        vision = None if self.vision is None else self.vision._map_tensors(fn)
        return dataclasses.replace(self, batch=batch, vision=vision, **tensors)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ContextParallelShard:
        """A copy with every tensor (the batch's included) on ``device``."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> ContextParallelShard:
        """A copy with every CPU tensor in pinned memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map_tensors(lambda t: t.pin_memory() if t.device.type == "cpu" else t)


class ContextParallelShards(Sequence[ContextParallelShard]):
    """The shards of one batch, one per CP rank (``shards[r]`` for rank ``r``), the layout and its predicted times.

    Attributes:
        strategy: the strategy used (``"auto"`` resolved).
        times: :class:`~.cost.RankTimes`, the predicted work of every rank.
        layout: the :class:`~.layout.Layout` (chunks of sequences on ranks).
        num_tokens: tokens of the packed batch, ``T``.
        num_items_in_batch: next-token targets of the whole batch (``shift_labels`` other than
            ``ignore_index``, over all ranks), or None without labels: the divisor that makes the ranks' summed
            losses add up to the batch's mean loss.
    """

    def __init__(
        self,
        shards: list[ContextParallelShard],
        layout: Layout,
        times: RankTimes,
        num_tokens: int,
        inverse: torch.Tensor,
        num_items_in_batch: int | None,
    ) -> None:
        self._shards = shards
        self.layout = layout
        self.times = times
        self.strategy = layout.strategy
        self.num_tokens = num_tokens
        self._inverse = inverse
        self.num_items_in_batch = num_items_in_batch

    @overload
    def __getitem__(self, i: int) -> ContextParallelShard: ...

    @overload
    def __getitem__(self, i: slice) -> list[ContextParallelShard]: ...

    def __getitem__(self, i: int | slice) -> ContextParallelShard | list[ContextParallelShard]:
        return self._shards[i]

    def __len__(self) -> int:
        return len(self._shards)

    def __iter__(self) -> Iterator[ContextParallelShard]:
        return iter(self._shards)

    def __repr__(self) -> str:
        return (
            f"ContextParallelShards(context_parallel_size={len(self)}, strategy={self.strategy!r}, tokens="
            f"{[s.num_tokens for s in self._shards]}, imbalance={self.times.imbalance:.4f}, "
            f"kv_exchanged={self.times.kv_exchanged})"
        )

    def restore(self, outputs: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
        """Per-rank outputs back in packed order: the inverse of the sharding (differentiable).

        Args:
            outputs: ``context_parallel_size`` tensors, rank ``r``'s with ``shards[r].num_tokens`` entries along ``dim``
                (e.g. attention outputs ``(n, heads, head_dim)`` with ``dim=0``, logits ``(1, n, vocab)``
                with ``dim=1``).
            dim: the token dimension.

        Returns:
            The ``T`` tokens of the packed batch along ``dim`` (padding tokens dropped).
        """
        if isinstance(outputs, torch.Tensor) or len(outputs) != len(self):
            raise ValueError(f"outputs must be a sequence of {len(self)} tensors, one per rank")
        for r, (out, shard) in enumerate(zip(outputs, self._shards)):
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"outputs[{r}] must be a torch.Tensor, got {type(out).__name__}")
            if out.dim() <= dim or out.shape[dim] != shard.num_tokens:
                raise ValueError(
                    f"outputs[{r}] must have {shard.num_tokens} tokens along dim {dim}, got shape {tuple(out.shape)}"
                )
        joined = torch.cat(list(outputs), dim=dim)
        return joined.index_select(dim, self._inverse.to(joined.device))


def _token_fields(batch: Mapping[str, Any], total: int, replicate: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``(per-token fields (..., 1, T), fields copied to every rank)`` of ``batch``: Python scalars (settings
    such as ``use_cache``) and the names in ``replicate`` are copied; any other field not recomputed is a
    ValueError."""
    fields, copied = [], list(replicate)
    for key, value in batch.items():
        if key in _RECOMPUTED or key in replicate:
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            copied.append(key)
            continue
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[-2:] == (1, total):
            fields.append(key)
            continue
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(
            f"{_FN}: batch field {key!r} ({shape}) is not per token (..., 1, {total}); a rank cannot "
            "tell which part it holds: leave it out, or name it in replicate= to copy it to every rank"
        )
    return fields, copied


def _check_batch(batch: Any, replicate: Any) -> tuple[np.ndarray, int, tuple[str, ...]]:
    """``(cu_seqlens on the host, T, replicate)`` of a valid batch."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{_FN}: batch must be a mapping of packed fields (a PackedBatch), got {type(batch).__name__}")
    if "input_ids" not in batch:
        raise ValueError(f"{_FN}: batch has no 'input_ids'")
    # pack_batch's batches hold cu_seqlens; PackCollator.for_model's only the Hugging Face name of it
    key = "cu_seqlens" if "cu_seqlens" in batch else "cu_seq_lens_q"
    if key not in batch:
        raise ValueError(f"{_FN}: batch has neither 'cu_seqlens' nor 'cu_seq_lens_q'")
    ids = batch["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{_FN}: batch['input_ids'] must be a (1, T) tensor, got {shape}")
    total = int(ids.shape[1])
    cu = batch[key]
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{_FN}: batch[{key!r}] must be an int32 tensor, got {type(cu).__name__}")
    host = cu.detach().cpu()
    resolve_segments(
        None, host, total, batch=max(host.numel() - 1, 0), padded_len=None, device=torch.device("cpu"), fn=_FN
    )
    if isinstance(replicate, str) or not all(isinstance(k, str) for k in replicate):
        raise TypeError(f"{_FN}: replicate must be a sequence of field names")
    return host.numpy().astype(np.int64), total, tuple(replicate)


def _rank_fields(
    batch: Mapping[str, Any],
    plan: RankPlan,
    layout: Layout,
    cu: np.ndarray,
    token_fields: list[str],
    pad_token_id: int,
    ignore_index: int,
) -> dict[str, Any]:
    """The per-token fields of one rank (input_ids, labels, shift_labels, position_ids and the others)."""
    device = batch["input_ids"].device
    lengths = layout.seqlens[plan.seq]
    real = plan.pos < lengths
    src = np.where(real, cu[plan.seq] + plan.pos, 0)
    src_t = torch.from_numpy(src).to(device)
    pad_t = torch.from_numpy(~real).to(device)
    fields: dict[str, Any] = {}
    for key in token_fields:
        value = batch[key].index_select(-1, src_t)
        if key == "position_ids" and value.dim() == 2:
            fill = torch.from_numpy(plan.pos).to(value)
            value = torch.where(pad_t, fill, value)
        elif bool(pad_t.any()):
            if key == "position_ids":
                raise ValueError(
                    f"{_FN}: pad_sequences=True with mRoPE position_ids {tuple(batch[key].shape)}: "
                    "padding has no 3-D position (use pad_sequences=False)"
                )
            fill_value = {"input_ids": pad_token_id, "labels": ignore_index}.get(key, 0)
            value = value.masked_fill(pad_t, fill_value)
        fields[key] = value
    if "position_ids" not in fields:
        fields["position_ids"] = torch.from_numpy(plan.pos).to(device).unsqueeze(0)
    if "labels" in batch:
        has_next = real & (plan.pos + 1 < lengths)
        nxt = torch.from_numpy(np.where(has_next, src + 1, 0)).to(device)
        shifted = batch["labels"].index_select(-1, nxt)
        fields["shift_labels"] = shifted.masked_fill(torch.from_numpy(~has_next).to(device), ignore_index)
    return fields


def _shard(
    batch: Mapping[str, Any],
    r: int,
    plan: RankPlan,
    layout: Layout,
    cu: np.ndarray,
    token_fields: list[str],
    replicate: tuple[str, ...],
    options: tuple[int, int, bool],
) -> ContextParallelShard:
    pad_token_id, ignore_index, group_exchanges = options
    device = batch["input_ids"].device
    fields = _rank_fields(batch, plan, layout, cu, token_fields, pad_token_id, ignore_index)
    q_lens = np.diff(plan.cu_q)
    # a rank without tokens keeps one empty segment, so every tensor keeps flash-attention's shapes
    cu_q = plan.cu_q if q_lens.size else np.zeros(2, np.int64)
    cu_k = np.r_[0, np.cumsum(plan.keys)] if q_lens.size else np.zeros(2, np.int64)
    as32 = [torch.from_numpy(a.astype(np.int32)).to(device) for a in (cu_q, np.diff(cu_q), cu_k)]
    max_q = int(q_lens.max()) if q_lens.size else 0
    max_k = int(plan.keys.max()) if plan.keys.size else 0
    seq_idx = np.repeat(np.arange(q_lens.size, dtype=np.int32), q_lens)
    out: dict[str, Any] = {"input_ids": fields.pop("input_ids")}
    for key in ("labels", "shift_labels", "position_ids"):
        if key in fields:
            out[key] = fields.pop(key)
    out.update(
        seq_idx=torch.from_numpy(seq_idx).to(device).unsqueeze(0),
        cu_seqlens=as32[0],
        max_seqlen=max_q,
        seq_lens=as32[1],
        cu_seqlens_k=as32[2],
        max_seqlen_k=max_k,
    )
    out.update(fields)
    out.update({key: batch[key] for key in replicate if key in batch})
    try:
        rank_batch = cast(Any, type(batch))(out)
    except TypeError:
        raise TypeError(
            f"{_FN}: cannot build a {type(batch).__name__} from a dict of fields; pass a PackedBatch or a dict"
        ) from None
    real = plan.pos < layout.seqlens[plan.seq]
    indices = np.where(real, cu[plan.seq] + plan.pos, -1)
    return ContextParallelShard(
        rank=r,
        context_parallel_size=layout.context_parallel_size,
        strategy=layout.strategy,
        indices=torch.from_numpy(indices).to(device),
        position_ids=torch.from_numpy(plan.pos.copy()).to(device),
        batch=rank_batch,
        cu_seqlens_q=as32[0],
        max_seqlen_q=max_q,
        cu_seqlens_k=as32[2],
        max_seqlen_k=max_k,
        key_index=torch.from_numpy(plan.key_index).to(device),
        send_index=torch.from_numpy(plan.send_index).to(device),
        send_counts=tuple(int(c) for c in plan.send_counts),
        recv_counts=tuple(int(c) for c in plan.recv_counts),
        group_exchanges=group_exchanges,
    )


def _inverse(shards: list[ContextParallelShard], total: int) -> torch.Tensor:
    """``(T,)`` position of every packed token in the concatenation of the ranks' rows."""
    indices = torch.cat([s.indices.cpu() for s in shards]).numpy()
    real = np.flatnonzero(indices >= 0)
    inverse = np.full(total, -1, np.int64)
    inverse[indices[real]] = real
    assert (inverse >= 0).all(), "a packed token is held by no rank"
    return torch.from_numpy(inverse)


def shard_for_context_parallel(
    batch: Mapping[str, Any],
    options: ContextParallelOptions,
    *,
    pad_token_id: int = 0,
    ignore_index: int = -100,
    replicate: Sequence[str] = (),
) -> ContextParallelShards:
    """Shards of a packed batch over the ``context_parallel_size`` ranks of a context-parallel group.

    Args:
        batch: a packed batch (``pack_batch``'s ``PackedBatch``, or a dict of the same fields): ``input_ids``
            ``(1, T)``, ``cu_seqlens`` (int32 ``(S + 1,)``; or ``cu_seq_lens_q``, as ``PackCollator.for_model``
            batches hold it), optional ``labels`` (as ``pack_batch`` makes them:
            unshifted, ``ignore_index`` on each sequence's first token) and ``position_ids`` ``(1, T)`` or
            mRoPE ``(k, 1, T)``, and any other per-token fields ``(..., 1, T)``. CPU or CUDA.
        options: the :class:`~omnibal_kernels.context_parallel.ContextParallelOptions`: the group's ``size``,
            the ``strategy`` (``"auto"`` picks per batch by predicted time), the ``cost`` terms the strategies
            balance, ``pad_sequences`` (zigzag only: every sequence padded at its end to a multiple of
            ``2 * size``, Megatron's THD layout, which ring-flash-attention also needs; padding tokens get
            ``pad_token_id``, ``ignore_index`` labels and the positions that continue their sequence) and
            ``max_rank_tokens`` (see :func:`~.strategy.context_parallel_rank_times`).
        pad_token_id, ignore_index: the values of padding tokens and of labels nothing learns from.
        replicate: names of fields that are not per token (e.g. per-sample values) copied to every rank;
            Python scalars are copied without being named. Any other field is a ValueError.

    Returns:
        :class:`ContextParallelShards`: ``shards[r]`` is rank ``r``'s :class:`ContextParallelShard`;
        ``.restore(outputs)`` puts per-rank outputs back in packed order; ``.times`` the predicted per-rank
        work. Labels: ``shift_labels[i]`` is the label of the token after held token ``i`` in its own sequence
        (``ignore_index`` after a sequence's last token), so a loss over a rank's tokens never learns across a
        chunk boundary or a sequence boundary; ``labels`` are the held tokens' own labels (each sequence's
        first token keeps ``ignore_index``). A rank's loss must use ``shift_labels`` (transformers models take
        ``shift_labels=`` and then skip their own shift, which would pair neighbours of different chunks).

    Raises:
        TypeError/ValueError: a bad argument or batch field, named.
    """
    cu, total, names = _check_batch(batch, replicate)
    pad_token_id = check_int("pad_token_id", pad_token_id)
    ignore_index = check_int("ignore_index", ignore_index)
    layout, times = plan_layout(np.diff(cu), options)
    token_fields, copied = _token_fields(batch, total, names)
    plans = rank_plans(layout)
    exchanges = bool(times.kv_exchanged > 0)
    shards = [
        _shard(batch, r, plan, layout, cu, token_fields, tuple(copied), (pad_token_id, ignore_index, exchanges))
        for r, plan in enumerate(plans)
    ]
    items = None
    if "labels" in batch:
        items = sum(int((s.batch["shift_labels"] != ignore_index).sum()) for s in shards)
    return ContextParallelShards(shards, layout, times, total, _inverse(shards, total), items)
