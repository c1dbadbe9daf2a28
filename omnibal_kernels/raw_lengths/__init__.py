"""Length files from raw data sets: each sample's exact ViT load and LLM tokens, as the model's processor
and chat template would produce them, from image headers, video metadata and the real tokenizer.

Python API::

    from omnibal_kernels.raw_lengths import CountOptions, lengths_from_raw
    options = CountOptions(model="qwen2vl", image_root="images/", on_error="skip", max_length=8192)
    result = lengths_from_raw("train.jsonl", "path/to/Qwen2-VL-7B-Instruct", options)
    result.write("lengths.json")          # + lengths.report.json: problems per kind, skipped indices

Command line: ``omnibal-kernels lengths DATA --tokenizer PATH --model internvl|qwen2vl|qwen2.5vl -o OUT``.

Modules, in the order a sample passes them: :mod:`.sources` (records from files), :mod:`.records` (chat
parts), :mod:`.media` (sizes from headers), :mod:`.chat` (template, placeholders), :mod:`.tokens`,
:mod:`.loads` (image tokens, ViT load), :mod:`.count` (one chunk), :mod:`.issues` (problems per sample);
:mod:`.options` (:class:`CountOptions`, what the loads depend on), :mod:`.pool` (worker processes), :mod:`.api`
(the run), :mod:`.result` and :mod:`.merge` (files and shards).
"""

from .api import lengths_from_raw, parse_shard
from .issues import ISSUE_KINDS, ON_ERROR, SampleError
from .merge import merge_length_parts
from .options import DEFAULT_MAX_FRAMES, CountOptions
from .pool import WorkerDied
from .result import RawLengths
from .spec import MODELS, ModelSpec, load_model_spec

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "CountOptions",
    "ISSUE_KINDS",
    "MODELS",
    "ON_ERROR",
    "ModelSpec",
    "RawLengths",
    "SampleError",
    "WorkerDied",
    "lengths_from_raw",
    "load_model_spec",
    "merge_length_parts",
    "parse_shard",
]
