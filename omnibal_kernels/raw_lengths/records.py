"""Raw training records -> chat messages plus the images and videos they show, in order.

Accepted layouts (one record = one training sample):

* LLaVA / InternVL-Chat: ``{"image": "a.jpg" | [...], "conversations": [{"from": "human", "value":
  "<image>\\nWhat is it?"}, {"from": "gpt", "value": "..."}]}``; ``video`` / ``videos`` with ``<video>``
  placeholders the same way.
* ShareGPT / OpenAI style: ``{"messages": [{"role": "user", "content": ...}, ...]}`` where ``content`` is a
  string (``<image>`` / ``<video>`` placeholders, media in the record's ``images`` / ``videos``) or a list of
  parts ``{"type": "text", "text": ...}``, ``{"type": "image", "image": ref}``, ``{"type": "image_url",
  "image_url": {"url": ref}}``, ``{"type": "video", "video": ref}``. A part without a reference (as in
  Hugging Face data sets with an ``images`` column) takes the next one of the record's list.

A reference is a path (relative to the image root, ``file://`` allowed), a ``data:`` URL, a ``{"path",
"bytes"}`` mapping (``datasets.Image(decode=False)``), a ``PIL.Image``, or a mapping that already carries
``width`` / ``height`` (and, for videos, ``num_frames`` / ``fps``). A video may also be a list of frames.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["RawSample", "RecordError", "parse_record"]

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}
_PLACEHOLDER = re.compile(r"(<image>|<video>)")
_IMAGE_PARTS = ("image", "image_url", "input_image")
_VIDEO_PARTS = ("video", "video_url", "input_video")


class RecordError(ValueError):
    """A record that is not one of the accepted layouts (its ``kind`` is ``"bad_record"``)."""

    kind = "bad_record"


class RawSample(NamedTuple):
    """One record as chat parts: ``messages[i] = (role, parts)``, each part ``("text", str)``, ``("image", None)``
    or ``("video", None)``; ``images`` / ``videos`` are the references in the order their parts appear."""

    messages: list[tuple[str, list[tuple[str, Any]]]]
    images: list[Any]
    videos: list[Any]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


def _media_lists(rec: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    images = _as_list(rec.get("images")) or _as_list(rec.get("image"))
    videos = _as_list(rec.get("videos")) or _as_list(rec.get("video"))
    return images, videos


def _split_text(text: str) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = []
    for piece in _PLACEHOLDER.split(text):
        if piece == "<image>":
            parts.append(("image", None))
        elif piece == "<video>":
            parts.append(("video", None))
        elif piece:
            parts.append(("text", piece))
    return parts


_METADATA = ("width", "height", "num_frames", "nframes", "fps", "frames")


def _part_ref(part: Mapping[str, Any], kind: str) -> Any:
    """The part's media reference; the part itself when it also carries sizes or frame counts."""
    if any(part.get(key) is not None for key in _METADATA):
        return {key: value for key, value in part.items() if value is not None}
    keys = _IMAGE_PARTS if kind == "image" else _VIDEO_PARTS
    for key in keys:
        value = part.get(key)
        if isinstance(value, Mapping) and "url" in value:
            value = value["url"]
        if value is not None:
            return value
    for key in ("url", "path"):
        if part.get(key) is not None:
            return part[key]
    return None


def parse_record(rec: Any, index: int) -> RawSample:
    """Turn one raw record into a :class:`RawSample`.

    Raises:
        RecordError: not a mapping, no ``messages`` / ``conversations`` list, a turn without role or text, or
            more placeholders than the record has media (the message names the sample ``index``).
    """
    if isinstance(rec, RecordError):  # a line of the data file that did not parse
        raise rec
    if not isinstance(rec, Mapping):
        raise RecordError(f"sample {index}: a record must be a JSON object, got {type(rec).__name__}")
    turns = rec.get("messages")
    if turns is None:
        turns = rec.get("conversations")
    if not isinstance(turns, (list, tuple)) or not turns:
        raise RecordError(f"sample {index}: no 'messages' or 'conversations' list")
    pool = {"image": _media_lists(rec)[0], "video": _media_lists(rec)[1]}
    taken = {"image": 0, "video": 0}
    images: list[Any] = []
    videos: list[Any] = []
    messages: list[tuple[str, list[tuple[str, Any]]]] = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise RecordError(f"sample {index}: turn {t} is not an object")
        role = turn.get("role", turn.get("from"))
        if not isinstance(role, str):
            raise RecordError(f"sample {index}: turn {t} has no 'role' / 'from'")
        role = _ROLES.get(role.lower(), role)
        content = turn.get("content", turn.get("value"))
        if isinstance(content, str):
            parts = _split_text(content)
        elif isinstance(content, (list, tuple)):
            parts = []
            for p in content:
                if isinstance(p, str):
                    parts.extend(_split_text(p))
                    continue
                if not isinstance(p, Mapping):
                    raise RecordError(f"sample {index}: turn {t} has a content part that is not an object")
                kind = p.get("type")
                if kind in ("text", "input_text") or (kind is None and isinstance(p.get("text"), str)):
                    parts.extend(_split_text(p.get("text") or ""))
                elif kind in _IMAGE_PARTS or kind in _VIDEO_PARTS:
                    media = "image" if kind in _IMAGE_PARTS else "video"
                    ref = _part_ref(p, media)
                    if ref is None:
                        # a bare part refers to the next reference of the record's own list
                        parts.append((media, None))
                    else:
                        parts.append((media, ref))
                else:
                    raise RecordError(f"sample {index}: turn {t} has a content part of unknown type {kind!r}")
        elif content is None:
            parts = []
        else:
            raise RecordError(
                f"sample {index}: turn {t} content must be text or a list of parts, got {type(content).__name__}"
            )
        resolved: list[tuple[str, Any]] = []
        for kind, ref in parts:
            if kind == "text":
                resolved.append((kind, ref))
                continue
            if ref is None:
                if taken[kind] >= len(pool[kind]):
                    # Left for the placeholder check, which reports it with the other mismatches.
                    resolved.append((kind, None))
                    continue
                ref = pool[kind][taken[kind]]
                taken[kind] += 1
            (images if kind == "image" else videos).append(ref)
            resolved.append((kind, None))
        messages.append((role, resolved))
    # Media listed by the record but never placed keep their order after the placed ones, so that the
    # placeholder check sees them.
    images.extend(pool["image"][taken["image"] :])
    videos.extend(pool["video"][taken["video"] :])
    return RawSample(messages, images, videos)
