"""Count one chunk of raw records: media headers, chat template, tokenizer, then the library's counting functions.

Per sample, as the model's processor would see it:

1. the record becomes chat messages (:mod:`.records`) and its media are measured from headers (:mod:`.media`),
   each checked against the processor's limits and the run's bounds (``max_image_pixels``, ``max_frames``);
2. the messages are rendered with the tokenizer's chat template and the placeholders counted against the
   media (:mod:`.chat`; a difference is reported);
3. each placeholder is expanded with no image tokens and the chunk's texts are tokenized in one batch call
   (:mod:`.tokens`);
4. the image tokens and the ViT load are added from the media sizes (:mod:`.loads`).

A sample that fails any step becomes one issue for its own index (:mod:`.issues`); the others are counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .._checks import MAX_IMAGE_SIDE, QWEN2VL_MAX_RATIO, check_positive_int
from ..lengths import Lengths
from .chat import ChatRenderer
from .issues import ON_ERROR, IssueLog
from .loads import media_loads, video_frames
from .media import MediaError, VideoInfo, image_size, video_info
from .records import RecordError, parse_record
from .spec import ModelSpec
from .tokens import TokenCounter

__all__ = ["DEFAULT_MAX_FRAMES", "ChunkCounter", "ChunkResult"]

# Frames one sample's videos may give the model. InternVL's text grows by one "FrameN: <img></img>" line a
# frame, so memory grows with the count; over ten times the 768-frame cap of Qwen2-VL's video sampling, the
# bound keeps every frame count a model trains on (and .tokens tokenizes a chunk's texts in bounded batches).
DEFAULT_MAX_FRAMES = 8192


@dataclass
class ChunkResult:
    """Loads of the kept samples of one chunk and the issues of all of its samples."""

    index: np.ndarray
    """``(K,)`` int64 global indices of the kept samples, increasing"""
    vit: np.ndarray
    llm: np.ndarray
    issues: list[dict] = field(default_factory=list)
    """``{"index", "kind", "message", "kept"}`` per problem, in sample order"""


@dataclass
class _Prepared:
    """One sample, measured and rendered, before tokenizing."""

    sizes: list[tuple[int, int]]
    videos: list[tuple[VideoInfo, int]]
    text: str
    pads: int
    """Qwen2-VL pad tokens kept once each in ``text`` (subtracted after tokenizing)"""
    mismatch: Optional[str]


def _bound(name: str, value: Any) -> Optional[int]:
    return None if value is None else check_positive_int(name, value)


class ChunkCounter:
    """Counts chunks of records for one model spec and tokenizer (one per worker process).

    ``max_image_pixels`` (None: no bound of its own) and ``max_frames`` bound each image's (and video
    frame's) pixels and the frames one sample's videos give the model; see :func:`lengths_from_raw`.
    """

    def __init__(self, spec: ModelSpec, tokenizer: Any, *, image_root: Optional[str | Path] = None,
                 max_length: Optional[int] = None, on_error: str = "error",
                 add_special_tokens: Optional[bool] = None, exif_transpose: bool = False,
                 max_frames: Optional[int] = DEFAULT_MAX_FRAMES, max_image_pixels: Optional[int] = None) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.max_length = _bound("max_length", max_length)
        self.max_frames = _bound("max_frames", max_frames)
        self.max_image_pixels = _bound("max_image_pixels", max_image_pixels)
        self.spec, self.on_error = spec, on_error
        self.root = None if image_root is None else Path(image_root)
        self.exif_transpose = exif_transpose
        self.chat = ChatRenderer(spec, tokenizer)
        self.tokens = TokenCounter(tokenizer, add_special_tokens)
        self.tokens.check_image_tokens(spec)

    def _check_size(self, w: int, h: int, what: str) -> None:
        if not (0 < w <= MAX_IMAGE_SIDE and 0 < h <= MAX_IMAGE_SIDE):
            raise MediaError("bad_media_size", f"{what} size {w}x{h} (width x height) is out of range")
        if self.max_image_pixels is not None and w * h > self.max_image_pixels:
            raise MediaError("over_max_image_pixels", f"{what} size {w}x{h} has {w * h:,} pixels, more than "
                             f"max_image_pixels {self.max_image_pixels:,}")
        if self.spec.family == "qwen2vl" and max(w, h) / min(w, h) > QWEN2VL_MAX_RATIO:
            raise MediaError("bad_media_size", f"{what} {w}x{h} has an aspect ratio above the processor's limit "
                             f"of {QWEN2VL_MAX_RATIO}")

    def _measure(self, images: list[Any], videos: list[Any]) -> tuple[list[tuple[int, int]],
                                                                      list[tuple[VideoInfo, int]]]:
        sizes = []
        for ref in images:
            w, h = image_size(ref, self.root, self.exif_transpose)
            self._check_size(w, h, "image")
            sizes.append((w, h))
        measured = []
        for ref in videos:
            info = video_info(ref, self.root)
            self._check_size(info.width, info.height, "video frame")
            try:
                measured.append((info, video_frames(self.spec, info)))
            except ValueError as exc:
                raise MediaError("bad_media_size", str(exc)) from exc
        frames = sum(f for _, f in measured)
        # Checked before any text is expanded: InternVL's text would grow with the frames.
        if self.max_frames is not None and frames > self.max_frames:
            raise MediaError("over_max_frames", f"the videos give the model {frames:,} frames, more than "
                             f"max_frames {self.max_frames:,}")
        return sizes, measured

    def _prepare(self, rec: Any, index: int) -> _Prepared:
        sample = parse_record(rec, index)
        sizes, videos = self._measure(sample.images, sample.videos)
        rendered = self.chat.render(sample)
        n_img, n_vid = self.chat.placeholders(rendered)
        mismatch = None
        if n_img != len(sizes) or n_vid != len(videos):
            mismatch = (f"{n_img} image and {n_vid} video placeholders in the rendered text for {len(sizes)} "
                        f"images and {len(videos)} videos")
        pads = n_img + n_vid if self.spec.family == "qwen2vl" else 0
        return _Prepared(sizes, videos, self.chat.expand(rendered, [f for _, f in videos]), pads, mismatch)

    def count(self, records: Sequence[Any], start: int) -> ChunkResult:
        """Count ``records``, whose first one is sample ``start`` of the data.

        Raises:
            SampleError: the first problem, under ``on_error="error"``.
        """
        log = IssueLog(self.on_error, start, len(records))
        prepared: list[Any] = [None] * len(records)  # a _Prepared for each sample that got that far
        for j, rec in enumerate(records):
            try:
                prepared[j] = p = self._prepare(rec, start + j)
            except RecordError as exc:
                log.note(j, exc.kind, str(exc).split(": ", 1)[-1])
                continue
            except MediaError as exc:
                log.note(j, exc.kind, str(exc))
                continue
            except (TypeError, ValueError) as exc:  # a field of the wrong type, e.g. a text that is a number
                log.note(j, "bad_record", f"{type(exc).__name__}: {exc}")
                continue
            if p.mismatch is not None:
                log.note(j, "placeholder_mismatch", p.mismatch)
        rows = np.flatnonzero(log.countable)
        text_tokens = self.tokens.many([prepared[j].text for j in rows]) - np.array(
            [prepared[j].pads for j in rows], dtype=np.int64)
        vit, llm = self._loads(log, rows, [prepared[j] for j in rows], text_tokens)
        if self.max_length is not None:
            for r in np.flatnonzero(llm > self.max_length):
                log.note(int(rows[r]), "over_max_length", f"{int(llm[r])} LLM tokens > max_length {self.max_length}")
        keep = log.countable[rows]
        return ChunkResult(rows[keep].astype(np.int64) + start, vit[keep], llm[keep], log.sorted())

    def _loads(self, log: IssueLog, rows: np.ndarray, samples: list[_Prepared],
               text_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Loads of the countable samples (in the range of a length file); a sample whose loads are not is
        noted as ``bad_media_size`` (its row then holds zeros and is not countable)."""
        try:
            return self._loads_of(samples, text_tokens)
        except ValueError:
            pass
        # One sample out of range fails the batch: count one by one, so that the issue names the right sample.
        vit = np.zeros(len(samples), dtype=np.int64)
        llm = np.zeros(len(samples), dtype=np.int64)
        for r, sample in enumerate(samples):
            try:
                (vit[r],), (llm[r],) = self._loads_of([sample], text_tokens[r:r + 1])
            except ValueError as exc:
                log.note(int(rows[r]), "bad_media_size", str(exc).split(": ", 1)[-1])
        return vit, llm

    def _loads_of(self, samples: list[_Prepared], text_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vit, llm = media_loads(self.spec, [s.sizes for s in samples], [s.videos for s in samples], text_tokens)
        checked = Lengths(vit, llm)  # the range a length file holds
        return checked.vit, checked.llm
