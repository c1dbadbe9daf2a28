"""The text side of one sample: chat messages rendered with the tokenizer's template, placeholders expanded.

Image and video parts go to the template as parts when it renders them (probed once per kind), else as the
model's inline placeholder text. Each placeholder in the rendered text is then expanded with no image tokens:
Qwen2-VL keeps its one pad token (subtracted after tokenizing), InternVL becomes ``<img></img>`` and
``Frame1: <img></img>`` per video frame; the image tokens are added from the media sizes afterwards.

What is trained: a chat template marks the text a model learns to produce with ``{% generation %}`` ...
``{% endgeneration %}`` blocks, the marks transformers' ``apply_chat_template(return_assistant_tokens_mask=True)``
reads. Rendering with marks gives those character spans; expanding keeps them on the same text, and notes the
placeholders inside them (their image tokens are inside too).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from .media import MediaError
from .records import RawSample
from .spec import ModelSpec

__all__ = ["ChatRenderer", "Expanded", "marks_training"]

# How transformers finds the training marks of a template.
_TRAINING_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def marks_training(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template marks trained text with ``{% generation %}`` blocks."""
    try:
        template = tokenizer.get_chat_template()
    except (ValueError, AttributeError):  # no template at all
        return False
    return isinstance(template, str) and _TRAINING_MARK.search(template) is not None


class Expanded(NamedTuple):
    """A rendered sample with its placeholders expanded."""

    text: str
    spans: list[tuple[int, int]]
    """``[start, end)`` character spans of ``text`` the template marks for training, in order"""
    images_in_spans: list[int]
    """which images (by their order in the text) have their placeholder inside a span"""
    videos_in_spans: list[int]
    """which videos likewise"""


class ChatRenderer:
    """Renders samples for one model spec with one tokenizer's chat template."""

    def __init__(self, spec: ModelSpec, tokenizer: Any) -> None:
        self.spec, self.tokenizer = spec, tokenizer
        self._as_part = {kind: self._template_renders(kind) for kind in ("image", "video")}
        markers = sorted({spec.image_marker, spec.video_marker}, key=len, reverse=True)
        self._markers = re.compile("|".join(re.escape(m) for m in markers))

    def _template_renders(self, kind: str) -> bool:
        marker = self.spec.image_marker if kind == "image" else self.spec.video_marker
        probe = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "x"}]}]
        try:
            text = self.tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # a text-only template may fail on parts in any way jinja can fail
            return False
        return isinstance(text, str) and text.count(marker) == 1

    def messages(self, sample: RawSample) -> list[dict]:
        """The sample as the chat messages its model's processor would render."""
        spec = self.spec
        out: list[dict[str, Any]] = []
        for role, parts in sample.messages:
            content: list[dict[str, Any]] = []
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

    def render(self, sample: RawSample) -> str:
        """The rendered chat text.

        Raises:
            MediaError: kind ``template_error`` when the template fails on the sample.
        """
        try:
            return self.tokenizer.apply_chat_template(self.messages(sample), tokenize=False)
        except Exception as exc:  # jinja raises TemplateError subclasses and whatever the template's code raises
            raise MediaError("template_error", f"the chat template failed: {exc}") from exc

    def render_marked(self, sample: RawSample) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat text (the same as :meth:`render`) and the character spans its template marks
        for training, rendered as ``apply_chat_template(return_assistant_tokens_mask=True)`` renders them.

        Raises:
            MediaError: kind ``template_error`` when the template fails on the sample.
        """
        from transformers.utils.chat_template_utils import render_jinja_template

        tok = self.tokenizer
        try:
            # the texts and the spans of each (typed by transformers as a str)
            rendered: Any = render_jinja_template(
                conversations=[self.messages(sample)],
                chat_template=tok.get_chat_template(),
                return_assistant_tokens_mask=True,
                **tok.special_tokens_map,
            )
        except Exception as exc:  # as in render
            raise MediaError("template_error", f"the chat template failed: {exc}") from exc
        texts, spans = rendered
        return texts[0], [(int(a), int(b)) for a, b in spans[0]]

    def placeholders(self, text: str) -> tuple[int, int]:
        """Image and video placeholders in a rendered text."""
        return text.count(self.spec.image_marker), text.count(self.spec.video_marker)

    def expand(self, text: str, frames: Sequence[int], spans: Sequence[tuple[int, int]] = ()) -> Expanded:
        """The rendered text with every placeholder expanded by the processor's rule, image tokens left out;
        ``frames[v]`` is the number of frames the ``v``-th video gives the model. ``spans`` (trained character
        spans of ``text``) move with the text around them; a placeholder inside a span stays inside."""
        spec = self.spec
        pieces: list[str] = []
        ends: list[int] = []  # end of each placeholder in text, and the characters gained up to it
        gained = [0]
        found: dict[str, list[tuple[int, int]]] = {spec.image_marker: [], spec.video_marker: []}  # their spans
        pos = 0
        for m in self._markers.finditer(text):
            kind = found[m.group()]
            new = self._expansion(m.group(), len(kind), frames)
            kind.append(m.span())
            pieces += [text[pos : m.start()], new]
            ends.append(m.end())
            gained.append(gained[-1] + len(new) - (m.end() - m.start()))
            pos = m.end()
        pieces.append(text[pos:])
        moved = [tuple(p + gained[bisect.bisect_right(ends, p)] for p in span) for span in spans]

        def inside(marks: list[tuple[int, int]]) -> list[int]:
            return [i for i, (a, b) in enumerate(marks) if any(a < e and b > s for s, e in spans)]

        return Expanded(
            "".join(pieces),
            moved,  # type: ignore[arg-type]  # the moved spans are (start, end) pairs, as they came in
            inside(found[spec.image_marker]),
            inside(found[spec.video_marker]),
        )

    def _expansion(self, marker: str, k: int, frames: Sequence[int]) -> str:
        """What the ``k``-th placeholder ``marker`` of its kind becomes (Qwen2-VL: itself)."""
        spec = self.spec
        if spec.family == "qwen2vl":
            return marker
        pair = spec.start_image_token + spec.end_image_token
        if marker == spec.image_marker:
            return pair
        n = frames[k] if k < len(frames) else 0
        return "\n".join(f"Frame{j + 1}: {pair}" for j in range(n))
