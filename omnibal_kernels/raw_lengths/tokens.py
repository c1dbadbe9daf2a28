"""The tokenizer side of the counting: loading it with its chat template and counting tokens in batches.

With the trained character spans of each text (:mod:`.chat`), :meth:`TokenCounter.many_marked` counts as well
the tokens that overlap a span, the rule of transformers' ``return_assistant_tokens_mask``, leaving out each
text's first token: packing masks every sample's first label, so the causal loss never counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .spec import ModelSpec

__all__ = ["TokenCounter", "load_tokenizer", "span_tokens"]

# Characters per batch call: the tokenizer holds every encoding of a call at once (ids, offsets, token strings),
# so a chunk of very long texts is tokenized in several calls; ordinary chunks take one.
_BATCH_CHARS = 1 << 23


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
            raise ValueError(
                f"tokenizer: {path} has no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)"
            )
    return tok


def _batches(rows: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``rows`` cut into runs of at most :data:`_BATCH_CHARS` characters (a longer text alone); none when
    empty (transformers' batch call fails on an empty list)."""
    out = []
    lo = 0
    ends = np.cumsum(sizes[rows])
    while lo < rows.size:
        base = ends[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + _BATCH_CHARS, side="right")))
        out.append(rows[lo:hi])
        lo = hi
    return out


class TokenCounter:
    """Token counts of rendered chats, as ``len(tokenizer(text, add_special_tokens=...)["input_ids"])``.

    ``add_special_tokens=None`` follows a processor's ``apply_chat_template(tokenize=True)``: the tokenizer adds
    its special tokens unless the rendered chat already starts with the BOS token.
    """

    def __init__(self, tokenizer: Any, add_special_tokens: Optional[bool] = None) -> None:
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens
        self._backend = self._fast_backend()
        # the same Rust batch call with offsets (the tokenizer's own call computes them too)
        self._encode_offsets = getattr(tokenizer.backend_tokenizer, "encode_batch", None) if self._backend else None

    def one(self, text: str) -> int:
        """Tokens of one text without special tokens."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def many(self, texts: list[str]) -> np.ndarray:
        """``(len(texts),)`` int64 token counts, special tokens as the class docstring says."""
        out = np.zeros(len(texts), dtype=np.int64)
        for rows, flag, group in self._groups(texts):
            if self._backend is not None:
                # The Rust tokenizer's own batch call: the same ids without building Python lists of them
                # (measured by benchmarks/bench_raw_lengths.py).
                out[rows] = [len(e) for e in self._backend(group, add_special_tokens=flag)]
            else:
                out[rows] = [len(i) for i in self.tokenizer(group, add_special_tokens=flag)["input_ids"]]
        return out

    @property
    def can_mark(self) -> bool:
        """Whether :meth:`many_marked` can run: it needs token offsets, which only fast tokenizers give."""
        return self._encode_offsets is not None or bool(getattr(self.tokenizer, "is_fast", False))

    def many_marked(
        self, texts: list[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, marked)``, each ``(len(texts),)`` int64: the token counts of :meth:`many` and, per text,
        the tokens after its first one that overlap one of its ``spans`` (``[start, end)`` characters)."""
        counts = np.zeros(len(texts), dtype=np.int64)
        marked = np.zeros(len(texts), dtype=np.int64)
        for rows, flag, group in self._groups(texts):
            if self._encode_offsets is not None:
                encodings = self._encode_offsets(group, add_special_tokens=flag)
                counts[rows] = [len(e) for e in encodings]
                marked[rows] = [span_tokens(e, spans[r]) for e, r in zip(encodings, rows)]
            else:
                got = self.tokenizer(group, add_special_tokens=flag, return_offsets_mapping=True)
                counts[rows] = [len(i) for i in got["input_ids"]]
                marked[rows] = [_overlapping(o, spans[r]) for o, r in zip(got["offset_mapping"], rows)]
        return counts, marked

    def _groups(self, texts: list[str]) -> list[tuple[np.ndarray, bool, list[str]]]:
        """``(rows, add_special_tokens, texts of those rows)`` per batch call."""
        if self.add_special_tokens is None:
            bos = self.tokenizer.bos_token
            add = np.array([not (bos and t.startswith(bos)) for t in texts], dtype=bool)
        else:
            add = np.full(len(texts), bool(self.add_special_tokens))
        sizes = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        return [
            (rows, flag, [texts[r] for r in rows])
            for flag in (True, False)
            for rows in _batches(np.flatnonzero(add == flag), sizes)
        ]

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

    def check_image_tokens(self, spec: ModelSpec) -> None:
        """Image tokens are counted by expanding each placeholder to a few tokens and adding the rest: exact
        only when the image-token string is one added token (``k`` copies are ``k`` tokens and do not change how
        the text around them splits). Raises ``ValueError`` naming the token when it is not."""
        if spec.family == "internvl":
            # <img></img> stands for <img> + k context tokens + </img>
            tokens = [(spec.context_image_token, spec.start_image_token, spec.end_image_token, 0)]
        else:
            # one pad token stands for k of them (kept in the text, so the text around it splits as it will)
            tokens = [(spec.image_marker, "", "", 1), (spec.video_marker, "", "", 1)]
        for token, left, right, kept in tokens:
            base = self.one(f"a {left}{token * kept}{right} b")
            if any(self.one(f"a {left}{token * k}{right} b") != base + k - kept for k in (1, 3)):
                raise ValueError(
                    f"tokenizer: {token!r} is not a single added token of this tokenizer, so image "
                    f"tokens cannot be counted as the {spec.model} processor expands them"
                )


def _overlapping(offsets: Any, spans: Sequence[tuple[int, int]]) -> int:
    """Tokens after the first whose ``(start, end)`` offsets overlap a span (zero-width tokens never do)."""
    o = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(o.shape[0], dtype=bool)
    for a, b in spans:
        mask |= (o[:, 0] < b) & (o[:, 1] > a)
    return int(mask[1:].sum())


def span_tokens(encoding: Any, spans: Sequence[tuple[int, int]]) -> int:
    """:func:`_overlapping` of a ``tokenizers.Encoding``, from the tokens at each span's ends.

    Tokens follow the text in order, so those overlapping ``[a, b)`` run from the first token holding
    character ``a`` to the last one starting before ``b`` (a character the tokenizer splits into several byte
    tokens gives each of them its offsets). When a span's end is held by no token (a tokenizer that trims
    whitespace from its offsets), or spans are empty, the offsets of every token decide.
    """
    n = len(encoding)
    total, counted_to = 0, 1  # tokens before counted_to are counted or, the first one, left out
    for a, b in spans:
        first = encoding.char_to_token(a) if b > a else None
        last = encoding.char_to_token(b - 1) if b > a else None
        if first is None or last is None:
            return _overlapping(encoding.offsets, spans)
        while last + 1 < n:
            start, end = encoding.token_to_chars(last + 1) or (0, 0)  # None: a token the text has not
            if not (start < b and end > a):
                break
            last += 1
        first = max(first, counted_to)
        total += max(0, last + 1 - first)
        counted_to = max(counted_to, last + 1)
    return total
