"""Planning on the CPU: packs under two capacities, their (step, rank) schedule, capacity search, metrics.

Modules, in the order they build on each other (no module imports one below it in this list):

===============  =========================================================================================
``cost``         the per-sample cost model the balanced method equalizes
``cost_models``  cost models by name, and the CLI's ``--cost-model`` value (name, JSON file, config folder)
``seeds``        the seed check and the per-epoch seed (the engine's SplitMix64)
``options``      ``PlanOptions`` and ``IsfOptions``: how to plan, checked once
``packs``        what a plan is (``Plan``) and the planning errors
``engine``       the C++ engine for given capacities (the methods: balanced, isf, random)
``bound``        a proven lower bound on the epoch cost of every plan of given samples (``epoch_bound``)
``report``       balance metrics of a plan (the paper's Dist Ratio, fills, step efficiency, epoch cost and bound)
``search``       capacities from a wanted mean pack size
``plan``         ``plan_packs``: capacity search where needed, then the engine
``schedule``     several plans as one schedule: groups one after another or interleaved, micro-steps
``targets``      measures beyond the report: pack lower bounds, load trend over the epoch, packs repeated
===============  =========================================================================================

:func:`omnibal_kernels.context_parallel.context_parallel_report` prices a plan's packs on context-parallel
groups: every CP rank's predicted time per step.
"""

from .bound import epoch_bound
from .cost import MAX_TERM, CostModel
from .cost_models import NAMED_COST_MODELS, cost_model_from_spec, named_cost_model
from .options import METHODS, OVERSIZE_POLICIES, IsfOptions, PlanOptions
from .packs import OversizeError, Plan, TooFewPacksError
from .plan import plan_packs
from .report import BalanceReport, balance_report, dist_ratio, epoch_cost
from .search import Capacities, search_capacity
from .seeds import epoch_seed
from .targets import PackBounds, load_trend, pack_lower_bounds, repeated_pack_share

__all__ = [
    "BalanceReport",
    "Capacities",
    "CostModel",
    "IsfOptions",
    "MAX_TERM",
    "METHODS",
    "NAMED_COST_MODELS",
    "OVERSIZE_POLICIES",
    "OversizeError",
    "PackBounds",
    "Plan",
    "PlanOptions",
    "TooFewPacksError",
    "balance_report",
    "cost_model_from_spec",
    "dist_ratio",
    "epoch_bound",
    "epoch_cost",
    "epoch_seed",
    "load_trend",
    "named_cost_model",
    "pack_lower_bounds",
    "plan_packs",
    "repeated_pack_share",
    "search_capacity",
]
