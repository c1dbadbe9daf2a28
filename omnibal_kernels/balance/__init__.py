"""Planning on the CPU: packs under two capacities, their (step, rank) schedule, capacity search, metrics."""
from .cost import CostModel
from .plan import METHODS, OVERSIZE_POLICIES, OversizeError, Plan, TooFewPacksError, epoch_seed, plan_packs
from .report import BalanceReport, balance_report, dist_ratio
from .search import Capacities, search_capacity
from .targets import PackBounds, load_trend, pack_lower_bounds, repeated_pack_share

__all__ = [
    "BalanceReport",
    "Capacities",
    "CostModel",
    "METHODS",
    "OVERSIZE_POLICIES",
    "OversizeError",
    "PackBounds",
    "Plan",
    "TooFewPacksError",
    "balance_report",
    "dist_ratio",
    "epoch_seed",
    "load_trend",
    "pack_lower_bounds",
    "plan_packs",
    "repeated_pack_share",
    "search_capacity",
]
