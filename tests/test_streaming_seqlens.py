"""The streaming packer plans with the samples' ViT sequences when ``lengths_fn`` gives them: the cost it balances
is the one a report under a per-image attention term measures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels.balance import CostModel, PlanOptions, balance_report, named_cost_model, search_capacity
from omnibal_kernels.lengths import Lengths
from omnibal_kernels.streaming import BalancedPacker, _buffer_lengths, _merge, _plan_stream
from omnibal_kernels.synthetic import synthetic_lengths

# The synthetic classes' longest samples exceed the capacities of target_batch_size by design: raising them
# is the expected, warned-of result.
pytestmark = pytest.mark.filterwarnings("ignore::omnibal_kernels._warnings.CapacityWarning")

SAMPLE = st.tuples(
    st.lists(st.integers(0, 50), max_size=4),  # ViT sequences
    st.integers(1, 500),  # tokens
    st.booleans(),  # does lengths_fn give the sequences?
)


@settings(max_examples=150, deadline=None)
@given(st.lists(SAMPLE, min_size=1, max_size=30))
def test_buffer_costs_are_those_of_the_given_sequences(samples):
    batch = [(i, sum(q), t, tuple(q) if give else None) for i, (q, t, give) in enumerate(samples)]
    got = _buffer_lengths(batch)
    # a sample without sequences is one sequence of its whole ViT load
    seqs = [q if give else ([sum(q)] if sum(q) else []) for q, _, give in samples]
    offsets = np.concatenate([[0], np.cumsum([len(q) for q in seqs])]).astype(np.int64)
    want = Lengths(
        np.array([sum(q) for q, _, _ in samples]),
        np.array([t for _, t, _ in samples]),
        vit_seqlens=np.array([x for q in seqs for x in q], np.int64),
        vit_seqlens_offsets=offsets,
    )
    model = CostModel(vit_linear=1.0, vit_quadratic=0.5, llm_linear=2.0, llm_quadratic=0.01, per_sample=3.0)
    np.testing.assert_array_equal(model.sample_costs(got), model.sample_costs(want))
    if not any(give for _, _, give in samples):
        assert got.vit_seqlens is None


def test_lengths_fn_sequences_are_checked():
    source = [{"v": 6, "t": 10, "q": [2, 4]}, {"v": 6, "t": 10, "q": [2, 3]}]
    packer = BalancedPacker(
        source, lambda s: (s["v"], s["t"], s["q"]), options=PlanOptions(vit_capacity=12, llm_capacity=40)
    )
    with pytest.raises(ValueError, match=r"sample 1: vit_seqlens \[2, 3\] must be non-negative and sum to its ViT"):
        list(packer)
    bad = BalancedPacker(
        source, lambda s: (s["v"], s["t"], [2.5, 3.5]), options=PlanOptions(vit_capacity=12, llm_capacity=40)
    )
    with pytest.raises(TypeError, match="sample 0: vit_seqlens must be a sequence of integers"):
        list(bad)
    four = BalancedPacker(
        source, lambda s: (s["v"], s["t"], s["q"], 1), options=PlanOptions(vit_capacity=12, llm_capacity=40)
    )
    with pytest.raises(TypeError, match=r"sample 0: lengths_fn must return \(vit, llm\) or \(vit, llm, vit_seqlens\)"):
        list(four)


def test_packer_with_sequences_yields_every_sample_once():
    lengths = synthetic_lengths("video_mix", 3000, seed=1)
    offsets, flat = lengths.vit_seqlens_offsets, lengths.vit_seqlens
    source = [
        {"id": i, "v": int(lengths.vit[i]), "t": int(lengths.llm[i]), "q": flat[offsets[i] : offsets[i + 1]].tolist()}
        for i in range(len(lengths))
    ]
    caps = search_capacity(
        lengths,
        PlanOptions(target_batch_size=4),
        world_size=1,
    )
    packer = BalancedPacker(
        source,
        lambda s: (s["v"], s["t"], s["q"]),
        buffer_size=500,
        options=PlanOptions(vit_capacity=caps.vit_capacity, llm_capacity=caps.llm_capacity, drop_last=False),
    )
    ids = sorted(s["id"] for pack in packer for s in pack)
    assert ids == list(range(len(lengths)))


@pytest.mark.filterwarnings("ignore:target_batch_size")
def test_streaming_balances_the_cost_its_report_measures():
    """Planned from loads alone, a video's frame groups are charged as one sequence, and the epoch under the
    per-group cost lands far from the ideal; planned with them, close to it."""
    lengths = synthetic_lengths("video_mix", 20_000, seed=0)
    model = named_cost_model("qwen2_vl_7b")
    caps = search_capacity(
        lengths,
        PlanOptions(target_batch_size=4),
        world_size=8,
    )
    options = PlanOptions(vit_capacity=caps.vit_capacity, llm_capacity=caps.llm_capacity, cost_model=model)

    def stream_epoch(items):
        plans = list(_plan_stream(items, options, 8, 4096, 0, 0, 1))
        return balance_report(_merge(plans, options, 8, len(lengths)), lengths, model).epoch_over_ideal

    offsets, flat = lengths.vit_seqlens_offsets.tolist(), lengths.vit_seqlens.tolist()
    loads = list(zip(range(len(lengths)), lengths.vit.tolist(), lengths.llm.tolist()))
    seen = stream_epoch([(*x, tuple(flat[offsets[i] : offsets[i + 1]])) for i, x in enumerate(loads)])
    blind = stream_epoch([(*x, None) for x in loads])
    assert seen < 1.01 < blind
