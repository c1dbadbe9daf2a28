"""Variable-length ("varlen") attention over packed sequences.

Packed layout, as flash-attention defines it: the tokens of all sequences of a batch lie back to back,
``q: (total_tokens, heads, head_dim)``, and ``cu_seqlens`` (int32, ``(batch + 1,)``, starting at 0) marks
where each sequence begins and ends. Attention never crosses a boundary in ``cu_seqlens``; that is what
makes a packed batch compute exactly what the same samples compute one at a time.

:func:`varlen_attention` dispatches to one of three backends:

``"flash_attn"``
    ``flash_attn.flash_attn_varlen_func`` (CUDA, fp16/bf16) when the ``flash_attn`` package imports.
``"torch_varlen"``
    ``torch.nn.attention.varlen.varlen_attn`` (CUDA, fp16/bf16, torch >= 2.9). Its keyword arguments
    changed between releases (``is_causal`` became ``window_size``; ``scale`` and ``enable_gqa`` were
    added later); the adapter reads the installed signature and maps onto it.
``"sdpa"``
    ``torch.nn.functional.scaled_dot_product_attention`` once per group of segments of equal length
    (queries and keys), nothing padded: each segment costs its own attention, as in the varlen kernels.
    Any device, any floating dtype, autograd. It is the path used on CPU and the fallback on GPUs without
    the other two; a pack of samples of distinct lengths makes one call per sample.

All backends share one convention for ``causal`` when a segment has fewer keys than queries or more
(``cu_seqlens_k`` given): the mask is aligned to the bottom-right corner, as in flash-attention >= 2.1,
so query ``i`` of a segment with ``Lq`` queries and ``Lk`` keys sees keys ``j <= i + Lk - Lq``; a query
row that sees no key at all returns zeros.

Nothing heavy is imported at module import: ``flash_attn`` and ``torch.nn.attention.varlen`` are imported
on first use.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ._checks import backends, check_backend
from ._contracts.segments import check_cu_seqlens_tensor
from ._csr import check_offset_values

__all__ = ["varlen_attention", "available_backends", "BACKENDS"]

# the "attention" row of the package's one backend vocabulary (omnibal_kernels._checks.BACKENDS)
BACKENDS = backends("attention")

# The CUDA varlen kernels (flash-attn and torch's varlen_attn, which wraps the same flash kernels) take
# only half-precision inputs.
_HALF_DTYPES = (torch.float16, torch.bfloat16)

# ----------------------------------------------------------------------------------------------------
# validation


def _check_tensor(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (total_tokens, heads, head_dim), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


def _check_cu_seqlens(
    name: str, cu_seqlens: Any, total_tokens: int, device: torch.device, check_values: bool
) -> torch.Tensor | None:
    """Validates ``cu_seqlens``; returns it on the CPU when the values were read, else ``None``."""
    check_cu_seqlens_tensor(name, cu_seqlens, device=device, data="q")
    if not check_values:
        return None
    host = cu_seqlens.cpu()
    check_offset_values(name, host.numpy(), total_tokens, row="sequence", total_of="tokens")
    return host


def _check_max_seqlen(name: str, max_seqlen: Any, cu_host: torch.Tensor | None, cu_name: str) -> None:
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int, got {type(max_seqlen).__name__}")
    if max_seqlen < 0:
        raise ValueError(f"{name} must be >= 0, got {max_seqlen}")
    if cu_host is not None:
        longest = int((cu_host[1:] - cu_host[:-1]).max())
        # Larger is allowed (a static-shape batch rounds max_seqlen up to a bucket); smaller makes the
        # CUDA kernels skip tokens silently.
        if max_seqlen < longest:
            raise ValueError(f"{name} = {max_seqlen} is smaller than the longest segment in {cu_name} ({longest})")


# ----------------------------------------------------------------------------------------------------
# backend discovery


@functools.lru_cache(maxsize=1)
def _flash_attn_varlen_func() -> Callable[..., torch.Tensor] | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # ImportError, or a broken CUDA build raising at import
        return None
    return flash_attn_varlen_func


@functools.lru_cache(maxsize=1)
def _torch_varlen_attn() -> tuple[Callable[..., Any], frozenset[str]] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    try:
        params = frozenset(inspect.signature(varlen_attn).parameters)
    except (TypeError, ValueError):
        return None
    return varlen_attn, params


def available_backends() -> list[str]:
    """Backends usable in this process, in the order ``backend="auto"`` tries them.

    ``flash_attn`` and ``torch_varlen`` are listed only with CUDA present and their module importable;
    ``sdpa`` is always listed.
    """
    names = []
    if torch.cuda.is_available():
        if _flash_attn_varlen_func() is not None:
            names.append("flash_attn")
        if _torch_varlen_attn() is not None:
            names.append("torch_varlen")
    names.append("sdpa")
    return names


def _cuda_backend_problem(backend: str, q: torch.Tensor, dropout_p: float) -> str | None:
    """Why a CUDA varlen backend cannot take these inputs, or ``None`` when it can."""
    if backend == "flash_attn" and _flash_attn_varlen_func() is None:
        return "the flash_attn package is not importable (pip install flash-attn)"
    if backend == "torch_varlen" and _torch_varlen_attn() is None:
        return f"torch.nn.attention.varlen.varlen_attn is not available in torch {torch.__version__} (needs >= 2.9)"
    if not q.is_cuda:
        return f"it runs only on CUDA tensors, got q on {q.device}"
    if q.dtype not in _HALF_DTYPES:
        return f"it takes only float16 or bfloat16, got {q.dtype}"
    if backend == "torch_varlen" and dropout_p > 0.0:
        return "it has no attention dropout (dropout_p > 0)"
    return None


def _choose_backend(backend: str, q: torch.Tensor, dropout_p: float) -> str:
    check_backend("varlen_attention", backend, "attention")
    if backend == "sdpa":
        return backend
    if backend != "auto":
        problem = _cuda_backend_problem(backend, q, dropout_p)
        if problem is not None:
            raise RuntimeError(f"varlen_attention backend {backend!r} cannot be used: {problem}")
        return backend
    if q.is_cuda and q.dtype in _HALF_DTYPES:
        for name in ("flash_attn", "torch_varlen"):
            if _cuda_backend_problem(name, q, dropout_p) is None:
                return name
    return "sdpa"


# ----------------------------------------------------------------------------------------------------
# public function


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = True,
    softmax_scale: float | None = None,
    *,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_k: int | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Attention within each packed sequence, never across sequences.

    Args:
        q: ``(total_tokens, heads, head_dim)`` queries of all sequences back to back.
        k: ``(total_tokens_k, kv_heads, head_dim)`` keys; ``heads`` must be a multiple of ``kv_heads``
            (grouped-query attention: query head ``h`` uses key/value head ``h // (heads // kv_heads)``).
        v: ``(total_tokens_k, kv_heads, head_dim)`` values.
        cu_seqlens: int32 ``(batch + 1,)`` on q's device; sequence ``b`` holds tokens
            ``cu_seqlens[b]:cu_seqlens[b + 1]``. Starts at 0, non-decreasing, ends at ``total_tokens``;
            zero-length sequences are allowed (padding a static-shape batch produces them).
        max_seqlen: Python int, at least the longest sequence (may be larger, e.g. rounded to a bucket).
        causal: each query sees only keys at or before its position in its own sequence
            (bottom-right aligned when a sequence has different numbers of queries and keys).
        softmax_scale: scale of ``q @ k^T`` before the softmax; default ``1 / sqrt(head_dim)``.
        cu_seqlens_k: int32 ``(batch + 1,)`` boundaries in ``k``/``v`` when they differ from the queries';
            default ``cu_seqlens`` (then ``k`` and ``v`` must have ``total_tokens`` rows).
        max_seqlen_k: longest key sequence; default ``max_seqlen``.
        dropout_p: attention dropout probability (training only; not supported by ``torch_varlen``).
        backend: ``"auto"`` (flash_attn, then torch_varlen for CUDA half-precision inputs, else sdpa),
            or one of ``"flash_attn"``, ``"torch_varlen"``, ``"sdpa"``; a named backend that cannot run
            these inputs raises ``RuntimeError`` saying why.
        validate: check the values of ``cu_seqlens`` and ``max_seqlen``. Reading them copies a few bytes to
            the host, a synchronisation on CUDA; a training loop whose batches come from a checked
            collate can pass ``False``. Shapes, dtypes and devices are always checked. The sdpa backend
            reads the lengths anyway.

    Returns:
        ``(total_tokens, heads, head_dim)`` in q's dtype.
    """
    _check_tensor("q", q)
    _check_tensor("k", k)
    _check_tensor("v", v)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[2]} and {k.shape[2]}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q heads ({heads}) must be a positive multiple of k/v heads ({kv_heads})")
    if cu_seqlens_k is None and k.shape[0] != q.shape[0]:
        raise ValueError(
            f"k has {k.shape[0]} tokens but q has {q.shape[0]}; pass cu_seqlens_k for different key lengths"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive number or None, got {softmax_scale!r}")

    chosen = _choose_backend(backend, q, dropout_p)
    # the sdpa backend groups segments on the host, so it reads the lengths regardless of `validate`
    read_values = validate or chosen == "sdpa"
    cu_q_host = _check_cu_seqlens("cu_seqlens", cu_seqlens, q.shape[0], q.device, read_values)
    _check_max_seqlen("max_seqlen", max_seqlen, cu_q_host if validate else None, "cu_seqlens")
    if cu_seqlens_k is None:
        if max_seqlen_k is not None and max_seqlen_k != max_seqlen:
            raise ValueError("max_seqlen_k given without cu_seqlens_k; both or neither")
        cu_seqlens_k, cu_k_host, max_seqlen_k = cu_seqlens, cu_q_host, max_seqlen
    else:
        cu_k_host = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device, read_values)
        if cu_seqlens_k.numel() != cu_seqlens.numel():
            raise ValueError(f"cu_seqlens_k has {cu_seqlens_k.numel()} entries but cu_seqlens has {cu_seqlens.numel()}")
        if max_seqlen_k is None:
            raise ValueError("cu_seqlens_k given without max_seqlen_k")
        _check_max_seqlen("max_seqlen_k", max_seqlen_k, cu_k_host if validate else None, "cu_seqlens_k")
    scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else float(softmax_scale)

    if chosen == "flash_attn":
        return _flash_attn(
            q, k, v, cu_seqlens, cu_seqlens_k, int(max_seqlen), int(max_seqlen_k), causal, scale, dropout_p
        )
    if chosen == "torch_varlen":
        return _torch_varlen(q, k, v, cu_seqlens, cu_seqlens_k, int(max_seqlen), int(max_seqlen_k), causal, scale)
    assert cu_q_host is not None and cu_k_host is not None
    return _sdpa_varlen(q, k, v, cu_q_host, cu_k_host, causal, scale, dropout_p)


