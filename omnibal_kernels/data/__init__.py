"""Bundled data: a compact copy of the real InternVL-Chat SFT per-sample loads.

``internvl_sft_lengths.npz`` holds the 70,706 samples of four InternVL-Chat SFT datasets (ai2d, chartqa,
docvqa, synthdog_en), in file order: ``vit`` (int32 ViT tiles per sample, thumbnail included), ``llm`` (int32
LLM tokens per sample, image tokens included), ``source`` (int16 index into ``source_names``). The loads come
from the statistics published with the OmniBal code (Apache-2.0).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_LENGTHS_PATH = Path(__file__).with_name("internvl_sft_lengths.npz")
