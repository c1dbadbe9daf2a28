"""Model and memory balance for pipeline-parallel training: per-layer profiles (measured, estimated from a
config, or read from JSON), partition search (the least simulated step under the schedule, OmniBal's search,
uniform), per-rank recomputation plans, a simulator of the GPipe, 1F1B, interleaved and zero-bubble schedules
of ``torch.distributed.pipelining`` with per-micro-batch costs from packs, and the forms engines take.
Importing it loads no torch."""

from .engines import deepspeed_parts, megatron_layout, pipelining_split_spec, stage_modules
from .estimate import (
    CONFIGS,
    PUBLISHED_PARAMETERS,
    TransformerShape,
    VLMConfig,
    cost_model_from_config,
    load_config,
    packs_from_plan,
    profile_from_config,
)
from .measure import measure_profile, measure_saved_bytes
from .micro_batches import (
    MicroBatchTimes,
    StageKindTimes,
    StageTimes,
    kind_costs,
    kind_scales,
    micro_batch_times,
    pack_kind_costs,
    simulate_packs,
    stage_kind_times,
    stage_times,
)
from .partition import (
    METHODS,
    OBJECTIVES,
    RECOMPUTE_MODES,
    PipelinePlan,
    evaluate_partition,
    partition,
    uniform_stages,
    vit_first_stages,
)
from .profile import PROFILE_FIELDS, LayerProfile, ModelProfile, as_profile, load_profile
from .recompute import apply_recompute, cover, min_cost_cover, stage_recompute
from .schedule import (
    MAX_MICRO_BATCHES,
    SCHEDULES,
    TORCH_SCHEDULES,
    ScheduleResult,
    held_micro_batches,
    schedule_order,
    simulate,
    stage_ranks,
)

__all__ = [
    "CONFIGS",
    "PUBLISHED_PARAMETERS",
    "LayerProfile",
    "MAX_MICRO_BATCHES",
    "METHODS",
    "MicroBatchTimes",
    "ModelProfile",
    "OBJECTIVES",
    "PROFILE_FIELDS",
    "PipelinePlan",
    "RECOMPUTE_MODES",
    "SCHEDULES",
    "ScheduleResult",
    "StageKindTimes",
    "StageTimes",
    "TORCH_SCHEDULES",
    "TransformerShape",
    "VLMConfig",
    "apply_recompute",
    "as_profile",
    "cost_model_from_config",
    "cover",
    "deepspeed_parts",
    "evaluate_partition",
    "held_micro_batches",
    "kind_costs",
    "kind_scales",
    "load_config",
    "load_profile",
    "measure_profile",
    "measure_saved_bytes",
    "megatron_layout",
    "micro_batch_times",
    "min_cost_cover",
    "pack_kind_costs",
    "packs_from_plan",
    "partition",
    "pipelining_split_spec",
    "profile_from_config",
    "schedule_order",
    "simulate",
    "simulate_packs",
    "stage_modules",
    "stage_ranks",
    "stage_recompute",
    "stage_kind_times",
    "stage_times",
    "uniform_stages",
    "vit_first_stages",
]
