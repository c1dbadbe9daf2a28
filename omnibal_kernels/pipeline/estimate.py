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

import math
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
    "PUBLISHED_PARAMETERS",
    "VIT_UNITS",
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


VIT_UNITS = ("tile", "patch")


@dataclass(frozen=True)
class VLMConfig:
    """A vision-language model: a ViT, a projector, a decoder LLM, and how the ViT sees an image.

    ``vit_unit`` is the unit of a sample's ViT load and sets the ViT's sequence rule:

    - ``"tile"`` (InternVL): square tiles of ``image_size`` pixels, each ``(image_size / patch_size) ** 2``
      patches plus a class token attended alone (the ViT cost is linear in tiles); a pixel-shuffle MLP
      projector gives the LLM ``patches * downsample_ratio ** 2`` tokens per tile.
    - ``"patch"`` (Qwen2.5-VL): the load counts patches of ``patch_size`` pixels (``temporal_patch`` frames
      each); every image is one ViT sequence; layers in ``full_attention_layers`` attend over the whole image
      (quadratic in its patches), the others within windows of ``window_size`` pixels (linear); the merger
      joins ``1 / downsample_ratio ** 2`` patches into one LLM token (a 2x2 merge for 0.5).
    """

    name: str
    vision: TransformerShape
    llm: TransformerShape
    image_size: int = 448
    patch_size: int = 14
    downsample_ratio: float = 0.5
    vit_unit: str = "tile"
    temporal_patch: int = 1
    window_size: int = 0
    full_attention_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.vit_unit not in VIT_UNITS:
            raise ValueError(f"{self.name}: vit_unit must be one of {VIT_UNITS}, got {self.vit_unit!r}")
        if not 0.0 < self.downsample_ratio <= 1.0:
            raise ValueError(f"{self.name}: downsample_ratio must be in (0, 1], got {self.downsample_ratio}")
        object.__setattr__(self, "full_attention_layers", tuple(int(i) for i in self.full_attention_layers))

    @property
    def vit_tokens_per_tile(self) -> int:
        """ViT tokens per unit of ViT load: patches plus the class token of a tile, or 1 per patch."""
        if self.vit_unit == "patch":
            return 1
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def llm_tokens_per_tile(self) -> float:
        """Image tokens one unit of ViT load gives the LLM (after pixel shuffle or the patch merger)."""
        if self.vit_unit == "patch":
            return self.downsample_ratio**2
        return int(round((self.image_size // self.patch_size) ** 2 * self.downsample_ratio**2))

    @property
    def window_patches(self) -> int:
        """Patches of one attention window (0: no windows)."""
        if self.vit_unit != "patch" or not self.window_size:
            return 0
        merge = int(round(1 / self.downsample_ratio))
        return (self.window_size // merge // self.patch_size * merge) ** 2

    @property
    def input_bytes_per_unit(self) -> int:
        """Pixel values per unit of ViT load (elements, one per channel)."""
        if self.vit_unit == "patch":
            return 3 * self.temporal_patch * self.patch_size**2
        return 3 * self.image_size**2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def parameters(self) -> dict[str, int]:
        """Parameters of the ``vit`` (patch embedding and blocks), the ``projector`` (MLP or merger), the
        ``llm`` (token embedding, blocks, final norm, output layer) and their ``total``."""
        out = {"vit": 0, "projector": 0, "llm": 0}
        for row in _layer_table(self, 2):
            for group, count in row["groups"].items():
                out[group] += int(count)
        out["total"] = sum(out.values())
        return out


# Shapes from the public model configs (config.json of each checkpoint):
# - InternVL2-8B: InternViT-300M-448px + InternLM2.5-7B-chat;
# - InternVL-Chat-V1-5: InternViT-6B-448px-V1-5 (45 layers) + InternLM2-chat-20B;
# - InternVL-Chat-V1-5-Plus: the same ViT + Nous-Hermes-2-Yi-34B;
# - Qwen2.5-VL-7B-Instruct and -72B-Instruct: their 32-block windowed ViT (width 1280, SwiGLU, 112 px windows,
#   full attention in blocks 7, 15, 23, 31, 2x2 merger) + Qwen2.5-7B / Qwen2.5-72B.
_INTERNVIT_6B = TransformerShape(layers=45, hidden=3200, heads=25, intermediate=12800, gated_mlp=False)
_QWEN25_VIT = TransformerShape(layers=32, hidden=1280, heads=16, intermediate=3420, gated_mlp=True)
_QWEN25_VL = dict(
    patch_size=14,
    downsample_ratio=0.5,
    vit_unit="patch",
    temporal_patch=2,
    window_size=112,
    full_attention_layers=(7, 15, 23, 31),
)
CONFIGS: dict[str, VLMConfig] = {
    "internvl-300m-7b": VLMConfig(
        "internvl-300m-7b",
        TransformerShape(layers=24, hidden=1024, heads=16, intermediate=4096, gated_mlp=False),
        TransformerShape(layers=32, hidden=4096, heads=32, intermediate=14336, kv_heads=8, vocab=92553),
    ),
    "internvl-6b-20b": VLMConfig(
        "internvl-6b-20b",
        _INTERNVIT_6B,
        TransformerShape(layers=48, hidden=6144, heads=48, intermediate=16384, kv_heads=8, vocab=92553),
    ),
    "internvl-6b-34b": VLMConfig(
        "internvl-6b-34b",
        _INTERNVIT_6B,
        TransformerShape(layers=60, hidden=7168, heads=56, intermediate=20480, kv_heads=8, vocab=64000),
    ),
    "qwen2.5-vl-7b": VLMConfig(
        "qwen2.5-vl-7b",
        _QWEN25_VIT,
        TransformerShape(layers=28, hidden=3584, heads=28, intermediate=18944, kv_heads=4, vocab=152064),
        **_QWEN25_VL,  # type: ignore[arg-type]
    ),
    "qwen2.5-vl-72b": VLMConfig(
        "qwen2.5-vl-72b",
        _QWEN25_VIT,
        TransformerShape(layers=80, hidden=8192, heads=64, intermediate=29568, kv_heads=8, vocab=152064),
        **_QWEN25_VL,  # type: ignore[arg-type]
    ),
}
# The published sizes of the checkpoints these shapes come from (model cards and Hugging Face's safetensors
# counts), in parameters; tests/test_pipeline_profile.py holds the shapes to them.
PUBLISHED_PARAMETERS: dict[str, float] = {
    "internvl-300m-7b": 8.08e9,
    "internvl-6b-20b": 25.51e9,
    "internvl-6b-34b": 40.07e9,
    "qwen2.5-vl-7b": 8.29e9,
    "qwen2.5-vl-72b": 73.4e9,
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


def _patch_cost(linear_flops: float, quadratic_flops: float) -> Any:
    """Training GFLOP of a patch ViT layer: forward FLOPs per patch and per squared image length, times 3."""
    from ..balance.cost import CostModel

    return CostModel(vit_linear=3.0 * linear_flops / 1e9, vit_quadratic=3.0 * quadratic_flops / 1e9)


def cost_model_from_config(config: Union[str, Path, VLMConfig, Mapping[str, Any]]) -> Any:
    """The whole model's ``balance.CostModel`` from its shapes (InternVL tiles attended alone, Qwen2.5-VL
    patches per image and window, a causal LLM): the per-kind costs
    :func:`~omnibal_kernels.pipeline.micro_batches.micro_batch_times` scales layers by."""
    from ..balance.cost import CostModel

    cfg = load_config(config)
    v, t = cfg.vision, cfg.llm
    llm = _llm_cost(t.layers * t.layer_params, t.layers, t.hidden)
    if cfg.vit_unit == "patch":
        vit = [row["cost"] for row in _layer_table(cfg, 2) if row["kind"] in ("vit", "projector")]
        return CostModel(
            vit_linear=sum(c.vit_linear for c in vit),
            vit_quadratic=sum(c.vit_quadratic for c in vit),
            llm_linear=llm.llm_linear,
            llm_quadratic=llm.llm_quadratic,
        )
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


def _row(name: str, kind: str, groups: dict[str, float], cost: Any, **bytes_per: float) -> dict[str, Any]:
    """One layer: its parameters by part of the model (``groups``: ``{"vit" | "projector" | "llm": count}``),
    activation and output bytes per unit of ViT load (``act_unit``, ``out_unit``) and per LLM token
    (``act_token``, ``out_token``)."""
    row = dict(name=name, kind=kind, groups=groups, params=sum(groups.values()), cost=cost)
    row.update({key: bytes_per.get(key, 0) for key in ("act_unit", "act_token", "out_unit", "out_token")})
    return row


def _tile_vision_rows(cfg: VLMConfig, d: int) -> list[dict[str, Any]]:
    v = cfg.vision
    s_vit = cfg.vit_tokens_per_tile
    patch = 3 * cfg.patch_size**2 * v.hidden
    rows = [
        _row(
            "vit.embed",
            "vit",
            {"vit": patch + (s_vit + 1) * v.hidden},
            _vit_cost(patch, 0, v.hidden, s_vit - 1),
            act_unit=d * cfg.input_bytes_per_unit,
            out_unit=d * s_vit * v.hidden,
        )
    ]
    for i in range(v.layers):
        rows.append(
            _row(
                f"vit.{i}",
                "vit",
                {"vit": v.layer_params},
                _vit_cost(v.layer_params, 1, v.hidden, s_vit),
                act_unit=s_vit * v.activation_bytes_per_token(d),
                out_unit=d * s_vit * v.hidden,
            )
        )
    return rows


def _patch_vision_rows(cfg: VLMConfig, d: int) -> list[dict[str, Any]]:
    v = cfg.vision
    embed = cfg.input_bytes_per_unit * v.hidden  # a bias-free convolution over each patch
    rows = [
        _row(
            "vit.embed",
            "vit",
            {"vit": embed},
            _patch_cost(2.0 * embed, 0.0),
            act_unit=d * cfg.input_bytes_per_unit,
            out_unit=d * v.hidden,
        )
    ]
    full = set(cfg.full_attention_layers)
    for i in range(v.layers):
        # QK^T and AV: 4 * hidden FLOPs per query-key pair; a window of w patches gives each patch w pairs
        window = 0.0 if i in full else 4.0 * v.hidden * cfg.window_patches
        square = 4.0 * v.hidden if i in full or not cfg.window_patches else 0.0
        rows.append(
            _row(
                f"vit.{i}",
                "vit",
                {"vit": v.layer_params},
                _patch_cost(2.0 * v.layer_params + window, square),
                act_unit=v.activation_bytes_per_token(d),
                out_unit=d * v.hidden,
            )
        )
    return rows


def _layer_table(cfg: VLMConfig, dtype_bytes: int) -> list[dict[str, Any]]:
    """Per layer: name, kind, group (vit, projector or llm, for parameter counts), params, CostModel (per
    block), activation and output bytes per unit of ViT load and per LLM token."""
    v, t = cfg.vision, cfg.llm
    d = dtype_bytes
    rows = _patch_vision_rows(cfg, d) if cfg.vit_unit == "patch" else _tile_vision_rows(cfg, d)
    # The projector joins 1 / ratio**2 ViT tokens into one LLM token: LayerNorm, wide -> LLM width, GELU,
    # LLM width -> LLM width (InternVL's mlp1); Qwen2.5-VL's merger keeps the wide width in its hidden layer.
    wide = int(round(v.hidden / cfg.downsample_ratio**2))
    inner = wide if cfg.vit_unit == "patch" else t.hidden
    proj_params = wide * inner + inner * t.hidden + 2 * wide + inner + t.hidden
    per_unit = cfg.llm_tokens_per_tile  # LLM tokens per unit of ViT load
    if cfg.vit_unit == "patch":
        proj_cost = _patch_cost(2.0 * (wide * inner + inner * t.hidden) * per_unit, 0.0)
    else:
        proj_cost = _vit_cost(proj_params, 0, wide, int(per_unit))
    # The projector's layer also holds the text token embedding (the LLM's input embedding), so the merged
    # sequence leaves this layer; it keeps the token ids (int64) for the embedding's backward.
    rows.append(
        _row(
            "projector",
            "projector",
            {"projector": proj_params, "llm": t.vocab * t.hidden},
            proj_cost,
            act_unit=per_unit * d * (2 * wide + 2 * inner),
            act_token=8,
            out_token=d * t.hidden,
        )
    )
    for i in range(t.layers):
        rows.append(
            _row(
                f"llm.{i}",
                "llm",
                {"llm": t.layer_params},
                _llm_cost(t.layer_params, 1, t.hidden),
                act_token=t.activation_bytes_per_token(d),
                out_token=d * t.hidden,
            )
        )
    # Final norm, output projection and the loss: the fp32 logits kept by the cross entropy dominate.
    rows.append(
        _row(
            "head",
            "head",
            {"llm": t.vocab * t.hidden + t.hidden},
            _llm_cost(t.vocab * t.hidden, 0, t.hidden),
            act_token=d * 2 * t.hidden + t.vocab * (d + 4),
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
        loads.append((vit, llm))
    # the values checked all at once; the first pack at fault is looked for only when one is
    every = np.concatenate([np.concatenate([v, t]) for v, t in loads])
    if not (np.isfinite(every).all() and (every >= 0).all()):
        for p, (vit, llm) in enumerate(loads):
            if (vit < 0).any() or (llm < 0).any() or not (np.isfinite(vit).all() and np.isfinite(llm).all()):
                raise ValueError(f"packs[{p}]: loads must be finite and >= 0")
    return loads


def profile_from_config(
    config: Union[str, Path, VLMConfig, Mapping[str, Any]],
    packs: Sequence[tuple[Any, Any]],
    *,
    tflops: float = 312.0,
    efficiency: float = 0.5,
    dtype_bytes: int = 2,
    static_bytes_per_param: float = 16.0,
    tensor_parallel: int = 1,
) -> ModelProfile:
    """Estimates a per-layer profile of a vision-language model (``CONFIGS``) for the given micro-batches.

    Args:
        config: a name in ``CONFIGS``, an InternVL ``config.json`` path, its dict, or a ``VLMConfig``.
        packs: the micro-batches, each a pair ``(vit, llm)`` of per-sample loads (ViT units, tokens incl. image
            tokens). Times are the mean over the packs (the pipeline trains them all); activation bytes the
            maximum (each stage must hold its largest micro-batch).
        tflops, efficiency: device peak (TFLOP/s, 16-bit) and the fraction reached (time = FLOPs / both).
        dtype_bytes: bytes per activation element (2 for bf16/fp16).
        static_bytes_per_param: parameter + gradient + optimizer bytes per parameter.
        tensor_parallel: T, Megatron tensor parallelism with sequence parallelism: each of the T ranks of a
            stage computes 1/T of every layer's FLOPs and keeps 1/T of its parameters, activations and sends
            (the tensor-parallel collectives are not counted). The profile is that of one rank.
    """
    from .._checks import check_positive_int

    cfg = load_config(config)
    loads = pack_loads(packs)
    tp = check_positive_int("tensor_parallel", tensor_parallel)
    for key, value, top in (("tflops", tflops, math.inf), ("efficiency", efficiency, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{key} must be a number, got {type(value).__name__}")
        if not (0 < value <= top and math.isfinite(value)):
            raise ValueError(
                f"{key} must be {'in (0, 1] (a share of the peak)' if top == 1 else 'finite and > 0'}, got {value}"
            )
    ms_per_gflop = 1.0 / (tflops * efficiency * tp)  # GFLOP / (TFLOP/s) = ms
    units = np.array([v.sum() for v, _ in loads])
    tokens = np.array([t.sum() for _, t in loads])
    vit_all = np.concatenate([v for v, _ in loads])
    llm_all = np.concatenate([t for _, t in loads])
    mean_gflop: dict[Any, float] = {}  # the blocks of one stack share one cost model
    layers = []
    for row in _layer_table(cfg, dtype_bytes):
        if row["cost"] not in mean_gflop:
            mean_gflop[row["cost"]] = float(row["cost"].sample_costs(vit_all, llm_all).sum()) / len(loads)
        gflop = mean_gflop[row["cost"]]
        act = row["act_unit"] * units + row["act_token"] * tokens
        out = row["out_unit"] * units + row["out_token"] * tokens
        layers.append(
            LayerProfile(
                name=row["name"],
                kind=row["kind"],
                forward_ms=gflop * ms_per_gflop / 3.0,
                backward_ms=2.0 * gflop * ms_per_gflop / 3.0,
                activation_bytes=int(act.max() / tp),
                static_bytes=int(round(row["params"] * static_bytes_per_param / tp)),
                output_bytes=int(out.max() / tp) if row["kind"] != "head" else 4,
            )
        )
    meta = {
        "source": "config",
        "config": cfg.name,
        "packs": len(loads),
        "tiles_mean": float(units.mean()),
        "tokens_mean": float(tokens.mean()),
        "tflops": tflops,
        "efficiency": efficiency,
        "tensor_parallel": tp,
    }
    return ModelProfile(
        tuple(layers),
        input_bytes=int(dtype_bytes * cfg.input_bytes_per_unit * units.max() + 8 * tokens.max()),
        meta=meta,
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
