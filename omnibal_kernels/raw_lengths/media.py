"""Image sizes and video frame counts from file headers, without decoding pixels.

Images: ``PIL.Image.open`` parses only the header; ``.size`` is read and the file is closed (no ``load()``).
Videos: frame count, frame size and frame rate come from the reference's own metadata (``num_frames`` /
``nframes``, ``width``, ``height``, ``fps``) when given, else from the container header through PyAV
(``pip install av``); a list of frames counts its frames and reads each frame's header. Given sizes, frame
counts and frame rates must be positive finite numbers (sizes and counts integral).
"""

from __future__ import annotations

import base64
import io
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["MediaError", "VideoInfo", "image_size", "pil_pixel_limit", "video_info"]

_EXIF_ORIENTATION = 0x0112
# EXIF orientations 5-8 rotate by 90 or 270 degrees: exif_transpose swaps width and height.
_SWAPPING_ORIENTATIONS = (5, 6, 7, 8)


class MediaError(ValueError):
    """An image or video that cannot be measured or that the counting refuses; ``kind`` is one of
    :data:`~omnibal_kernels.raw_lengths.issues.ISSUE_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple:
        return (MediaError, (self.kind, str(self)))


class VideoInfo(NamedTuple):
    """What the counting needs of one video."""

    num_frames: int
    width: int
    height: int
    fps: Optional[float]


def _resolve(ref: str, root: Optional[Path]) -> Path:
    if ref.startswith("file://"):
        ref = ref[len("file://") :]
    path = Path(ref)
    if not path.is_absolute() and root is not None:
        path = root / path
    return path


def _open_source(ref: Any, root: Optional[Path]) -> tuple[Any, str]:
    """A file name or byte stream PIL / PyAV can open, and a name for messages."""
    if isinstance(ref, Mapping):
        if ref.get("bytes") is not None:
            return io.BytesIO(ref["bytes"]), str(ref.get("path") or "<bytes>")
        for key in ("path", "image", "video", "url"):
            if isinstance(ref.get(key), (str, os.PathLike)):
                return _open_source(ref[key], root)
        raise MediaError("unreadable_media", f"media reference {dict(ref)!r} has no path, bytes or size")
    if isinstance(ref, (bytes, bytearray)):
        return io.BytesIO(ref), "<bytes>"
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    if not isinstance(ref, str):
        raise MediaError("unreadable_media", f"media reference of type {type(ref).__name__} is not a path")
    if ref.startswith("data:"):
        try:
            payload = ref.split(",", 1)[1]
            return io.BytesIO(base64.b64decode(payload)), "<data URL>"
        except (IndexError, ValueError) as exc:
            raise MediaError("unreadable_media", f"bad data URL ({exc})") from exc
    if ref.startswith(("http://", "https://")):
        raise MediaError("unreadable_media", f"{ref}: remote media are not fetched; download them first")
    path = _resolve(ref, root)
    if not path.is_file():
        raise MediaError("missing_media", f"{path}: no such file")
    return str(path), str(path)


def _positive_int(value: Any, what: str) -> int:
    """``value`` as a positive int: a ``TypeError`` for what is no number (a bad record), a ``bad_media_size``
    MediaError for a number that is no positive integer (NaN, infinities, fractions, zero, negatives)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} = {value!r} is not a number")
    if not (isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())) or value <= 0:
        raise MediaError("bad_media_size", f"{what} = {value!r} is not a positive integer")
    return int(value) if isinstance(value, numbers.Integral) else int(float(value))


def _fps(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"video fps = {value!r} is not a number")
    if not math.isfinite(value) or value <= 0:
        raise MediaError("bad_media_size", f"video fps = {value!r} is not a positive finite number")
    return float(value)


