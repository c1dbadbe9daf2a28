"""Profiles measured on the machine at hand from a real ``torch.nn.Module`` chain and a real batch.

``measure_profile`` runs the layers one after another on the batch. For each layer it times the forward and
the backward (CUDA synchronized when the layer runs there), the same again with the layer run under
``torch.utils.checkpoint`` as ``apply_recompute`` wraps it (each checkpointed run right after a plain one, so
that both meet the same machine): what that adds to the forward pass (checkpoint's own work) and to the
backward pass (the recomputed forward), the layer's ``checkpoint_forward_ms`` and ``recompute_ms``; it records
the bytes of every tensor the layer saves for backward through ``torch.autograd.graph.saved_tensors_hooks``
(distinct storages, parameters and buffers excluded), and the bytes of its output. ``measure_saved_bytes``
checks a whole forward pass independently: it tracks every storage the pass allocates (a ``TorchDispatchMode``
and weak references) and reports the bytes still alive when it returns, which is what autograd (and
``torch.utils.checkpoint``) keeps for backward.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

from .profile import LayerProfile, ModelProfile
from .recompute import checkpointed

__all__ = ["measure_profile", "measure_saved_bytes"]


def _tensors(value: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _nbytes(value: Any) -> int:
    seen, total = set(), 0
    for t in _tensors(value):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _sync(value: Any) -> None:
    import torch

    if any(t.is_cuda for t in _tensors(value)):
        torch.cuda.synchronize()


def _detached(value: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    def leaf(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            t = t.detach()
            if t.is_floating_point():
                t.requires_grad_(True)
        return t

    return tree_map(leaf, value)


def _cloned(value: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value)


def _call(layer: Any, x: Any) -> Any:
    return layer(*x) if isinstance(x, tuple) else layer(x)


def _backward(out: Any) -> None:
    import torch

    outs = [t for t in _tensors(out) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _timed(layer: Any, x: Any, timer: Callable[[], float]) -> tuple[float, float]:
    """One forward and backward of ``layer`` on ``x``: their times in ms."""
    x = _detached(x)
    _sync(x)
    t0 = timer()
    out = _call(layer, x)
    _sync(out)
    t1 = timer()
    _backward(out)
    _sync(x)
    t2 = timer()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def measure_saved_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Runs ``fn(*args, **kwargs)`` and returns ``(result, bytes)``: the bytes of storages allocated during the
    call that are still alive after it, except the result's own. Run it on a forward pass with autograd
    enabled: that is the activation memory kept for backward (inputs passed in from outside are not counted;
    create them inside ``fn`` to count them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    live: dict[int, int] = {}

    class _Track(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            # A view or in-place result of a tensor made before the call (a weight's transpose) is not new.
            before = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))} - live.keys()
            for t in _tensors(out):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if storage.nbytes() and key not in live and key not in before:
                    live[key] = storage.nbytes()
                    weakref.finalize(storage, live.pop, key, None)
            return out

    with _Track():
        result = fn(*args, **kwargs)
    outputs = {t.untyped_storage().data_ptr() for t in _tensors(result)}
    return result, sum(n for key, n in list(live.items()) if key not in outputs)


def measure_profile(
    layers: Sequence[Any],
    inputs: Any,
    *,
    names: Optional[Sequence[str]] = None,
    kinds: Optional[Sequence[str]] = None,
    repeats: int = 3,
    warmup: int = 1,
    optimizer_bytes_per_param: float = 8.0,
    timer: Callable[[], float] = time.perf_counter,
    recompute: bool = True,
) -> ModelProfile:
    """Measures a per-layer profile of a chain of modules on one micro-batch.

    Args:
        layers: the chain, an ``nn.Sequential`` or a sequence of modules; layer ``i + 1`` takes the output of
            layer ``i`` (a tuple output is passed as positional arguments).
        inputs: the micro-batch for layer 0 (a tensor or a tuple of tensors).
        names: one name per layer (default: the ``nn.Sequential`` child names, ``"0"``, ``"1"``, ...), so the
            profile's names can address the sub-modules in ``apply_recompute`` and the split spec.
        kinds: optional kind per layer (``"vit"``, ``"projector"``, ``"llm"``, ``"head"``).
        repeats, warmup: timed and untimed runs per layer; the median is reported.
        optimizer_bytes_per_param: optimizer state per parameter element (8 for Adam's two fp32 moments);
            static bytes = parameters + gradients (the parameters' dtype) + this.
        timer: the clock, in seconds (default wall time; on a shared CPU with one torch thread,
            ``time.process_time`` measures the work without the time other processes take).
        recompute: also time every layer under ``torch.utils.checkpoint``, wrapped as ``apply_recompute``
            wraps it, right after each plain run: ``checkpoint_forward_ms`` and ``recompute_ms`` are the
            medians of what it adds to the forward and to the backward (at least 0); ``False`` leaves them out
            (then recomputation is priced as the forward time again).
    """
    import torch

    if isinstance(layers, torch.nn.Module) and not isinstance(layers, (torch.nn.Sequential, torch.nn.ModuleList)):
        raise TypeError("layers must be an nn.Sequential, nn.ModuleList or a sequence of modules")
    if names is None:
        names = (
            [n for n, _ in layers.named_children()]
            if isinstance(layers, torch.nn.Module)
            else [str(i) for i in range(len(layers))]
        )
    mods = list(layers)
    if len(names) != len(mods) or (kinds is not None and len(kinds) != len(mods)):
        raise ValueError(f"names/kinds must have one entry per layer ({len(mods)})")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    profiles = []
    # Own copies: a micro-batch sliced from a larger batch would otherwise count the whole batch's storage.
    x = _detached(_cloned(inputs))
    input_bytes = _nbytes(x)
    for i, layer in enumerate(mods):
        own = {p.untyped_storage().data_ptr() for p in list(layer.parameters()) + list(layer.buffers())}
        fwd_times, bwd_times, ckpt_fwd, ckpt_bwd = [], [], [], []
        saved: dict[int, int] = {}
        wrapped = checkpointed(layer) if recompute else None
        for r in range(warmup + repeats):
            fwd, bwd = _timed(layer, x, timer)
            if wrapped is not None:
                c_fwd, c_bwd = _timed(wrapped, x, timer)
            if r >= warmup:
                fwd_times.append(fwd)
                bwd_times.append(bwd)
                if wrapped is not None:
                    ckpt_fwd.append(c_fwd - fwd)
                    ckpt_bwd.append(c_bwd - bwd)

        def pack(t: torch.Tensor, own: set = own, saved: dict = saved) -> torch.Tensor:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in own and storage.nbytes():
                saved[key] = storage.nbytes()
            # not ``t`` itself: a saved output would hold its own graph, a cycle through autograd that the
            # collector cannot see, and the graph would never be freed
            return t.detach()

        # One more forward, untimed, records what the layer saves for backward.
        x = _detached(x)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = _call(layer, x)
        static = sum(
            p.numel() * (2 * p.element_size() + optimizer_bytes_per_param)
            for p in layer.parameters()
            if p.requires_grad
        )
        profiles.append(
            LayerProfile(
                name=str(names[i]),
                kind="" if kinds is None else str(kinds[i]),
                forward_ms=statistics.median(fwd_times),
                backward_ms=statistics.median(bwd_times),
                activation_bytes=sum(saved.values()),
                static_bytes=int(round(static)),
                output_bytes=_nbytes(out),
                recompute_ms=max(statistics.median(ckpt_bwd), 0.0) if recompute else None,
                checkpoint_forward_ms=max(statistics.median(ckpt_fwd), 0.0) if recompute else 0.0,
            )
        )
        x = tuple(t.detach() for t in out) if isinstance(out, tuple) else out.detach()
    device = next((t.device.type for t in _tensors(inputs)), "cpu")
    return ModelProfile(
        tuple(profiles), input_bytes=input_bytes, meta={"source": "measured", "device": device, "repeats": repeats}
    )
