"""Count one chunk of raw records: media headers, chat template, tokenizer, then the library's counting functions.

Per sample, as the model's processor would see it:

1. the record becomes chat messages (:mod:`.records`) and its media are measured from headers (:mod:`.media`),
   each checked against the processor's limits and the run's bounds (``max_image_pixels``, ``max_frames``);
2. the messages are rendered with the tokenizer's chat template and the placeholders counted against the
   media (:mod:`.chat`; a difference is reported);
3. each placeholder is expanded with no image tokens and the chunk's texts are tokenized in one batch call
   (:mod:`.tokens`);
4. the image tokens, the ViT load and the ViT sequences are added from the media sizes (:mod:`.loads`).

Label tokens (``labels``): when the chat template marks what is trained (``{% generation %}`` blocks,
:mod:`.chat`), each sample's trained tokens are counted as the causal loss counts its labels: the tokens of the
model's input inside a marked span (image tokens of a placeholder inside one included), the first token left
out (packing masks every sample's first label). That is ``(labels != ignore_index)[1:].sum()`` for labels made
from transformers' ``return_assistant_tokens_mask``.

A sample that fails any step becomes one issue for its own index (:mod:`.issues`); the others are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .._checks import MAX_IMAGE_SIDE, QWEN2VL_MAX_RATIO
from .._csr import take_rows
from ..lengths import Lengths
from .chat import ChatRenderer, Expanded, marks_training
from .issues import IssueLog
from .loads import media_item_tokens, media_loads, sequence_rows, video_frames
from .media import MediaError, VideoInfo, image_size, video_info
from .options import CountOptions
from .records import RecordError, parse_record
from .spec import ModelSpec
from .tokens import TokenCounter

__all__ = ["ChunkCounter", "ChunkResult"]


@dataclass
class ChunkResult:
    """Loads of the kept samples of one chunk and the issues of all of its samples."""

    index: np.ndarray
    """``(K,)`` int64 global indices of the kept samples, increasing"""
    vit: np.ndarray
    llm: np.ndarray
    vit_seqlens: np.ndarray
    """``(S,)`` int64 ViT sequence lengths of the kept samples back to back"""
    vit_seqlens_offsets: np.ndarray
    """``(K + 1,)`` int64 from 0: kept sample ``k`` has ``vit_seqlens[offsets[k]:offsets[k + 1]]``"""
    label: Optional[np.ndarray] = None
    """``(K,)`` int64 trained label tokens (see the module docstring), or None when not counted"""
    issues: list[dict] = field(default_factory=list)
    """``{"index", "kind", "message", "kept"}`` per problem, in sample order"""


@dataclass
class _Prepared:
    """One sample, measured and rendered, before tokenizing."""

    sizes: list[tuple[int, int]]
    videos: list[tuple[VideoInfo, int]]
    text: Expanded
    pads: int
    """Qwen2-VL pad tokens kept once each in ``text`` (subtracted after tokenizing)"""
    mismatch: Optional[str]


class ChunkCounter:
    """Counts chunks of records for one model spec and tokenizer (one per worker process).

    ``options``: the :class:`~omnibal_kernels.raw_lengths.CountOptions` of the run (here ``max_image_pixels``
    None is no bound of its own: :func:`~omnibal_kernels.raw_lengths.lengths_from_raw` puts PIL's limit there);
    :attr:`labels` says whether label tokens are counted.
    """

    def __init__(self, spec: ModelSpec, tokenizer: Any, options: CountOptions) -> None:
        self.max_length = options.max_length
        self.max_frames = options.max_frames
        self.max_image_pixels = options.max_image_pixels
        self.spec, self.on_error = spec, options.on_error
        self.root = None if options.image_root is None else Path(options.image_root)
        self.exif_transpose = options.exif_transpose
        labels = options.labels
        self.chat = ChatRenderer(spec, tokenizer)
        self.tokens = TokenCounter(tokenizer, options.add_special_tokens)
        self.tokens.check_image_tokens(spec)
        marked, offsets = marks_training(tokenizer), self.tokens.can_mark
        if labels and not (marked and offsets):
            why = (
                "its chat template marks no text for training (put {% generation %} ... {% endgeneration %} "
                "around what the model learns, as transformers' return_assistant_tokens_mask reads it)"
                if not marked
                else "it gives no token offsets (a slow tokenizer)"
            )
            raise ValueError(f"tokenizer: label tokens cannot be counted: {why}")
        self.labels = bool(marked and offsets) if labels is None else labels
        """whether label tokens are counted"""

    def _check_size(self, w: int, h: int, what: str) -> None:
        if not (0 < w <= MAX_IMAGE_SIDE and 0 < h <= MAX_IMAGE_SIDE):
            raise MediaError("bad_media_size", f"{what} size {w}x{h} (width x height) is out of range")
        if self.max_image_pixels is not None and w * h > self.max_image_pixels:
            raise MediaError(
                "over_max_image_pixels",
                f"{what} size {w}x{h} has {w * h:,} pixels, more than max_image_pixels {self.max_image_pixels:,}",
            )
        if self.spec.family == "qwen2vl" and max(w, h) / min(w, h) > QWEN2VL_MAX_RATIO:
            raise MediaError(
                "bad_media_size",
                f"{what} {w}x{h} has an aspect ratio above the processor's limit of {QWEN2VL_MAX_RATIO}",
            )

    def _measure(
        self, images: list[Any], videos: list[Any]
    ) -> tuple[list[tuple[int, int]], list[tuple[VideoInfo, int]]]:
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
            raise MediaError(
                "over_max_frames",
                f"the videos give the model {frames:,} frames, more than max_frames {self.max_frames:,}",
            )
        return sizes, measured

    def _prepare(self, rec: Any, index: int) -> _Prepared:
        sample = parse_record(rec, index)
        sizes, videos = self._measure(sample.images, sample.videos)
        rendered, spans = self.chat.render_marked(sample) if self.labels else (self.chat.render(sample), [])
        n_img, n_vid = self.chat.placeholders(rendered)
        mismatch = None
        if n_img != len(sizes) or n_vid != len(videos):
            mismatch = (
                f"{n_img} image and {n_vid} video placeholders in the rendered text for {len(sizes)} "
                f"images and {len(videos)} videos"
            )
        pads = n_img + n_vid if self.spec.family == "qwen2vl" else 0
        return _Prepared(sizes, videos, self.chat.expand(rendered, [f for _, f in videos], spans), pads, mismatch)

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
        samples = [prepared[j] for j in rows]
        texts = [p.text.text for p in samples]
        pads = np.array([p.pads for p in samples], dtype=np.int64)
        if self.labels:
            tokens, marked = self.tokens.many_marked(texts, [p.text.spans for p in samples])
        else:
            tokens, marked = self.tokens.many(texts), None
        loads = self._loads(log, rows, samples, tokens - pads)
        if self.max_length is not None:
            for r in np.flatnonzero(loads.llm > self.max_length):
                log.note(
                    int(rows[r]), "over_max_length", f"{int(loads.llm[r])} LLM tokens > max_length {self.max_length}"
                )
        keep = np.flatnonzero(log.countable[rows])
        offsets, seqlens = take_rows(*sequence_rows(loads), keep)
        label = None if marked is None else (marked + self._marked_media(samples))[keep]
        return ChunkResult(
            rows[keep].astype(np.int64) + start, loads.vit[keep], loads.llm[keep], seqlens, offsets, label, log.sorted()
        )

    def _marked_media(self, samples: list[_Prepared]) -> np.ndarray:
        """``(len(samples),)`` int64 image tokens of the placeholders inside trained spans that the text leaves
        out (all of them for InternVL, all but the one pad kept for Qwen2-VL)."""
        kept = 1 if self.spec.family == "qwen2vl" else 0
        out = np.zeros(len(samples), dtype=np.int64)
        for r, p in enumerate(samples):
            if not (p.text.images_in_spans or p.text.videos_in_spans):
                continue
            try:
                tokens = media_item_tokens(self.spec, p.sizes, p.videos)
            except ValueError:  # the loads themselves are out of range: the sample is noted and not kept
                continue
            # a placeholder without its medium (a placeholder_mismatch kept under "report") adds nothing
            items = [i for i in p.text.images_in_spans if i < len(p.sizes)]
            items += [len(p.sizes) + v for v in p.text.videos_in_spans if v < len(p.videos)]
            out[r] = sum(int(tokens[i]) - kept for i in items)
        return out

    def _loads(self, log: IssueLog, rows: np.ndarray, samples: list[_Prepared], text_tokens: np.ndarray) -> Lengths:
        """Loads of the countable samples (in the range of a length file); a sample whose loads are not is
        noted as ``bad_media_size`` (its row then holds zeros and is not countable)."""
        try:
            return self._loads_of(samples, text_tokens)
        except ValueError:
            pass
        # One sample out of range fails the batch: count one by one, so that the issue names the right sample.
        parts = []
        for r, sample in enumerate(samples):
            try:
                parts.append(self._loads_of([sample], text_tokens[r : r + 1]))
            except ValueError as exc:
                log.note(int(rows[r]), "bad_media_size", str(exc).split(": ", 1)[-1])
                parts.append(
                    Lengths(
                        np.zeros(1, np.int64),
                        np.zeros(1, np.int64),
                        vit_seqlens=np.zeros(0, np.int64),
                        vit_seqlens_offsets=np.zeros(2, np.int64),
                    )
                )
        return Lengths.concat(parts)

    def _loads_of(self, samples: list[_Prepared], text_tokens: np.ndarray) -> Lengths:
        return media_loads(self.spec, [s.sizes for s in samples], [s.videos for s in samples], text_tokens)