def _given_size(ref: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    w, h = ref.get("width"), ref.get("height")
    if w is None or h is None:
        return None
    return _positive_int(w, "media width"), _positive_int(h, "media height")


def pil_pixel_limit() -> Optional[int]:
    """Pixels above which ``PIL.Image.open`` refuses an image (``DecompressionBombError``): twice
    ``PIL.Image.MAX_IMAGE_PIXELS``, read now; None when PIL's check is switched off."""
    from PIL import Image

    return None if Image.MAX_IMAGE_PIXELS is None else 2 * int(Image.MAX_IMAGE_PIXELS)


def image_size(ref: Any, root: Optional[Path] = None, exif_transpose: bool = False) -> tuple[int, int]:
    """``(width, height)`` of one image from its header.

    Args:
        ref: see the module docstring.
        root: folder that relative paths are taken from.
        exif_transpose: swap width and height when the EXIF orientation rotates the image by 90 degrees, as
            transformers' ``load_image`` does (InternVL's and qwen-vl-utils' own loaders do not).

    Raises:
        MediaError: ``missing_media`` for a missing file, ``unreadable_media`` for one PIL cannot identify,
            ``over_max_image_pixels`` for one PIL refuses as too large (:func:`pil_pixel_limit`),
            ``bad_media_size`` for given sizes that are not positive integers.
    """
    from PIL import Image

    if isinstance(ref, Image.Image):
        w, h = ref.size
        orientation = ref.getexif().get(_EXIF_ORIENTATION) if exif_transpose else None
        return (h, w) if orientation in _SWAPPING_ORIENTATIONS else (w, h)
    if isinstance(ref, Mapping):
        given = _given_size(ref)
        if given is not None:
            return given
    source, name = _open_source(ref, root)
    try:
        with Image.open(source) as im:
            w, h = im.size
            orientation = im.getexif().get(_EXIF_ORIENTATION) if exif_transpose else None
    except FileNotFoundError as exc:
        raise MediaError("missing_media", f"{name}: no such file") from exc
    except Image.DecompressionBombError as exc:
        raise MediaError(
            "over_max_image_pixels",
            f"{name}: PIL refuses to open it ({exc} Raise PIL.Image.MAX_IMAGE_PIXELS to count such images)",
        ) from exc
    except Exception as exc:  # PIL's format plugins raise many error types on a damaged header: all unreadable
        raise MediaError("unreadable_media", f"{name}: not a readable image ({type(exc).__name__}: {exc})") from exc
    return (h, w) if orientation in _SWAPPING_ORIENTATIONS else (w, h)


def _frames_of(ref: Mapping[str, Any]) -> Optional[int]:
    for key in ("num_frames", "nframes", "frames", "total_num_frames"):
        value = ref.get(key)
        if value is not None and not isinstance(value, (list, tuple)):
            return _positive_int(value, f"video {key}")
    return None


def _pyav_info(source: Any, name: str) -> VideoInfo:
    try:
        import av
    except ImportError as exc:
        raise MediaError(
            "unreadable_media",
            f"{name}: reading a video's frame count needs PyAV (pip install av), "
            "or give num_frames, width and height in the record",
        ) from exc
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise MediaError("unreadable_media", f"{name}: no video stream")
            stream = container.streams.video[0]
            frames = int(stream.frames or 0)
            if frames <= 0:
                # Some containers do not store the count: count the packets, still without decoding.
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            rate = stream.average_rate or stream.guessed_rate
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
    except MediaError:
        raise
    except FileNotFoundError as exc:
        raise MediaError("missing_media", f"{name}: no such file") from exc
    except Exception as exc:  # PyAV raises its own error types (av.error.*), all of them "unreadable" here
        raise MediaError("unreadable_media", f"{name}: not a readable video ({exc})") from exc
    if frames <= 0 or width <= 0 or height <= 0:
        raise MediaError("unreadable_media", f"{name}: the video header gives {frames} frames of {width}x{height}")
    return VideoInfo(frames, width, height, float(rate) if rate else None)


def video_info(ref: Any, root: Optional[Path] = None) -> VideoInfo:
    """Frames, frame size and frame rate of one video (see the module docstring for the sources).

    Raises:
        MediaError: a missing or unreadable file, no PyAV and no metadata, frames of different sizes.
    """
    if isinstance(ref, (list, tuple)):
        if not ref:
            raise MediaError("bad_media_size", "a video given as a list of frames has no frame")
        sizes = {image_size(frame, root) for frame in ref}
        if len(sizes) != 1:
            raise MediaError("bad_media_size", f"the frames of a video differ in size: {sorted(sizes)}")
        ((w, h),) = sizes
        return VideoInfo(len(ref), w, h, None)
    if isinstance(ref, Mapping):
        frames_list = ref.get("frames")
        if isinstance(frames_list, (list, tuple)):
            return video_info(list(frames_list), root)
        frames = _frames_of(ref)
        size = _given_size(ref)
        fps = _fps(ref.get("fps"))
        if frames is not None and size is not None:
            return VideoInfo(frames, size[0], size[1], fps)
        source, name = _open_source(ref, root)
        info = _pyav_info(source, name)
        return VideoInfo(
            frames or info.num_frames, *(size or (info.width, info.height)), info.fps if fps is None else fps
        )
    source, name = _open_source(ref, root)
    return _pyav_info(source, name)
