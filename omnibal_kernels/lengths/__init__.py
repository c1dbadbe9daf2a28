"""Per-sample loads: every sample's ViT load (image tiles or patches) and LLM load (tokens).

``load_lengths`` reads them (``write_lengths`` writes them) from the formats in use, validates them and returns
one columnar ``Lengths``:

* the OmniBal JSON list format: ``[{"vit_num": 5, "token_num": 1420, ...}, ...]``;
* JSON Lines with the same fields, one object per line (``.jsonl``);
* OmniBal's meta file, ``{"name": {"token_lengths": "path/to/list.json", ...}, ...}``, whose paths are
  read in order (relative paths are taken from the meta file's folder);
* ``.npy``: a 1-D array of token counts (text-only data, ViT load 0) or an ``(N, 2)`` array of
  ``(vit, llm)`` rows;
* ``.npz``: arrays ``vit`` and ``llm`` (or ``vit_num`` and ``token_num``); ``llm`` alone means text-only;
  an optional array ``label`` holds each sample's label tokens (see ``Lengths.label``).

Each sample may also carry its ViT sequence lengths, ``vit_seqlens``: one per image, video frame group or tile,
in ViT load units, summing to the sample's ViT load (a text-only sample has none). In ``.npz`` files they are
the arrays ``vit_seqlens`` (flat int64) and ``vit_seqlens_offsets`` (``N + 1`` int64 from 0: sample ``i`` has
``vit_seqlens[offsets[i]:offsets[i + 1]]``); in JSON and JSON Lines the key ``"vit_seqlens": [...]`` of each
sample (without ``vit_num`` a sample's ViT load is their sum), read by the same C++ scan as the loads. Without
them, a cost model takes each sample's whole ViT load as one sequence
(:class:`~omnibal_kernels.balance.CostModel`).

A missing ``vit_num`` means a text-only sample (ViT load 0). A missing ``token_num``, a negative, non-integer
or too large value raises ``ValueError`` naming the file and the sample index. JSON is scanned by the C++
extension in one pass, with no Python object per sample, so inputs of tens of millions of samples load in
seconds. The JSON must be strict (commas between samples, nothing after a list's closing ``]``) and UTF-8
everywhere, ignored fields included (a byte order mark is skipped; errors name the line and column); a file
without samples is an error unless ``allow_empty=True``.

The arrays of a ``Lengths`` are read-only: statistics computed once (and the plans made from them) stay true.
Derive new loads as a new ``Lengths``, e.g. ``Lengths(L.vit, L.llm + 2000, L.source, L.sources)``.

Modules: ``table`` (the ``Lengths`` table and its checks), ``read`` (``load_lengths``, ``default_lengths``),
``write`` (``write_lengths``).
"""

from __future__ import annotations

from .read import default_lengths, load_lengths
from .table import LLM_BIN, Lengths, LoadStats
from .write import write_lengths

__all__ = ["LLM_BIN", "Lengths", "LoadStats", "default_lengths", "load_lengths", "write_lengths"]
