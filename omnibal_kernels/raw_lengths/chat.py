"""The text side of one sample: chat messages rendered with the tokenizer's template, placeholders expanded.

Image and video parts go to the template as parts when it renders them (probed once per kind), else as the
model's inline placeholder text. Each placeholder in the rendered text is then expanded with no image tokens:
Qwen2-VL keeps its one pad token (subtracted after tokenizing), InternVL becomes ``<img></img>`` and
``Frame1: <img></img>`` per video frame; the image tokens are added from the media sizes afterwards.
"""
from __future__ import annotations

from typing import Any, Sequence

from .media import MediaError
from .records import RawSample
from .spec import ModelSpec

__all__ = ["ChatRenderer"]


class ChatRenderer:
    """Renders samples for one model spec with one tokenizer's chat template."""

    def __init__(self, spec: ModelSpec, tokenizer: Any) -> None:
        self.spec, self.tokenizer = spec, tokenizer
        self._as_part = {kind: self._template_renders(kind) for kind in ("image", "video")}

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

    def placeholders(self, text: str) -> tuple[int, int]:
        """Image and video placeholders in a rendered text."""
        return text.count(self.spec.image_marker), text.count(self.spec.video_marker)

    def expand(self, text: str, frames: Sequence[int]) -> str:
        """The rendered text with every placeholder expanded by the processor's rule, image tokens left out;
        ``frames[v]`` is the number of frames the ``v``-th video gives the model."""
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
