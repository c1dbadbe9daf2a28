"""A ``PipelinePlan`` in the forms training engines take.

Every form lists virtual stages in chain order; with ``virtual_stages = v`` rank ``r`` runs the stages
``plan.rank_stages(r)`` (round-robin ``r, r + P, ...``, or ``r`` and ``2P - 1 - r`` for ``"zbv"``).

- torch.distributed.pipelining: a ``split_spec`` for ``pipeline(module, mb_args, split_spec=...)`` (tracer
  front end, one pipe stage per virtual stage), or the per-stage modules for manual ``PipelineStage`` s
  (``PipelineStage(stage_modules(...)[j], j, P * v, device)`` for each stage ``j`` of the rank, all of them
  given to the schedule class ``TORCH_SCHEDULES[plan.schedule]``).
- Megatron-LM / Megatron-Core: decoder layers per virtual stage, the uneven first/last stage counts, the
  ``--virtual-pipeline-model-parallel-size`` and a ``--pipeline-model-parallel-layout`` string (``E``
  embedding, ``t`` decoder layer, ``L`` loss, ``|`` between virtual stages).
- DeepSpeed ``PipelineModule``: the ``parts`` boundaries (stage ``s`` owns layers ``parts[s]:parts[s + 1]``),
  the list ``PipelineModule`` builds internally from its ``partition_method``; it runs one stage per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from .partition import PipelinePlan
from .profile import ModelProfile

__all__ = ["pipelining_split_spec", "stage_modules", "megatron_layout", "deepspeed_parts"]


def pipelining_split_spec(plan: PipelinePlan, names: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """``{qualified name of each stage's first layer: SplitPoint.BEGINNING}`` for stages 1..P-1.

    ``names`` are the sub-module names of the layers (default: the profile's layer names, which are the
    qualified names when the profile was measured with ``measure_profile``).
    """
    from torch.distributed.pipelining import SplitPoint

    names = list(plan.names if names is None else names)
    if len(names) != plan.stages[-1][1] + 1:
        raise ValueError(f"names: {len(names)} names for {plan.stages[-1][1] + 1} layers")
    return {names[first]: SplitPoint.BEGINNING for first, _ in plan.stages[1:]}


def stage_modules(layers: Any, plan: PipelinePlan) -> list[Any]:
    """The layers of each virtual stage as a ``Chain`` (an ``nn.Sequential`` whose first layer takes the
    stage's positional inputs), for ``PipelineStage(stage_modules(...)[j], j, plan.num_stages, device)``.

    ``layers`` is an ``nn.Sequential``, ``nn.ModuleList`` or list of modules, one per profiled layer; the
    stages share the layers' parameters (no copy).
    """
    from collections import OrderedDict

    import torch

    from .chain import Chain

    if isinstance(layers, torch.nn.Module):
        items = list(layers.named_children())  # keep the names, so apply_recompute and state dicts match
    else:
        items = [(str(i), m) for i, m in enumerate(layers)]
    if len(items) != plan.stages[-1][1] + 1:
        raise ValueError(f"layers: {len(items)} modules for {plan.stages[-1][1] + 1} profiled layers")
    return [Chain(OrderedDict(items[a : b + 1])) for a, b in plan.stages]


def megatron_layout(plan: PipelinePlan, profile: ModelProfile) -> dict[str, Any]:
    """Megatron-style stage contents from the layers' ``kind`` (``"llm"`` = decoder layer), per virtual stage.

    Returns ``decoder_layers_per_stage``, ``vision_layers_per_stage``, ``decoder_first_pipeline_num_layers`` and
    ``decoder_last_pipeline_num_layers`` (set when the middle stages hold equal counts, as Megatron's uneven
    first/last options require, else ``None``), ``virtual_pipeline_model_parallel_size``,
    ``pipeline_model_parallel_layout`` (``E`` where the text embedding lives, which here is the ``projector``
    layer, ``t*n`` decoder layers, ``L`` with the head) and ``vision_on_first_stage_only`` (Megatron's VLMs
    place the whole vision encoder on the first stage; use ``fixed_starts`` in the search to keep it there).
    """
    if len(profile) != plan.stages[-1][1] + 1:
        raise ValueError(f"profile has {len(profile)} layers, the plan {plan.stages[-1][1] + 1}")
    kinds = [layer.kind for layer in profile.layers]
    decoder, vision, parts = [], [], []
    for a, b in plan.stages:
        ks = kinds[a : b + 1]
        decoder.append(ks.count("llm"))
        vision.append(ks.count("vit"))
        text = ("E" if "projector" in ks else "") + (f"t*{decoder[-1]}" if decoder[-1] > 1 else "t" * decoder[-1])
        text += "L" if "head" in ks else ""
        parts.append(text)
    middle = decoder[1:-1]
    even = len(decoder) > 2 and len(set(middle)) == 1
    return {
        "decoder_layers_per_stage": decoder,
        "vision_layers_per_stage": vision,
        "decoder_first_pipeline_num_layers": decoder[0] if even else None,
        "decoder_last_pipeline_num_layers": decoder[-1] if even else None,
        "virtual_pipeline_model_parallel_size": plan.virtual_stages if plan.virtual_stages > 1 else None,
        "pipeline_model_parallel_layout": "|".join(parts),
        "vision_on_first_stage_only": all(v == 0 for v in vision[1:]),
    }


def deepspeed_parts(plan: PipelinePlan) -> list[int]:
    """DeepSpeed ``PipelineModule`` boundaries: ``[0, first of stage 1, ..., num_layers]`` (one stage per
    rank: ``ValueError`` for a plan with virtual stages)."""
    if plan.virtual_stages > 1:
        raise ValueError(
            f"plan: DeepSpeed's PipelineModule runs one stage per rank, the plan has {plan.virtual_stages} per rank"
        )
    return [a for a, _ in plan.stages] + [plan.stages[-1][1] + 1]
