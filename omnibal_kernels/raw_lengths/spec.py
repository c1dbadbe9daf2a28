"""How one model turns images, videos and chat text into ViT load and LLM tokens, read from its saved folder.

:func:`load_model_spec` reads the settings a model's processor would use from the folder that
``save_pretrained`` wrote (the model's or the processor's), with no network and no torchvision:

* Qwen2-VL / Qwen2.5-VL: ``preprocessor_config.json`` (``min_pixels`` / ``max_pixels`` or ``size``
  ``{"shortest_edge", "longest_edge"}``, ``patch_size``, ``merge_size``, ``temporal_patch_size``) for images and
  ``video_preprocessor_config.json`` for videos (its own pixel bounds, frame sampling); the same precedence as
  transformers' ``Qwen2VLImageProcessor``: an explicit ``min_pixels`` / ``max_pixels`` wins over ``size``.
* InternVL in transformers (``GotOcr2ImageProcessor`` in ``preprocessor_config.json``): ``crop_to_patches``,
  ``min_patches``, ``max_patches``, ``size``; ``image_seq_length`` from ``processor_config.json``; the image
  tokens from the tokenizer (``start_image_token``, ``context_image_token``, ...); video frame sampling from
  ``video_preprocessor_config.json`` (each kept frame is one tile).
* InternVL-Chat (remote-code checkpoints, ``config.json``): ``min_dynamic_patch``, ``max_dynamic_patch``,
  ``use_thumbnail``, ``dynamic_image_size``, ``force_image_size``, ``downsample_ratio`` and the vision
  tower's ``patch_size``, from which ``num_image_token = (image_size // patch_size)**2 * downsample_ratio**2``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

__all__ = ["MODELS", "ModelSpec", "load_model_spec"]

MODELS = ("internvl", "qwen2vl", "qwen2.5vl")

# transformers' class defaults, used when a saved config leaves a key out.
_QWEN_IMAGE_DEFAULTS = dict(
    min_pixels=56 * 56, max_pixels=28 * 28 * 1280, patch_size=14, merge_size=2, temporal_patch_size=2
)
_QWEN_VIDEO_DEFAULTS = dict(
    min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768, patch_size=14, merge_size=2, temporal_patch_size=2
)


@dataclass(frozen=True)
class VideoSampling:
    """Frame sampling of a video processor (``do_sample_frames`` and its ``fps`` / ``num_frames``)."""

    do_sample_frames: bool = False
    fps: Optional[float] = None
    num_frames: Optional[int] = None
    min_frames: int = 4
    max_frames: int = 768
    initial_shift: Any = True
    """InternVL's first sampled frame: True for half a step, else a frame offset"""

    def uniform_frames(self, total_frames: int, video_fps: Optional[float]) -> int:
        """Frames InternVL's video processor keeps: ``arange(initial_shift, total, total / n)`` for ``n``
        frames, ``n`` from ``num_frames`` or ``total / video_fps * fps``."""
        if not self.do_sample_frames:
            return total_frames
        n = self.num_frames
        if n is None and self.fps is not None:
            if not video_fps:
                raise ValueError(
                    "the video processor samples frames by fps, but the video's frame rate is unknown "
                    "(give 'fps' in the record or install PyAV)"
                )
            n = int(total_frames / video_fps * self.fps)
        if n is None or n <= 0:
            raise ValueError(f"the video processor samples {n} frames (set num_frames or fps in its config)")
        if n > total_frames:
            raise ValueError(f"the video processor samples {n} frames but the video has only {total_frames}")
        step = total_frames / n
        shift = step / 2 if self.initial_shift is True else float(self.initial_shift or 0)
        return max(0, math.ceil((total_frames - shift) / step))

    def frames(self, total_frames: int, video_fps: Optional[float], temporal_patch_size: int) -> int:
        """Frames the processor keeps of a video of ``total_frames`` (transformers' ``sample_frames``)."""
        if not self.do_sample_frames:
            return total_frames
        if self.num_frames is not None:
            n: float = round(self.num_frames / temporal_patch_size) * temporal_patch_size
        elif self.fps is not None:
            if not video_fps:
                raise ValueError(
                    "the video processor samples frames by fps, but the video's frame rate is unknown "
                    "(give 'fps' in the record or install PyAV)"
                )
            top = math.floor(min(self.max_frames, total_frames) / temporal_patch_size) * temporal_patch_size
            n = min(max(total_frames / video_fps * self.fps, self.min_frames), top, total_frames)
            n = math.floor(n / temporal_patch_size) * temporal_patch_size
        else:
            return total_frames
        if n > total_frames:
            raise ValueError(f"the video processor samples {n} frames but the video has only {total_frames}")
        if n <= 0:
            raise ValueError(f"the video processor samples no frame of a {total_frames}-frame video")
        return int(n)


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to count one sample's loads for one model, as its processor would.

    ``image_marker`` / ``video_marker`` are the strings that stand for one image / video in the rendered chat
    text (what the processor looks for and expands); ``inline_image`` / ``inline_video`` replace a data set's
    ``<image>`` / ``<video>`` placeholders when the chat template takes text only.
    """

    model: str
    image_marker: str
    video_marker: str
    inline_image: str
    inline_video: str
    # Qwen2-VL family (image side; video side in video_*)
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_patch_size: int = 14
    video_merge_size: int = 2
    video_temporal_patch_size: int = 2
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 28 * 28 * 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    sampling: VideoSampling = field(default_factory=VideoSampling)
    # InternVL family
    min_num: int = 1
    max_num: int = 12
    image_size: int = 448
    use_thumbnail: bool = True
    dynamic: bool = True
    num_image_token: int = 256
    start_image_token: str = "<img>"
    end_image_token: str = "</img>"
    context_image_token: str = "<IMG_CONTEXT>"
    source: str = ""
    """the config files the settings came from"""

    @property
    def family(self) -> str:
        """``"internvl"`` or ``"qwen2vl"`` (Qwen2.5-VL counts like Qwen2-VL)."""
        return "internvl" if self.model == "internvl" else "qwen2vl"

    def with_overrides(self, **overrides: Any) -> ModelSpec:
        """A copy with some settings replaced (None values are ignored); unknown names are a ValueError."""
        names = {f.name for f in fields(self)} - {"model", "source"}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"overrides: unknown model settings {unknown}; known: {sorted(names)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _read_json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _int(cfg: Mapping[str, Any], key: str, default: int, path: Path) -> int:
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    return int(value)


def _pixels(cfg: Mapping[str, Any], defaults: Mapping[str, int], path: Path) -> tuple[int, int]:
    # Qwen2VLImageProcessor.__init__: size defaults, then explicit min_pixels / max_pixels override it.
    size = cfg.get("size") or {}
    lo = size.get("shortest_edge", size.get("min_pixels", defaults["min_pixels"]))
    hi = size.get("longest_edge", size.get("max_pixels", defaults["max_pixels"]))
    merged = {"min_pixels": lo, "max_pixels": hi}
    for key in ("min_pixels", "max_pixels"):
        if cfg.get(key) is not None:
            merged[key] = cfg[key]
    return _int(merged, "min_pixels", 0, path), _int(merged, "max_pixels", 0, path)


def _qwen_spec(folder: Path, model: str) -> ModelSpec:
    ip_path = folder / "preprocessor_config.json"
    ip = _read_json(ip_path)
    if ip is None:
        raise ValueError(
            f"{folder}: no preprocessor_config.json (the {model} image processor's settings); "
            "save the processor with save_pretrained into this folder"
        )
    vp_path = folder / "video_preprocessor_config.json"
    vp = _read_json(vp_path)
    if ip.get("do_resize") is False:
        raise ValueError(
            f"{ip_path}: do_resize is false; counting follows smart_resize, which such a processor "
            "skips (images must then already be multiples of the patch grid)"
        )
    sources = [ip_path.name]
    min_px, max_px = _pixels(ip, _QWEN_IMAGE_DEFAULTS, ip_path)
    if vp is None:
        # Without a saved video processor, transformers builds one with its class defaults.
        vp, vp_path = {}, folder / "(video processor defaults)"
    else:
        sources.append(vp_path.name)
    v_min, v_max = _pixels(vp, _QWEN_VIDEO_DEFAULTS, vp_path)
    fps = vp.get("fps")
    num_frames = vp.get("num_frames")
    sampling = VideoSampling(
        do_sample_frames=bool(vp.get("do_sample_frames", False)),
        fps=None if fps is None else float(fps),
        num_frames=None if num_frames is None else _int(vp, "num_frames", 1, vp_path),
        min_frames=_int(vp, "min_frames", 4, vp_path),
        max_frames=_int(vp, "max_frames", 768, vp_path),
    )
    return ModelSpec(
        model=model,
        image_marker="<|image_pad|>",
        video_marker="<|video_pad|>",
        inline_image="<|vision_start|><|image_pad|><|vision_end|>",
        inline_video="<|vision_start|><|video_pad|><|vision_end|>",
        patch_size=_int(ip, "patch_size", 14, ip_path),
        merge_size=_int(ip, "merge_size", 2, ip_path),
        temporal_patch_size=_int(ip, "temporal_patch_size", 2, ip_path),
        min_pixels=min_px,
        max_pixels=max_px,
        video_patch_size=_int(vp, "patch_size", 14, vp_path),
        video_merge_size=_int(vp, "merge_size", 2, vp_path),
        video_temporal_patch_size=_int(vp, "temporal_patch_size", 2, vp_path),
        video_min_pixels=v_min,
        video_max_pixels=v_max,
        cap_pixels_per_frame=bool(vp.get("cap_pixels_per_frame") or False),
        max_video_tokens=_int(vp, "max_video_tokens", 128000, vp_path),
        sampling=sampling,
        source=", ".join(sources),
    )


def _internvl_spec(folder: Path, tokenizer: Any) -> ModelSpec:
    ip_path = folder / "preprocessor_config.json"
    ip = _read_json(ip_path)
    tokens = {
        name: getattr(tokenizer, name, None)
        for name in ("start_image_token", "end_image_token", "context_image_token", "video_token")
    }
    if ip is not None and "GotOcr2" in str(ip.get("image_processor_type", "")):
        # transformers' InternVL: GotOcr2 tiling and InternVLProcessor's expansion of <IMG_CONTEXT>.
        pc_path = folder / "processor_config.json"
        pc = _read_json(pc_path) or {}
        size = ip.get("size") or {}
        height = _int(size, "height", 384, ip_path)
        width = _int(size, "width", 384, ip_path)
        if height != width:
            raise ValueError(f"{ip_path}: InternVL tiles must be square, got size {size}")
        context = tokens["context_image_token"] or "<IMG_CONTEXT>"
        vp_path = folder / "video_preprocessor_config.json"
        vp = _read_json(vp_path) or {}
        fps, num_frames = vp.get("fps"), vp.get("num_frames")
        sampling = VideoSampling(
            do_sample_frames=bool(vp.get("do_sample_frames", False)),
            fps=None if fps is None else float(fps),
            num_frames=None if num_frames is None else _int(vp, "num_frames", 1, vp_path),
            initial_shift=vp.get("initial_shift", True),
        )
        crop = bool(ip.get("crop_to_patches", False))
        max_num = _int(ip, "max_patches", 12, ip_path)
        return ModelSpec(
            model="internvl",
            image_marker=context,
            video_marker=tokens["video_token"] or "<video>",
            inline_image=context,
            inline_video=tokens["video_token"] or "<video>",
            min_num=_int(ip, "min_patches", 1, ip_path),
            max_num=max_num,
            image_size=height,
            use_thumbnail=True,
            dynamic=crop and max_num > 1,
            num_image_token=_int(pc, "image_seq_length", 256, pc_path),
            start_image_token=tokens["start_image_token"] or "<img>",
            end_image_token=tokens["end_image_token"] or "</img>",
            context_image_token=context,
            sampling=sampling,
            source=", ".join([ip_path.name] + ([pc_path.name] if pc else []) + ([vp_path.name] if vp else [])),
        )
    cfg_path = folder / "config.json"
    cfg = _read_json(cfg_path)
    if cfg is None:
        raise ValueError(
            f"{folder}: neither a GotOcr2 preprocessor_config.json (transformers' InternVL) nor an "
            "InternVL-Chat config.json; cannot tell the tiling settings"
        )
    vision = cfg.get("vision_config") or {}
    image_size = _int(cfg, "force_image_size", _int(vision, "image_size", 448, cfg_path), cfg_path)
    patch = _int(vision, "patch_size", 14, cfg_path)
    ratio = float(cfg.get("downsample_ratio", 0.5))
    return ModelSpec(
        model="internvl",
        image_marker="<image>",
        video_marker="<video>",
        inline_image="<image>",
        inline_video="<video>",
        min_num=_int(cfg, "min_dynamic_patch", 1, cfg_path),
        max_num=_int(cfg, "max_dynamic_patch", 12, cfg_path),
        image_size=image_size,
        use_thumbnail=bool(cfg.get("use_thumbnail", True)),
        dynamic=bool(cfg.get("dynamic_image_size", True)),
        num_image_token=int((image_size // patch) ** 2 * ratio**2),
        start_image_token=tokens["start_image_token"] or "<img>",
        end_image_token=tokens["end_image_token"] or "</img>",
        context_image_token=tokens["context_image_token"] or "<IMG_CONTEXT>",
        source=cfg_path.name,
    )


def load_model_spec(folder: str | Path, model: str, tokenizer: Any = None) -> ModelSpec:
    """Read a model's image/video processor settings from the folder ``save_pretrained`` wrote.

    Args:
        folder: the model's or processor's folder (``preprocessor_config.json``, ``config.json``, ...).
        model: ``"internvl"``, ``"qwen2vl"`` or ``"qwen2.5vl"``.
        tokenizer: the loaded tokenizer; InternVL in transformers names its image tokens on it.

    Raises:
        ValueError: an unknown model, a missing folder or config file, or a setting that is not a positive int.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"tokenizer: {str(folder)!r} is not a folder saved by save_pretrained")
    if model == "internvl":
        return _internvl_spec(folder, tokenizer)
    return _qwen_spec(folder, model)
