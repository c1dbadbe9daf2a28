"""Planning on the CPU: packs under two capacities, their (step, rank) schedule, capacity search, metrics."""
from .cost import CostModel
from .plan import METHODS, OVERSIZE_POLICIES, OversizeError, Plan, TooFewPacksError, epoch_seed, plan_packs
from .report import BalanceReport, balance_report, dist_ratio
from .search import Capacities, search_capacity

__all__ = [
    "BalanceReport",
    "Capacities",
    "CostModel",
    "METHODS",
    "OVERSIZE_POLICIES",
    "OversizeError",
    "Plan",
    "TooFewPacksError",
    "balance_report",
    "dist_ratio",
    "epoch_seed",
    "plan_packs",
    "search_capacity",
]
