"""Profiles estimated from a model config and the loads of the packs a pipeline trains.

FLOPs come from ``CostModel.from_shapes`` applied layer by layer, so the layers of a chain add up to the
``CostModel`` of the whole model (the same training factor of 3: the backward costs twice the forward).
Time is FLOPs over ``tflops * efficiency``. Activation bytes follow the usual per-token count for a
transformer layer in 16-bit with flash attention and no tensor or sequence parallelism (norm inputs and
outputs, q/k/v, the attention output, the MLP's hidden tensors, 4 bytes of softmax statistics per head); for a
Llama-style layer this is ``d * (6h + 2kv + 3i)`` bytes per token, about the ``34 h`` of Korthikanti et al.
(2022) for h = 4096. Static bytes are parameters times ``static_bytes_per_param`` (16 for mixed-precision
Adam: 16-bit weights and gradients, fp32 master weights and two moments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union, cast

import numpy as np

from .profile import LayerProfile, ModelProfile, read_json

__all__ = [
    "TransformerShape",
    "VLMConfig",
    "CONFIGS",
    "cost_model_from_config",
    "load_config",
    "profile_from_config",
    "packs_from_plan",
]


@dataclass(frozen=True)
class TransformerShape:
    """One transformer stack: ``layers`` blocks of width ``hidden`` (``kv_heads`` < ``heads`` for GQA)."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    kv_heads: Optional[int] = None
    vocab: int = 0
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "intermediate"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")

    @property
    def kv_hidden(self) -> int:
        return self.hidden // self.heads * int(cast(int, self.kv_heads))  # set in __post_init__

    @property
    def layer_params(self) -> int:
        """Parameters of one block (attention, MLP, two norms)."""
        h, i = self.hidden, self.intermediate
        attention = 2 * h * h + 2 * h * self.kv_hidden
        mlp = (3 if self.gated_mlp else 2) * h * i
        return attention + mlp + 4 * h

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes one block keeps for backward per token (see the module docstring)."""
        h, i = self.hidden, self.intermediate
        attention = 4 * h + 2 * self.kv_hidden
        mlp = 2 * h + (3 * i if self.gated_mlp else 2 * i)
        return dtype_bytes * (attention + mlp) + 4 * self.heads


@dataclass(frozen=True)
class VLMConfig:
    """An InternVL-Chat-like model: a ViT on square tiles, a pixel-shuffle MLP projector, a decoder LLM."""

    name: str
    vision: TransformerShape
    llm: TransformerShape
    image_size: int = 448
    patch_size: int = 14
    downsample_ratio: float = 0.5

    @property
    def vit_tokens_per_tile(self) -> int:
        """Patches plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def llm_tokens_per_tile(self) -> int:
        """Image tokens one tile gives the LLM after pixel shuffle."""
        return int(round((self.image_size // self.patch_size) ** 2 * self.downsample_ratio**2))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Shapes from the public model configs: InternViT-300M-448px / InternViT-6B-448px-V1-5 and InternLM2-chat-7B /
# InternLM2-chat-20B (InternVL2-8B and InternVL-Chat-V1-5).
CONFIGS: dict[str, VLMConfig] = {
    "internvl-300m-7b": VLMConfig(
        "internvl-300m-7b",
        TransformerShape(layers=24, hidden=1024, heads=16, intermediate=4096, gated_mlp=False),
        TransformerShape(layers=32, hidden=4096, heads=32, intermediate=14336, kv_heads=8, vocab=92553),
    ),
    "internvl-6b-20b": VLMConfig(
        "internvl-6b-20b",
        TransformerShape(layers=45, hidden=3200, heads=25, intermediate=12800, gated_mlp=False),
        TransformerShape(layers=48, hidden=6144, heads=48, intermediate=16384, kv_heads=8, vocab=92553),
    ),
}


def _shape_from_hf(section: Mapping[str, Any], where: str, *, gated: bool) -> TransformerShape:
    keys = {
        "layers": "num_hidden_layers",
        "hidden": "hidden_size",
        "heads": "num_attention_heads",
        "intermediate": "intermediate_size",
    }
    missing = [v for v in keys.values() if v not in section]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    try:
        return TransformerShape(
            **{k: section[v] for k, v in keys.items()},
            kv_heads=section.get("num_key_value_heads"),
            vocab=int(section.get("vocab_size", 0)),
            gated_mlp=gated,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_config(config: Union[str, Path, VLMConfig, Mapping[str, Any]]) -> VLMConfig:
    """A ``VLMConfig`` from a name in ``CONFIGS``, a Hugging Face InternVL ``config.json`` (``vision_config`` and
    ``llm_config`` or ``text_config``, ``downsample_ratio``) or its dict."""
    if isinstance(config, VLMConfig):
        return config
    source = "config"
    if isinstance(config, (str, Path)):
        if str(config) in CONFIGS:
            return CONFIGS[str(config)]
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"config: not a known name ({', '.join(CONFIGS)}) nor a file: {config}")
        config = read_json(path)
        source = str(path)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a name, a path or a dict, got {type(config).__name__}")
    vision = config.get("vision_config")
    llm = config.get("llm_config", config.get("text_config"))
    if not isinstance(vision, Mapping) or not isinstance(llm, Mapping):
        raise ValueError(f"{source}: needs 'vision_config' and 'llm_config' (or 'text_config') objects")
    image_size = vision.get("image_size", 448)
    patch_size = vision.get("patch_size", 14)
    return VLMConfig(
        name=str(config.get("name", source)),
        vision=_shape_from_hf(vision, f"{source}: vision_config", gated=False),
        llm=_shape_from_hf(llm, f"{source}: llm_config", gated=True),
        image_size=int(image_size[0] if isinstance(image_size, list) else image_size),
        patch_size=int(patch_size[0] if isinstance(patch_size, list) else patch_size),
        downsample_ratio=float(config.get("downsample_ratio", 0.5)),
    )


def _vit_cost(params: float, layers: int, hidden: int, tokens_per_tile: int) -> Any:
    from ..balance.cost import CostModel

    return CostModel.from_shapes(
        vit_params=params,
        vit_layers=layers,
        vit_hidden=hidden,
        vit_tokens_per_unit=tokens_per_tile,
        vit_units_attend_jointly=False,
        llm_params=0.0,
        llm_layers=0,
        llm_hidden=0,
    )


def _llm_cost(params: float, layers: int, hidden: int) -> Any:
    from ..balance.cost import CostModel

    return CostModel.from_shapes(
        vit_params=0.0,
        vit_layers=0,
        vit_hidden=0,
        vit_tokens_per_unit=1,
        vit_units_attend_jointly=False,
        llm_params=params,
        llm_layers=layers,
        llm_hidden=hidden,
    )


def cost_model_from_config(config: Union[str, Path, VLMConfig, Mapping[str, Any]]) -> Any:
    """The whole model's ``balance.CostModel`` from its shapes (tiles attended alone, a causal LLM): the per-kind
    costs :func:`~omnibal_kernels.pipeline.micro_batches.micro_batch_times` scales layers by."""
    from ..balance.cost import CostModel

    cfg = load_config(config)
    v, t = cfg.vision, cfg.llm
    return CostModel.from_shapes(
        vit_params=v.layers * v.layer_params,
        vit_layers=v.layers,
        vit_hidden=v.hidden,
        vit_tokens_per_unit=cfg.vit_tokens_per_tile,
        vit_units_attend_jointly=False,
        llm_params=t.layers * t.layer_params,
        llm_layers=t.layers,
        llm_hidden=t.hidden,
    )


def _layer_table(cfg: VLMConfig, dtype_bytes: int) -> list[dict[str, Any]]:
    """Per layer: name, kind, params, CostModel (per block), activation bytes per ViT tile / LLM token."""
    v, t = cfg.vision, cfg.llm
    s_vit = cfg.vit_tokens_per_tile
    s_proj = cfg.llm_tokens_per_tile
    d = dtype_bytes
    rows = []
    patch_params = 3 * cfg.patch_size**2 * v.hidden + (s_vit + 1) * v.hidden
    rows.append(
        dict(
            name="vit.embed",
            kind="vit",
            params=patch_params,
            cost=_vit_cost(3 * cfg.patch_size**2 * v.hidden, 0, v.hidden, s_vit - 1),
            act_tile=d * 3 * cfg.image_size**2,
            act_token=0,
            out_tile=d * s_vit * v.hidden,
            out_token=0,
        )
    )
    for i in range(v.layers):
        rows.append(
            dict(
                name=f"vit.{i}",
                kind="vit",
                params=v.layer_params,
                cost=_vit_cost(v.layer_params, 1, v.hidden, s_vit),
                act_tile=s_vit * v.activation_bytes_per_token(d),
                act_token=0,
                out_tile=d * s_vit * v.hidden,
                out_token=0,
            )
        )
    wide = 4 * v.hidden if cfg.downsample_ratio == 0.5 else int(round(v.hidden / cfg.downsample_ratio**2))
    proj_params = wide * t.hidden + t.hidden * t.hidden + 2 * wide + 2 * t.hidden
    # The projector also holds the text token embedding (the LLM's input embedding), so the merged sequence
    # leaves this layer; it keeps the token ids (int64) for the embedding's backward.
    rows.append(
        dict(
            name="projector",
            kind="projector",
            params=proj_params + t.vocab * t.hidden,
            cost=_vit_cost(proj_params, 0, wide, s_proj),
            act_tile=s_proj * d * (2 * wide + 2 * t.hidden),
            act_token=8,
            out_tile=0,
            out_token=d * t.hidden,
        )
    )
    for i in range(t.layers):
        rows.append(
            dict(
                name=f"llm.{i}",
                kind="llm",
                params=t.layer_params,
                cost=_llm_cost(t.layer_params, 1, t.hidden),
                act_tile=0,
                act_token=t.activation_bytes_per_token(d),
                out_tile=0,
                out_token=d * t.hidden,
            )
        )
    # Final norm, output projection and the loss: the fp32 logits kept by the cross entropy dominate.
    rows.append(
        dict(
            name="head",
            kind="head",
            params=t.vocab * t.hidden + t.hidden,
            cost=_llm_cost(t.vocab * t.hidden, 0, t.hidden),
            act_tile=0,
            act_token=d * 2 * t.hidden + t.vocab * (d + 4),
            out_tile=0,
            out_token=0,
        )
    )
    return rows


def pack_loads(packs: Sequence[tuple[Any, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``packs`` (a sequence of ``(vit, llm)`` per-sample load pairs, or one pair) as checked float64 arrays;
    ``ValueError`` names the pack."""
    if isinstance(packs, tuple) and len(packs) == 2 and np.ndim(packs[0]) == 1:
        packs = [packs]  # one pack given as (vit, llm)
    if not isinstance(packs, Sequence) or len(packs) == 0:
        raise ValueError("packs must be a non-empty sequence of (vit, llm) per-sample load pairs")
    loads = []
    for p, pack in enumerate(packs):
        if not isinstance(pack, (tuple, list)) or len(pack) != 2:
            raise ValueError(f"packs[{p}] must be a (vit, llm) pair of per-sample loads")
        vit = np.atleast_1d(np.asarray(pack[0], dtype=np.float64))
        llm = np.atleast_1d(np.asarray(pack[1], dtype=np.float64))
        if vit.shape != llm.shape or vit.ndim != 1:
            raise ValueError(f"packs[{p}]: vit and llm must be 1-D of one length, got {vit.shape} and {llm.shape}")
        if (vit < 0).any() or (llm < 0).any() or not (np.isfinite(vit).all() and np.isfinite(llm).all()):
            raise ValueError(f"packs[{p}]: loads must be finite and >= 0")
        loads.append((vit, llm))
    return loads


def profile_from_config(
    config: Union[str, Path, VLMConfig, Mapping[str, Any]],
    packs: Sequence[tuple[Any, Any]],
    *,
    tflops: float = 312.0,
    efficiency: float = 0.5,
    dtype_bytes: int = 2,
    static_bytes_per_param: float = 16.0,
) -> ModelProfile:
    """Estimates a per-layer profile of an InternVL-Chat-like model for the given micro-batches.

    Args:
        config: a name in ``CONFIGS``, an InternVL ``config.json`` path, its dict, or a ``VLMConfig``.
        packs: the micro-batches, each a pair ``(vit, llm)`` of per-sample loads (tiles, tokens incl. image
            tokens). Times are the mean over the packs (the pipeline trains them all); activation bytes the
            maximum (each stage must hold its largest micro-batch).
        tflops, efficiency: device peak (TFLOP/s, 16-bit) and the fraction reached (time = FLOPs / both).
        dtype_bytes: bytes per activation element (2 for bf16/fp16).
        static_bytes_per_param: parameter + gradient + optimizer bytes per parameter.
    """
    cfg = load_config(config)
    loads = pack_loads(packs)
    for key, value in (("tflops", tflops), ("efficiency", efficiency)):
        if not value > 0:
            raise ValueError(f"{key} must be > 0, got {value}")
    ms_per_gflop = 1.0 / (tflops * efficiency)  # GFLOP / (TFLOP/s) = ms
    tiles = np.array([v.sum() for v, _ in loads])
    tokens = np.array([t.sum() for _, t in loads])
    layers = []
    for row in _layer_table(cfg, dtype_bytes):
        gflop = float(np.mean([row["cost"].sample_costs(v, t).sum() for v, t in loads]))
        act = row["act_tile"] * tiles + row["act_token"] * tokens
        out = row["out_tile"] * tiles + row["out_token"] * tokens
        layers.append(
            LayerProfile(
                name=row["name"],
                kind=row["kind"],
                forward_ms=gflop * ms_per_gflop / 3.0,
                backward_ms=2.0 * gflop * ms_per_gflop / 3.0,
                activation_bytes=int(act.max()),
                static_bytes=int(round(row["params"] * static_bytes_per_param)),
                output_bytes=int(out.max()) if row["kind"] != "head" else 4,
            )
        )
    meta = {
        "source": "config",
        "config": cfg.name,
        "packs": len(loads),
        "tiles_mean": float(tiles.mean()),
        "tokens_mean": float(tokens.mean()),
        "tflops": tflops,
        "efficiency": efficiency,
    }
    return ModelProfile(
        tuple(layers), input_bytes=int(dtype_bytes * 3 * cfg.image_size**2 * tiles.max() + 8 * tokens.max()), meta=meta
    )


def packs_from_plan(plan: Any, lengths: Any, limit: Optional[int] = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(vit, llm)`` per-sample loads of a ``Plan`` 's packs (the first ``limit`` of them)."""
    count = plan.num_packs if limit is None else min(int(limit), plan.num_packs)
    vit, llm = np.asarray(lengths.vit), np.asarray(lengths.llm)
    out = []
    for p in range(count):
        ids = plan.pack(p)
        out.append((vit[ids], llm[ids]))
    return out
