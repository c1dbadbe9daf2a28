"""BalancedBatchSampler on samples without any load: a clear error, never "at least 0 pack(s)"."""

from __future__ import annotations

import numpy as np
import pytest

from omnibal_kernels import PlanOptions
from omnibal_kernels.balance import TooFewPacksError
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.sampler import BalancedBatchSampler


def _zeros(n: int) -> Lengths:
    return Lengths(np.zeros(n, np.int64), np.zeros(n, np.int64))


@pytest.mark.parametrize(
    "options", [PlanOptions(vit_capacity=4, llm_capacity=100), PlanOptions()], ids=["given", "searched"]
)
def test_all_zero_loads_say_so(options):
    with pytest.raises(TooFewPacksError, match="all 10 samples have ViT load 0 and LLM load 0") as err:
        BalancedBatchSampler(_zeros(10), options, world_size=2, rank=0)
    assert "at least 0 pack" not in str(err.value)
    # a group of zero loads beside a group with loads: the error names the group
    lengths = Lengths(np.array([1] * 6 + [0] * 4), np.array([50] * 6 + [0] * 4))
    with pytest.raises(TooFewPacksError, match="group 1: all 4 samples have ViT load 0"):
        BalancedBatchSampler(
            lengths,
            PlanOptions(vit_capacity=2, llm_capacity=100),
            world_size=1,
            micro_steps_per_step=2,
            rank=0,
            groups=[0] * 6 + [1] * 4,
        )


def test_zero_loads_on_one_rank_make_one_pack():
    # one slot per step: the one pack of every sample is a valid plan, not "fewer than 1 pack"
    sampler = BalancedBatchSampler(_zeros(10), PlanOptions(vit_capacity=4, llm_capacity=100), world_size=1, rank=0)
    batches = list(sampler)
    assert len(batches) == 1 and sorted(batches[0]) == list(range(10))


def test_some_zero_loads_still_count_their_pack():
    # two packs of real load plus zero-load samples: enough for two ranks
    lengths = Lengths(np.array([0, 0, 3, 3]), np.array([0, 0, 90, 90]))
    batches = [
        list(BalancedBatchSampler(lengths, PlanOptions(vit_capacity=4, llm_capacity=100), world_size=2, rank=r))
        for r in range(2)
    ]
    assert sorted(i for rank in batches for b in rank for i in b) == [0, 1, 2, 3]
