"""Model and memory balance for pipeline-parallel training: per-layer profiles (measured, estimated from a
config, or read from JSON), partition search (exact, OmniBal's search, uniform), per-stage recomputation
plans, a 1F1B/GPipe schedule simulator, and the forms engines take. Importing it loads no torch."""
from .engines import deepspeed_parts, megatron_layout, pipelining_split_spec, stage_modules
from .estimate import CONFIGS, TransformerShape, VLMConfig, load_config, packs_from_plan, profile_from_config
from .measure import measure_profile, measure_saved_bytes
from .partition import METHODS, RECOMPUTE_MODES, PipelinePlan, evaluate_partition, partition, uniform_stages
from .profile import PROFILE_FIELDS, LayerProfile, ModelProfile, as_profile, load_profile
from .recompute import apply_recompute, min_cost_cover, stage_recompute
from .schedule import SCHEDULES, ScheduleResult, held_micro_batches, simulate

__all__ = [
    "CONFIGS", "LayerProfile", "METHODS", "ModelProfile", "PROFILE_FIELDS", "PipelinePlan", "RECOMPUTE_MODES",
    "SCHEDULES", "ScheduleResult", "TransformerShape", "VLMConfig", "apply_recompute", "as_profile",
    "deepspeed_parts", "evaluate_partition", "held_micro_batches", "load_config", "load_profile",
    "measure_profile", "measure_saved_bytes", "megatron_layout", "min_cost_cover", "packs_from_plan",
    "partition", "pipelining_split_spec", "profile_from_config", "simulate", "stage_modules", "stage_recompute",
    "uniform_stages",
]
