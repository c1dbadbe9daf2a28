"""Per-layer profiles of a model seen as a chain of layers (ViT layers, projector, LLM layers, head).

A profile gives, per micro-batch and per layer: forward and backward time, the bytes the layer keeps for its
backward pass (``activation_bytes``; with recomputation it keeps only its input, the ``output_bytes`` of the
layer before it, or the profile's ``input_bytes`` for the first layer), its parameter + gradient + optimizer
bytes (``static_bytes``) and the bytes it sends to the next layer (``output_bytes``).

JSON form (``load_profile`` / ``ModelProfile.save``)::

    {"input_bytes": 0,                       # optional: bytes of the chain's input (default 0)
     "meta": {...},                          # optional: free-form description (source, loads, device)
     "layers": [{"name": "vit.0", "forward_ms": 1.2, "backward_ms": 2.4, "activation_bytes": 123,
                 "static_bytes": 456, "output_bytes": 78, "kind": "vit",
                 "recompute_ms": 1.3, "checkpoint_forward_ms": 0.1}, ...]}

``kind`` is optional (``"vit"``, ``"projector"``, ``"llm"``, ``"head"``, ...); the engine forms use it to count
decoder layers per stage. ``fixed_forward_ms`` and ``fixed_backward_ms`` are optional (default 0): the part of
each time that does not grow with the micro-batch (the per-call cost of the layer's operations), which a
micro-batch of another size keeps while the rest scales with its cost (``omniverse.affine_profile`` fits them
from profiles measured on micro-batches of two sizes).

``recompute_ms`` and ``checkpoint_forward_ms`` are optional: what recomputing the layer costs, measured by
running it under ``torch.utils.checkpoint`` (``measure_profile``). A recomputed layer runs its forward again
in the backward pass, which takes ``recompute_ms`` longer (absent: ``forward_ms``, the forward time again),
and its forward pass takes ``checkpoint_forward_ms`` longer (checkpoint's own work; absent: 0).
``fixed_recompute_ms`` and ``fixed_checkpoint_forward_ms`` are their parts that do not grow with the
micro-batch (absent: ``fixed_forward_ms`` for a layer without ``recompute_ms``, else 0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from .._checks import check_finite_non_negative

__all__ = ["LayerProfile", "ModelProfile", "PROFILE_FIELDS", "as_profile", "load_profile"]

# The JSON schema of one layer: field -> meaning.
PROFILE_FIELDS: dict[str, str] = {
    "name": "layer name (str)",
    "forward_ms": "forward time per micro-batch in ms (float >= 0)",
    "backward_ms": "backward time per micro-batch in ms (float >= 0)",
    "activation_bytes": "bytes kept for backward without recomputation (int >= 0)",
    "static_bytes": "parameter + gradient + optimizer-state bytes (int >= 0)",
    "output_bytes": "bytes of the output sent to the next layer (int >= 0)",
}
_TIME_FIELDS = ("forward_ms", "backward_ms")
_FIXED_FIELDS = ("fixed_forward_ms", "fixed_backward_ms")
# what recomputing a layer adds to its backward and to its forward pass, and their fixed parts (module docstring)
_RECOMPUTE_FIELDS = ("recompute_ms", "checkpoint_forward_ms", "fixed_recompute_ms", "fixed_checkpoint_forward_ms")
_BYTE_FIELDS = ("activation_bytes", "static_bytes", "output_bytes")


# Byte counts are summed and compared as float64, which holds every integer up to 2**53 (8 PiB) exactly.
MAX_BYTES = 2**53
# A layer's time per micro-batch (ms, about 30 years): far above any measured layer, and low enough that a step of
# MAX_MICRO_BATCHES over any chain stays finite.
MAX_LAYER_MS = 1e12


def _check_bytes(where: str, name: str, value: object) -> int:
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an integer number of bytes, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= MAX_BYTES:
        shown = str(value) if len(str(value)) <= 40 else f"an integer of {len(str(value))} digits"
        raise ValueError(f"{where}: {name} must be in [0, 2**53], got {shown}")
    return value


def _recompute_cost(layer: LayerProfile) -> tuple[float, float]:
    """What recomputing ``layer`` adds to its backward pass and the fixed part of that (without a measured
    ``recompute_ms``: its forward again)."""
    if layer.recompute_ms is None:
        return layer.forward_ms, layer.fixed_forward_ms
    return layer.recompute_ms, layer.fixed_recompute_ms


@dataclass(frozen=True)
class LayerProfile:
    """One layer of a chain, per micro-batch (see the module docstring for each field)."""

    name: str
    forward_ms: float
    backward_ms: float
    activation_bytes: int
    static_bytes: int
    output_bytes: int
    kind: str = ""
    fixed_forward_ms: float = 0.0
    fixed_backward_ms: float = 0.0
    recompute_ms: Optional[float] = None
    checkpoint_forward_ms: float = 0.0
    fixed_recompute_ms: float = 0.0
    fixed_checkpoint_forward_ms: float = 0.0

    def __post_init__(self) -> None:
        where = f"layer {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"layer name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.kind, str):
            raise TypeError(f"{where}: kind must be a str, got {type(self.kind).__name__}")
        for key in _TIME_FIELDS:
            ms = check_finite_non_negative(key, getattr(self, key), where)
            if ms > MAX_LAYER_MS:
                raise ValueError(f"{where}: {key} must be at most {MAX_LAYER_MS:g} ms, got {ms!r}")
            object.__setattr__(self, key, ms)
        for key, total in zip(_FIXED_FIELDS, _TIME_FIELDS):
            ms = check_finite_non_negative(key, getattr(self, key), where)
            if ms > getattr(self, total):
                raise ValueError(f"{where}: {key} must be at most {total} ({getattr(self, total)!r}), got {ms!r}")
            object.__setattr__(self, key, ms)
        for key in _BYTE_FIELDS:
            object.__setattr__(self, key, _check_bytes(where, key, getattr(self, key)))
        self._check_recompute(where)

    def _check_recompute(self, where: str) -> None:
        for key in _RECOMPUTE_FIELDS:
            if key == "recompute_ms" and self.recompute_ms is None:
                continue
            ms = check_finite_non_negative(key, getattr(self, key), where)
            if ms > MAX_LAYER_MS:
                raise ValueError(f"{where}: {key} must be at most {MAX_LAYER_MS:g} ms, got {ms!r}")
            object.__setattr__(self, key, ms)
        if self.recompute_ms is None and self.fixed_recompute_ms:
            raise ValueError(f"{where}: fixed_recompute_ms needs recompute_ms (without it, fixed_forward_ms stands)")
        for key, total in (
            ("fixed_recompute_ms", "recompute_ms"),
            ("fixed_checkpoint_forward_ms", "checkpoint_forward_ms"),
        ):
            bound = getattr(self, total)
            if bound is not None and getattr(self, key) > bound:
                raise ValueError(f"{where}: {key} must be at most {total} ({bound!r}), got {getattr(self, key)!r}")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "activation_bytes": self.activation_bytes,
            "static_bytes": self.static_bytes,
            "output_bytes": self.output_bytes,
        }
        if self.kind:
            out["kind"] = self.kind
        if self.recompute_ms is not None:  # even 0: measured as nothing is not the default (the forward time)
            out["recompute_ms"] = self.recompute_ms
        for key in _FIXED_FIELDS + _RECOMPUTE_FIELDS[1:]:
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class ModelProfile:
    """A model as a chain of ``LayerProfile`` s, per micro-batch; the input of layer ``i`` is the output of
    layer ``i - 1`` and the input of layer 0 has ``input_bytes`` bytes."""

    layers: tuple[LayerProfile, ...]
    input_bytes: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not layers:
            raise ValueError("profile: layers must not be empty")
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerProfile):
                raise TypeError(f"profile: layers[{i}] must be a LayerProfile, got {type(layer).__name__}")
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"profile: layer name {dup!r} appears more than once")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "input_bytes", _check_bytes("profile", "input_bytes", self.input_bytes))
        object.__setattr__(self, "meta", dict(self.meta))

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def _column(self, key: str) -> np.ndarray:
        return np.array([getattr(layer, key) for layer in self.layers], dtype=np.float64)

    @property
    def forward_ms(self) -> np.ndarray:
        """(L,) float64."""
        return self._column("forward_ms")

    @property
    def backward_ms(self) -> np.ndarray:
        """(L,) float64."""
        return self._column("backward_ms")

    @property
    def fixed_forward_ms(self) -> np.ndarray:
        """(L,) float64: the part of each forward that does not grow with the micro-batch."""
        return self._column("fixed_forward_ms")

    @property
    def fixed_backward_ms(self) -> np.ndarray:
        """(L,) float64: the part of each backward that does not grow with the micro-batch."""
        return self._column("fixed_backward_ms")

    @property
    def recompute_ms(self) -> np.ndarray:
        """(L,) float64: what recomputing each layer adds to its backward pass (``forward_ms`` where not
        measured)."""
        return np.array([_recompute_cost(layer)[0] for layer in self.layers], dtype=np.float64)

    @property
    def fixed_recompute_ms(self) -> np.ndarray:
        """(L,) float64: the part of ``recompute_ms`` that does not grow with the micro-batch."""
        return np.array([_recompute_cost(layer)[1] for layer in self.layers], dtype=np.float64)

    @property
    def checkpoint_forward_ms(self) -> np.ndarray:
        """(L,) float64: what recomputing each layer adds to its forward pass (0 where not measured)."""
        return self._column("checkpoint_forward_ms")

    @property
    def fixed_checkpoint_forward_ms(self) -> np.ndarray:
        """(L,) float64: the part of ``checkpoint_forward_ms`` that does not grow with the micro-batch."""
        return self._column("fixed_checkpoint_forward_ms")

    @property
    def activation_bytes(self) -> np.ndarray:
        """(L,) float64 (byte counts; exact below 2**53)."""
        return self._column("activation_bytes")

    @property
    def static_bytes(self) -> np.ndarray:
        """(L,) float64."""
        return self._column("static_bytes")

    @property
    def output_bytes(self) -> np.ndarray:
        """(L,) float64."""
        return self._column("output_bytes")

    @property
    def input_bytes_per_layer(self) -> np.ndarray:
        """(L,) float64: what each layer keeps when it is recomputed (its input)."""
        out = self.output_bytes
        return np.concatenate([[float(self.input_bytes)], out[:-1]])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input_bytes": self.input_bytes, "layers": [layer.to_dict() for layer in self.layers]}
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "profile") -> ModelProfile:
        """Builds a profile from its JSON form; a missing or bad field raises ``ValueError`` naming ``source``
        and the layer index."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: expected a JSON object with 'layers', got {type(data).__name__}")
        rows = data.get("layers")
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{source}: 'layers' must be a non-empty list")
        layers = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ValueError(f"{source}: layers[{i}] must be an object, got {type(row).__name__}")
            missing = [key for key in PROFILE_FIELDS if key not in row]
            if missing:
                raise ValueError(
                    f"{source}: layers[{i}] misses {', '.join(missing)} (each layer needs {', '.join(PROFILE_FIELDS)})"
                )
            try:
                layers.append(
                    LayerProfile(
                        name=row["name"],
                        forward_ms=row["forward_ms"],
                        backward_ms=row["backward_ms"],
                        activation_bytes=row["activation_bytes"],
                        static_bytes=row["static_bytes"],
                        output_bytes=row["output_bytes"],
                        kind=row.get("kind", ""),
                        fixed_forward_ms=row.get("fixed_forward_ms", 0.0),
                        fixed_backward_ms=row.get("fixed_backward_ms", 0.0),
                        recompute_ms=row.get("recompute_ms"),
                        checkpoint_forward_ms=row.get("checkpoint_forward_ms", 0.0),
                        fixed_recompute_ms=row.get("fixed_recompute_ms", 0.0),
                        fixed_checkpoint_forward_ms=row.get("fixed_checkpoint_forward_ms", 0.0),
                    )
                )
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{source}: layers[{i}]: {exc}") from None
        meta = data.get("meta", {})
        if not isinstance(meta, Mapping):
            raise ValueError(f"{source}: 'meta' must be an object")
        try:
            return cls(tuple(layers), input_bytes=data.get("input_bytes", 0), meta=meta)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    def save(self, path: Union[str, Path]) -> Path:
        """Writes the JSON form atomically (temporary file, fsync, then rename)."""
        from .._files import atomic_write

        path = Path(path)
        with atomic_write(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path


def load_profile(path: Union[str, Path]) -> ModelProfile:
    """Reads a JSON profile (schema in the module docstring); errors name the file and the layer index."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"profile file not found: {path}")
    return ModelProfile.from_dict(read_json(path), source=str(path))


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; invalid JSON is a ``ValueError`` naming the file."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def as_profile(profile: Union[ModelProfile, Mapping[str, Any], Sequence[LayerProfile]]) -> ModelProfile:
    """A ``ModelProfile`` from a profile, its dict form, or a sequence of layers."""
    if isinstance(profile, ModelProfile):
        return profile
    if isinstance(profile, Mapping):
        return ModelProfile.from_dict(profile)
    if isinstance(profile, (list, tuple)):
        return ModelProfile(tuple(profile))
    raise TypeError(f"profile must be a ModelProfile, a dict or a list of LayerProfile, got {type(profile).__name__}")
