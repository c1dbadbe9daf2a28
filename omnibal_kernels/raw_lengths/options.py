"""How samples of a raw data set are counted: ``CountOptions``, one frozen object, checked once.

Everything the counted loads depend on is here (the model family, where media lie, the bounds and the error
policy); how a run is carried out (worker processes, chunks, shards, a work folder, a progress bar) is given
to :func:`~omnibal_kernels.raw_lengths.lengths_from_raw` beside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .._checks import check_positive_int
from .issues import ON_ERROR
from .spec import MODELS

__all__ = ["DEFAULT_MAX_FRAMES", "CountOptions"]

# Frames one sample's videos may give the model. InternVL's text grows by one "FrameN: <img></img>" line a
# frame, so memory grows with the count; over ten times the 768-frame cap of Qwen2-VL's video sampling, the
# bound keeps every frame count a model trains on (and .tokens tokenizes a chunk's texts in bounded batches).
DEFAULT_MAX_FRAMES = 8192


@dataclass(frozen=True)
class CountOptions:
    """How every sample of a raw data set is counted. Checked when built: a wrong type is a ``TypeError``, a
    wrong value a ``ValueError``, naming the field.

    Attributes:
        model: ``"internvl"``, ``"qwen2vl"`` or ``"qwen2.5vl"``.
        image_root: folder that relative image and video paths are taken from (default: as given).
        max_length: samples with more LLM tokens are a problem of kind ``over_max_length``.
        on_error: ``"error"`` raises :class:`~omnibal_kernels.raw_lengths.SampleError` (a ``ValueError``
            naming the sample and kind) at the first problem; ``"skip"`` leaves every problem sample out;
            ``"report"`` keeps the samples whose loads are still defined (``placeholder_mismatch``,
            ``over_max_length``) and leaves out the others. Every problem is listed in ``issues`` either way.
        trust_remote_code: passed to ``AutoTokenizer.from_pretrained`` (InternVL-Chat checkpoints need it).
        add_special_tokens: whether the tokenizer adds its special tokens (BOS/EOS) to the rendered chat; None
            (default) as a processor's ``apply_chat_template(tokenize=True)``: added unless the chat already
            starts with the BOS token.
        exif_transpose: swap width and height of images whose EXIF orientation rotates them by 90 degrees.
        overrides: model settings to replace after reading the folder (``ModelSpec`` field names, e.g.
            ``{"max_num": 6}`` for an InternVL run trained with ``max_dynamic_patch=6``).
        max_frames: a sample whose videos give the model more frames (after the video processor's sampling)
            is a problem of kind ``over_max_frames``; bounds the memory of InternVL's per-frame text. None: no
            bound.
        max_image_pixels: an image or video frame with more pixels is a problem of kind
            ``over_max_image_pixels``. None (default): PIL's own limit, above which ``PIL.Image.open`` refuses
            the image as a decompression bomb (``2 * PIL.Image.MAX_IMAGE_PIXELS``; none when that is None).
            Image files over PIL's limit are refused by PIL whatever this bound is.
        labels: count each sample's label tokens (:attr:`~omnibal_kernels.raw_lengths.RawLengths.label`): the
            tokens its chat template marks for training with ``{% generation %}`` blocks (image tokens of a
            placeholder inside one included), the first token left out, as the causal loss counts labels after
            packing. None (default): when the template has such marks (and the tokenizer is a fast one, which
            gives token offsets); True: they must be counted (a ``ValueError`` when they cannot); False: not
            counted.
    """

    model: str
    image_root: Union[str, Path, None] = None
    max_length: Optional[int] = None
    on_error: str = "error"
    trust_remote_code: bool = False
    add_special_tokens: Optional[bool] = None
    exif_transpose: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    max_frames: Optional[int] = DEFAULT_MAX_FRAMES
    max_image_pixels: Optional[int] = None
    labels: Optional[bool] = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        for name in ("trust_remote_code", "exif_transpose"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("add_special_tokens", "labels"):
            if getattr(self, name) not in (None, True, False):
                raise TypeError(f"{name} must be None, True or False, got {getattr(self, name)!r}")
        for name in ("max_length", "max_frames", "max_image_pixels"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        if self.image_root is not None:
            if not isinstance(self.image_root, (str, Path)):
                raise TypeError(f"image_root must be a path or None, got {type(self.image_root).__name__}")
            object.__setattr__(self, "image_root", str(self.image_root))
        if self.overrides is None:
            object.__setattr__(self, "overrides", {})
        elif not isinstance(self.overrides, dict):
            raise TypeError(f"overrides must be a dict of ModelSpec fields, got {type(self.overrides).__name__}")

    def replace(self, **changes: Any) -> CountOptions:
        """A copy with ``changes`` (fields of ``CountOptions``), checked again."""
        return dataclasses.replace(self, **changes)
