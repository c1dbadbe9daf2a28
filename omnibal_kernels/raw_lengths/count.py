"""Count one chunk of raw records: media headers, chat template, tokenizer, then the library's counting functions.

Per sample, as the model's processor would see it:

1. the record becomes chat messages (:mod:`.records`) and its media are measured from headers (:mod:`.media`);
2. the messages are rendered with the tokenizer's chat template; image / video parts are passed as parts when
   the template renders them (probed once), else as the model's inline placeholder text;
3. the placeholders in the rendered text are counted against the media (a difference is reported);
4. each placeholder is expanded with no image tokens (Qwen2-VL: one pad token kept and subtracted after
   tokenizing; InternVL: ``<img></img>``, ``Frame1: <img></img>`` per video frame) and the chunk's texts are
   tokenized in one batch call;
5. :func:`~omnibal_kernels.vision.compute_loads` adds the image tokens and gives the ViT load from the image
   sizes (``internvl_num_tiles`` / ``qwen2vl_grid``); videos are counted the same way with the video
   processor's settings.

Step 4 is exact when the image-token string is one added token (then ``k`` copies are ``k`` tokens and do not
change how the text around them splits); :class:`ChunkCounter` checks this once for the given tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .._checks import MAX_IMAGE_SIDE, QWEN2VL_MAX_RATIO
from ..vision.loads import compute_loads
from .media import MediaError, VideoInfo, image_size, video_info
from .records import RawSample, RecordError, parse_record
from .spec import ModelSpec

__all__ = ["ISSUE_KINDS", "ON_ERROR", "ChunkResult", "ChunkCounter", "SampleError", "load_tokenizer"]

ISSUE_KINDS = ("bad_record", "missing_media", "unreadable_media", "bad_media_size", "template_error",
               "placeholder_mismatch", "over_max_length")
# Kinds after which the sample still has well-defined loads (kept under on_error="report").
_COUNTABLE = ("placeholder_mismatch", "over_max_length")
ON_ERROR = ("error", "skip", "report")


class SampleError(ValueError):
    """A sample that fails a check under ``on_error="error"``; names the sample index and the kind."""

    def __init__(self, index: int, kind: str, message: str) -> None:
        super().__init__(f"sample {index}: {kind}: {message}")
        self.index, self.kind, self.detail = index, kind, message

    def __reduce__(self) -> tuple:  # rebuilt from its parts when it crosses a process boundary
        return (SampleError, (self.index, self.kind, self.detail))


@dataclass
class ChunkResult:
    """Loads of the kept samples of one chunk and the issues of all of its samples."""

    index: np.ndarray
    """``(K,)`` int64 global indices of the kept samples, increasing"""
    vit: np.ndarray
    llm: np.ndarray
    issues: list[dict] = field(default_factory=list)
    """``{"index", "kind", "message", "kept"}`` per problem, in sample order"""


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` with a chat template; a clear error when there is none."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"tokenizer: {str(path)!r} is not a folder saved by save_pretrained")
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if not getattr(tok, "chat_template", None):
        jinja = path / "chat_template.jinja"
        if jinja.is_file():
            tok.chat_template = jinja.read_text()
        else:
            raise ValueError(f"tokenizer: {path} has no chat template (tokenizer_config.json 'chat_template' or "
                             "chat_template.jinja)")
    return tok


class ChunkCounter:
    """Counts chunks of records for one model spec and tokenizer (one per worker process)."""

    def __init__(self, spec: ModelSpec, tokenizer: Any, *, image_root: Optional[str | Path] = None,
                 max_length: Optional[int] = None, on_error: str = "error",
                 add_special_tokens: Optional[bool] = None,
                 exif_transpose: bool = False) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length <= 0):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        self.spec, self.tokenizer = spec, tokenizer
        self.root = None if image_root is None else Path(image_root)
        self.max_length, self.on_error = max_length, on_error
        self.add_special_tokens, self.exif_transpose = add_special_tokens, exif_transpose
        self._as_part = {kind: self._template_renders(kind) for kind in ("image", "video")}
        self._backend = self._fast_backend()
        self._check_atomic_image_token()

    # ------------------------------------------------------------------ setup probes

    def _template_renders(self, kind: str) -> bool:
        marker = self.spec.image_marker if kind == "image" else self.spec.video_marker
        probe = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "x"}]}]
        try:
            text = self.tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # a text-only template may fail on parts in any way jinja can fail
            return False
        return isinstance(text, str) and text.count(marker) == 1

    def _n_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _check_atomic_image_token(self) -> None:
        spec = self.spec
        if spec.family == "internvl":
            # <img></img> stands for <img> + k context tokens + </img>
            tokens = [(spec.context_image_token, spec.start_image_token, spec.end_image_token, 0)]
        else:
            # one pad token stands for k of them (kept in the text, so the text around it splits as it will)
            tokens = [(spec.image_marker, "", "", 1), (spec.video_marker, "", "", 1)]
        for token, left, right, kept in tokens:
            base = self._n_tokens(f"a {left}{token * kept}{right} b")
            if any(self._n_tokens(f"a {left}{token * k}{right} b") != base + k - kept for k in (1, 3)):
                raise ValueError(f"tokenizer: {token!r} is not a single added token of this tokenizer, so image "
                                 f"tokens cannot be counted as the {spec.model} processor expands them")

    def _count_tokens(self, texts: list[str]) -> np.ndarray:
        """Token count of each text, as ``len(tokenizer(text, add_special_tokens=...)["input_ids"])``.

        ``add_special_tokens=None`` follows a processor's ``apply_chat_template(tokenize=True)``: the tokenizer
        adds its special tokens unless the rendered chat already starts with the BOS token.
        """
        out = np.zeros(len(texts), dtype=np.int64)
        if self.add_special_tokens is None:
            bos = self.tokenizer.bos_token
            add = np.array([not (bos and t.startswith(bos)) for t in texts], dtype=bool)
        else:
            add = np.full(len(texts), bool(self.add_special_tokens))
        for flag in (True, False):
            rows = np.flatnonzero(add == flag)
            if rows.size == 0:  # (transformers' batch call fails on an empty list)
                continue
            group = [texts[r] for r in rows]
            if self._backend is not None:
                # The Rust tokenizer's own batch call: the same ids without building Python lists of them
                # (a third of the tokenizing time, measured on the benchmark data).
                out[rows] = [len(e) for e in self._backend(group, add_special_tokens=flag)]
            else:
                out[rows] = [len(i) for i in self.tokenizer(group, add_special_tokens=flag)["input_ids"]]
        return out

    def _fast_backend(self) -> Any:
        """The Rust tokenizer's batch encoder when it counts exactly as the tokenizer does, else None."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        encode = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
        if encode is None:
            return None
        probe = ["Hello <|im_start|> world", "a\n b  c <img></img> 12345 \u00fcber"]
        for flag in (True, False):
            try:
                fast = [len(e) for e in encode(probe, add_special_tokens=flag)]
            except Exception:  # an older tokenizers without these arguments: the wrapper counts instead
                return None
            if fast != [len(i) for i in self.tokenizer(probe, add_special_tokens=flag)["input_ids"]]:
                return None
        return encode

    # ------------------------------------------------------------------ one sample

    def _messages(self, sample: RawSample) -> list[dict]:
        spec = self.spec
        out = []
        for role, parts in sample.messages:
            content: list[dict] = []
            for kind, value in parts:
                if kind != "text" and self._as_part[kind]:
                    content.append({"type": kind})
                    continue
                text = value if kind == "text" else (spec.inline_image if kind == "image" else spec.inline_video)
                if content and content[-1]["type"] == "text":
                    content[-1]["text"] += text
                else:
                    content.append({"type": "text", "text": text})
            if all(c["type"] == "text" for c in content):
                out.append({"role": role, "content": "".join(c["text"] for c in content)})
            else:
                out.append({"role": role, "content": content})
        return out

    def _expand(self, text: str, frames: Sequence[int]) -> str:
        """The rendered text with every placeholder expanded by the processor's rule, image tokens left out
        (Qwen2-VL: each pad token is kept once and subtracted after tokenizing, see :meth:`count`)."""
        spec = self.spec
        if spec.family == "qwen2vl":
            return text
        pair = spec.start_image_token + spec.end_image_token
        pieces = text.replace(spec.image_marker, pair).split(spec.video_marker)
        out = [pieces[0]]
        for v, piece in enumerate(pieces[1:]):
            n = frames[v] if v < len(frames) else 0
            out.append("\n".join(f"Frame{k + 1}: {pair}" for k in range(n)))
            out.append(piece)
        return "".join(out)

    def _video_frames(self, info: VideoInfo) -> int:
        if self.spec.family == "internvl":
            return self.spec.sampling.uniform_frames(info.num_frames, info.fps)
        return self.spec.sampling.frames(info.num_frames, info.fps, self.spec.video_temporal_patch_size)

    def _check_size(self, w: int, h: int, what: str) -> None:
        if not (0 < w <= MAX_IMAGE_SIDE and 0 < h <= MAX_IMAGE_SIDE):
            raise MediaError("bad_media_size", f"{what} size {w}x{h} (width x height) is out of range")
        if self.spec.family == "qwen2vl" and max(w, h) / min(w, h) > QWEN2VL_MAX_RATIO:
            raise MediaError("bad_media_size", f"{what} {w}x{h} has an aspect ratio above the processor's limit "
                             f"of {QWEN2VL_MAX_RATIO}")

    def _prepare(self, rec: Any, index: int) -> tuple[list[tuple[int, int]], list[tuple[VideoInfo, int]], str,
                                                     Optional[str], int]:
        """Media sizes, videos with their used frames, the text to tokenize, a countable problem if any, and
        the number of placeholders in the text."""
        sample = parse_record(rec, index)
        sizes = []
        for ref in sample.images:
            w, h = image_size(ref, self.root, self.exif_transpose)
            self._check_size(w, h, "image")
            sizes.append((w, h))
        videos = []
        for ref in sample.videos:
            info = video_info(ref, self.root)
            self._check_size(info.width, info.height, "video frame")
            try:
                videos.append((info, self._video_frames(info)))
            except ValueError as exc:
                raise MediaError("bad_media_size", str(exc)) from exc
        try:
            rendered = self.tokenizer.apply_chat_template(self._messages(sample), tokenize=False)
        except Exception as exc:  # jinja raises TemplateError subclasses and whatever the template's code raises
            raise MediaError("template_error", f"the chat template failed: {exc}") from exc
        n_img = rendered.count(self.spec.image_marker)
        n_vid = rendered.count(self.spec.video_marker)
        problem = None
        if n_img != len(sizes) or n_vid != len(videos):
            problem = (f"{n_img} image and {n_vid} video placeholders in the rendered text for {len(sizes)} images "
                       f"and {len(videos)} videos")
        return sizes, videos, self._expand(rendered, [f for _, f in videos]), problem, n_img + n_vid

    # ------------------------------------------------------------------ one chunk

    def count(self, records: Sequence[Any], start: int) -> ChunkResult:
        """Count ``records``, whose first one is sample ``start`` of the data.

        Raises:
            SampleError: the first problem, under ``on_error="error"``.
        """
        n = len(records)
        issues: list[dict] = []
        countable = np.ones(n, dtype=bool)
        sizes: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        videos: list[list[tuple[VideoInfo, int]]] = [[] for _ in range(n)]
        texts: list[str] = [""] * n
        kept_markers = np.zeros(n, dtype=np.int64)

        def note(j: int, kind: str, message: str) -> None:
            if self.on_error == "error":
                raise SampleError(start + j, kind, message)
            keep = self.on_error == "report" and kind in _COUNTABLE
            issues.append({"index": start + j, "kind": kind, "message": message, "kept": keep})
            if not keep:
                countable[j] = False

        for j, rec in enumerate(records):
            try:
                sizes[j], videos[j], texts[j], problem, markers = self._prepare(rec, start + j)
                kept_markers[j] = markers if self.spec.family == "qwen2vl" else 0
            except (RecordError, MediaError) as exc:
                note(j, getattr(exc, "kind", "bad_record"), str(exc).split(": ", 1)[-1]
                     if isinstance(exc, RecordError) else str(exc))
                continue
            except (TypeError, ValueError) as exc:  # a field of the wrong type, e.g. a width that is text
                note(j, "bad_record", f"{type(exc).__name__}: {exc}")
                continue
            if problem is not None:
                note(j, "placeholder_mismatch", problem)
        rows = np.flatnonzero(countable)
        text_tokens = self._count_tokens([texts[j] for j in rows]) - kept_markers[rows]
        vit, llm = self._loads([sizes[j] for j in rows], [videos[j] for j in rows], text_tokens)
        if self.max_length is not None:
            for r in np.flatnonzero(llm > self.max_length):
                note(int(rows[r]), "over_max_length", f"{int(llm[r])} LLM tokens > max_length {self.max_length}")
        keep = countable[rows]
        issues.sort(key=lambda d: d["index"])
        return ChunkResult(rows[keep].astype(np.int64) + start, vit[keep], llm[keep], issues)

    def _loads(self, sizes: list[list[tuple[int, int]]], videos: list[list[tuple[VideoInfo, int]]],
               text_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        if spec.family == "internvl":
            tiling = dict(min_num=spec.min_num, max_num=spec.max_num) if spec.dynamic else dict(min_num=1, max_num=1)
            loads = compute_loads(sizes, text_tokens, model="internvl", num_image_token=spec.num_image_token,
                                  image_size=spec.image_size, use_thumbnail=spec.use_thumbnail, progress=False,
                                  **tiling)
            # Video frames are single tiles (no dynamic tiling), each with its image tokens.
            frames = np.array([sum(f for _, f in v) for v in videos], dtype=np.int64)
            return loads.vit + frames, loads.llm + frames * spec.num_image_token
        loads = compute_loads(sizes, text_tokens, model="qwen2vl", patch_size=spec.patch_size,
                              merge_size=spec.merge_size, temporal_patch_size=spec.temporal_patch_size,
                              min_pixels=spec.min_pixels, max_pixels=spec.max_pixels, progress=False)
        vit, llm = loads.vit.copy(), loads.llm.copy()
        flat = [(s, info, f) for s, vs in enumerate(videos) for info, f in vs]
        if flat:
            # Videos whose frame cap differs are counted in separate calls (the cap is one scalar per call).
            groups: dict[int, list[int]] = {}
            for k, (_, _, f) in enumerate(flat):
                groups.setdefault(self._video_max_pixels(f), []).append(k)
            for max_pixels, ks in groups.items():
                v = compute_loads(np.array([[flat[k][1].width, flat[k][1].height] for k in ks], dtype=np.int64),
                                  np.zeros(len(sizes), dtype=np.int64), model="qwen2vl",
                                  image_to_sample=np.array([flat[k][0] for k in ks], dtype=np.int64),
                                  num_frames=np.array([flat[k][2] for k in ks], dtype=np.int64),
                                  patch_size=spec.video_patch_size, merge_size=spec.video_merge_size,
                                  temporal_patch_size=spec.video_temporal_patch_size,
                                  min_pixels=spec.video_min_pixels, max_pixels=max_pixels, progress=False)
                vit += v.vit
                llm += v.llm
        return vit, llm

    def _video_max_pixels(self, frames: int) -> int:
        spec = self.spec
        if not spec.cap_pixels_per_frame:
            return spec.video_max_pixels
        # Qwen2VLVideoProcessor.resize with cap_pixels_per_frame: an even share of a total pixel budget.
        factor = spec.video_patch_size * spec.video_merge_size
        total = int(spec.max_video_tokens * factor * factor * 0.9)
        return max(min(spec.video_max_pixels, total * spec.video_temporal_patch_size // frames),
                   int(spec.video_min_pixels * 1.05))