# ----------------------------------------------------------------------------------------------------
# backends


def _flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    causal: bool,
    scale: float,
    dropout_p: float,
) -> torch.Tensor:
    fn = _flash_attn_varlen_func()
    assert fn is not None
    # flash-attn handles grouped-query heads itself
    return fn(
        q,
        k,
        v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max_q,
        max_seqlen_k=max_k,
        dropout_p=dropout_p,
        softmax_scale=scale,
        causal=causal,
    )


def _torch_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    found = _torch_varlen_attn()
    assert found is not None
    fn, params = found
    kwargs: dict[str, Any] = {}
    # torch 2.9/2.10 take is_causal; later releases replaced it by window_size (-1, 0) = causal
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    elif "is_causal" in params:
        kwargs["is_causal"] = causal
    else:
        raise RuntimeError("torch.nn.attention.varlen.varlen_attn takes neither window_size nor is_causal")
    if "scale" in params:
        kwargs["scale"] = scale
    else:
        # releases without `scale` always use 1/sqrt(head_dim); fold the requested scale into q
        default = 1.0 / math.sqrt(q.shape[2])
        if scale != default:
            q = q * (scale / default)
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
    return fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


def _length_groups(lens_q: np.ndarray, lens_k: np.ndarray) -> list[np.ndarray]:
    """Segments with queries and keys, grouped by their exact ``(queries, keys)`` lengths, in packed order."""
    live = np.flatnonzero((lens_q > 0) & (lens_k > 0))
    if not live.size:
        return []
    key = lens_q[live] * (int(lens_k.max()) + 1) + lens_k[live]
    order = np.argsort(key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    return np.split(live[order], cuts)


def _group_input(x: torch.Tensor, parts: tuple[torch.Tensor, ...] | None, group: np.ndarray) -> torch.Tensor:
    """``(n, heads, length, dim)``: the segments ``group`` of ``x``, all of one length; ``parts`` is ``x`` split
    into its segments, or None when ``group`` is every segment, back to back (a view of ``x``)."""
    if parts is None:
        block = x.unflatten(0, (group.shape[0], -1))
    elif group.shape[0] == 1:
        block = parts[int(group[0])].unsqueeze(0)
    else:
        block = torch.stack([parts[int(s)] for s in group])
    return block.transpose(1, 2)


def _bottom_right_mask(lq: int, lk: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The causal mask of ``lq`` queries over ``lk`` keys aligned bottom-right, ``(lq, lk)`` bool, and the
    ``(lq, 1)`` rows that see a key (None when all do); rows that see none are opened, their output zeroed."""
    allowed = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
    has_key = allowed.any(axis=1, keepdims=True)
    row_ok = None
    if not bool(has_key.all()):
        # a row that sees no key would be NaN in SDPA
        row_ok = torch.from_numpy(has_key).to(device)
        allowed = allowed | ~has_key
    return torch.from_numpy(allowed).to(device), row_ok


def _sdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
    dropout_p: float,
) -> torch.Tensor:
    """One SDPA call per group of equal-length segments, nothing padded: the attention work of each segment is
    its own (queries x keys), whatever the other segments' lengths."""
    cu_q_np = cu_q.numpy().astype(np.int64)
    cu_k_np = cu_k.numpy().astype(np.int64)
    lens_q, lens_k = np.diff(cu_q_np), np.diff(cu_k_np)
    heads = q.shape[1]
    if k.shape[1] != heads:  # grouped-query attention: each key/value head serves heads // kv_heads queries
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    groups = _length_groups(lens_q, lens_k)
    if not groups:
        # no segment has both queries and keys: zeros, as flash-attention returns, still attached to every
        # input's graph, so that a backward through them gives each input its (zero) gradient
        return q * 0.0 + (k.sum() + v.sum()) * 0.0
    # autograd sees one split per input (its backward is one cat), not a slice per segment (whose backwards
    # each write a gradient the size of the whole input); a single group of every segment needs no split
    whole = len(groups) == 1 and groups[0].shape[0] == lens_q.shape[0]
    parts = (
        (None, None, None)
        if whole
        else tuple(x.split(lens.tolist()) for x, lens in ((q, lens_q), (k, lens_k), (v, lens_k)))
    )
    pieces: list[tuple[int, torch.Tensor]] = []  # (first query row, that segment's output rows)
    for s in np.flatnonzero((lens_q > 0) & (lens_k == 0)):  # queries without any key: zeros, attached to q
        pieces.append((int(cu_q_np[s]), parts[0][int(s)] * 0.0))
    for group in groups:
        lq, lk = int(lens_q[group[0]]), int(lens_k[group[0]])
        mask, row_ok = _bottom_right_mask(lq, lk, q.device) if causal and lq != lk else (None, None)
        out = F.scaled_dot_product_attention(
            _group_input(q, parts[0], group),
            _group_input(k, parts[1], group),
            _group_input(v, parts[2], group),
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=causal and lq == lk,
            scale=scale,
        )
        if row_ok is not None:
            out = out * row_ok.to(out.dtype)
        out = out.transpose(1, 2)  # (n, lq, heads, dim)
        if whole:
            return out.reshape(q.shape)
        pieces += [(int(cu_q_np[s]), rows) for s, rows in zip(group, out.unbind(0))]
    pieces.sort(key=lambda piece: piece[0])
    return torch.cat([rows for _, rows in pieces])
