"""Tiny model folders, built offline, laid out as ``save_pretrained`` lays out the real ones (tests, benchmarks).

Each folder holds a byte-level BPE tokenizer trained on a few sentences (so text splits into many tokens, as
with a real tokenizer) with the model's special tokens, a chat template written in the model's format, and
the image-processor settings saved by transformers' own image processor class:

* ``"qwen2vl"``: Qwen2-VL chat format (default system turn, ``<|vision_start|><|image_pad|><|vision_end|>``),
  ``Qwen2VLImageProcessorPil(...).save_pretrained`` and a ``video_preprocessor_config.json``;
* ``"internvl"``: transformers' InternVL (``<IMG_CONTEXT>`` image parts, ``GotOcr2ImageProcessorPil``,
  ``processor_config.json`` with ``image_seq_length``, image tokens named on the tokenizer);
* ``"internvl-chat"``: a remote-code InternVL-Chat checkpoint: text-only template, ``config.json`` settings.

Needs ``transformers`` and ``tokenizers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["tiny_model_folder"]

_CORPUS = [
    "What is shown in the picture? Describe the image in detail, please.",
    "A small cat sits on a red mat next to a wooden chair in the garden.",
    "The chart shows sales growing from 2019 to 2023; the largest jump is in 2021.",
    "Answer the question using a single word or phrase.",
    "There are three people walking along the river at sunset with two dogs.",
]

# A message's content: a string, or parts (text, and the model's image / video placeholders).
_QWEN_CONTENT = (
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
)
_INTERNVL_CONTENT = (
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{%- elif part['type'] == 'video' %}{{ '<video>\\n' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
)
# InternVL-Chat checkpoints format their conversation in code; their saved template takes text only.
_TEXT_CONTENT = "{{ message['content'] }}"
_QWEN_SYSTEM = (
    "{%- if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)
_GENERATION_PROMPT = "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def _chat_template(content: str, mark_training: bool, system: str = "") -> str:
    """A ChatML template; ``mark_training``: assistant turns (their content and ``<|im_end|>``) inside
    ``{% generation %}`` blocks, the marks of what is trained (the rendered text is the same either way)."""
    if not mark_training:
        turns = "<|im_start|>{{ message['role'] + '\\n' }}" + content + "{{ '<|im_end|>\\n' }}"
    else:
        turns = (
            "<|im_start|>{{ message['role'] + '\\n' }}{%- if message['role'] == 'assistant' %}{% generation %}"
            + content
            + "<|im_end|>{% endgeneration %}{{ '\\n' }}{%- else %}"
            + content
            + "{{ '<|im_end|>\\n' }}{%- endif %}"
        )
    return system + "{%- for message in messages %}" + turns + "{% endfor %}" + _GENERATION_PROMPT


def _tokenizer(specials: list[str], extra: dict[str, str], template: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tk.train_from_iterator(_CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>", extra_special_tokens=extra or None
    )
    tok.add_tokens(specials, special_tokens=True)
    tok.chat_template = template
    return tok


def tiny_model_folder(
    folder: str | Path,
    model: str,
    *,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 64,
    video_min_pixels: int = 28 * 28 * 4,
    video_max_pixels: int = 28 * 28 * 16,
    max_num: int = 6,
    image_size: int = 448,
    image_seq_length: int = 64,
    mark_training: bool = True,
) -> Path:
    """Write a tiny model folder for ``model`` (``"qwen2vl"``, ``"internvl"`` or ``"internvl-chat"``).

    Args:
        folder: where to write (created).
        min_pixels, max_pixels, video_min_pixels, video_max_pixels: Qwen2-VL resize bounds (small, so that
            small test images reach both bounds).
        max_num, image_size, image_seq_length: InternVL tiling and image tokens per tile.
        mark_training: the chat template marks the assistant turns for training (``{% generation %}``).

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chat = ["<|im_start|>", "<|im_end|>"]
    if model in ("qwen2vl", "qwen2.5vl"):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        tok = _tokenizer(
            chat + ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
            {},
            _chat_template(_QWEN_CONTENT, mark_training, _QWEN_SYSTEM),
        )
        tok.save_pretrained(folder)
        Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(folder)
        video = {
            "video_processor_type": "Qwen2VLVideoProcessor",
            "patch_size": 14,
            "merge_size": 2,
            "temporal_patch_size": 2,
            "size": {"shortest_edge": video_min_pixels, "longest_edge": video_max_pixels},
            "do_sample_frames": False,
        }
        (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    elif model == "internvl":
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        extra = {
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        }
        tok = _tokenizer(chat, extra, _chat_template(_INTERNVL_CONTENT, mark_training))
        tok.save_pretrained(folder)
        GotOcr2ImageProcessorPil(
            crop_to_patches=True, min_patches=1, max_patches=max_num, size={"height": image_size, "width": image_size}
        ).save_pretrained(folder)
        (folder / "processor_config.json").write_text(
            json.dumps({"processor_class": "InternVLProcessor", "image_seq_length": image_seq_length}, indent=2)
        )
    elif model == "internvl-chat":
        tok = _tokenizer(chat + ["<img>", "</img>", "<IMG_CONTEXT>"], {}, _chat_template(_TEXT_CONTENT, mark_training))
        tok.save_pretrained(folder)
        patch = 14
        ratio = (image_seq_length / (image_size // patch) ** 2) ** 0.5
        config = {
            "architectures": ["InternVLChatModel"],
            "force_image_size": image_size,
            "downsample_ratio": ratio,
            "min_dynamic_patch": 1,
            "max_dynamic_patch": max_num,
            "use_thumbnail": True,
            "dynamic_image_size": True,
            "vision_config": {"image_size": image_size, "patch_size": patch},
        }
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    else:
        raise ValueError(f"model must be 'qwen2vl', 'internvl' or 'internvl-chat', got {model!r}")
    return folder
