"""Packing changes nothing but speed: a packed batch gives the loss and gradients of its samples run one by one.

The model is :class:`omnibal_kernels.testing.TinyCausalLM` (rotary positions from ``position_ids``, GQA
attention). Run unpacked, each sample is its own batch of one with ordinary dense causal attention;
run packed, all samples share one row, attention goes through ``varlen_attention`` with ``cu_seqlens``
and positions restart at 0 per sequence.

Label convention (the Hugging Face one): labels are not pre-shifted; the loss shifts them, so logits at
position ``i`` predict ``labels[i + 1]``. A packed row carries -100 on the first token of every sequence,
which removes exactly the one prediction that would cross a boundary (last token of a sequence ->
first token of the next). Loss: sum over targets, or that sum over the number of targets (token mean);
the unpacked run matches the token mean of the pack when each sample's *sum* is divided by the pack's
total target count (a mean of per-sample means is a different quantity and is not what packing computes).

Any leak between sequences (a wrong ``cu_seqlens``, a label that crosses a boundary) or lost positions
changes the result; the last tests show the same check failing on such batches. Measured margins on one
run: packed vs unpacked differ by ~5e-7 in logits, ~3e-8 relative in the loss and ~6e-7 relative in the
gradients; merging three sequences moves the loss by ~3e-4 relative and gradients by ~1x their size.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from omnibal_kernels.testing import TinyCausalLM, causal_lm_loss, count_lm_targets

# float32 throughout: the packed and unpacked runs differ only in summation order
LOSS_RTOL = 1e-6
GRAD_RTOL = 1e-5  # relative to the largest gradient entry of each parameter

LENGTHS = [1, 7, 97, 23, 2, 50, 16]
VOCAB = 64


def pack_local(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """The packed fields ``pack_batch`` produces, built one sample at a time (field names as in PackedBatch)."""
    ids, labels, positions, bounds = [], [], [], [0]
    for sample in samples:
        seq = torch.as_tensor(sample["input_ids"], dtype=torch.int64)
        ids.append(seq)
        lab = seq.clone()
        lab[0] = -100  # no prediction of this token from the previous sequence's last one
        labels.append(lab)
        positions.append(torch.arange(seq.numel()))
        bounds.append(bounds[-1] + seq.numel())
    return {
        "input_ids": torch.cat(ids)[None],
        "labels": torch.cat(labels)[None],
        "position_ids": torch.cat(positions)[None],
        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32),
        "max_seqlen": max(int(s.numel()) for s in ids),
    }


def _pack_batch(samples: list[dict[str, torch.Tensor]]) -> Any:
    try:
        from omnibal_kernels.packing import pack_batch
    except ModuleNotFoundError as err:
        if err.name != "omnibal_kernels.packing":
            raise
        pytest.skip("omnibal_kernels.packing is not in this tree yet")
    return pack_batch(samples)


@pytest.fixture(params=["local", "pack_batch"])
def pack(request: pytest.FixtureRequest) -> Callable[[list[dict[str, torch.Tensor]]], Any]:
    return pack_local if request.param == "local" else _pack_batch


def _samples(lengths: list[int], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, VOCAB, (n,), generator=gen)} for n in lengths]


def _model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM(vocab_size=VOCAB, hidden=32, layers=3, heads=4, kv_heads=2, mlp_hidden=64).float()


def _packed_run(model: TinyCausalLM, batch: Any) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, torch.Tensor]]:
    """Logits, token-mean loss, target count and parameter gradients of one packed forward/backward."""
    model.zero_grad(set_to_none=True)
    logits = model(
        batch["input_ids"],
        position_ids=batch["position_ids"],
        cu_seqlens=batch["cu_seqlens"],
        max_seqlen=batch["max_seqlen"],
        attention_backend="sdpa",
    )
    loss = causal_lm_loss(logits, batch["labels"], reduction="mean")
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits.detach(), loss.detach(), count_lm_targets(batch["labels"]), grads


def _unpacked_run(model: TinyCausalLM, samples: list[dict[str, torch.Tensor]]):
    """Per-sample logits, summed loss, target count and gradients of the token mean, one sample at a time."""
    model.zero_grad(set_to_none=True)
    total_targets = sum(int(s["input_ids"].numel()) - 1 for s in samples)
    logits, loss_sum = [], torch.zeros((), dtype=torch.float64)
    for sample in samples:
        ids = sample["input_ids"][None]
        out = model(ids)  # dense causal attention, positions 0..n-1
        sample_sum = causal_lm_loss(out, ids, reduction="sum")  # plain HF labels: labels = input_ids
        # gradient accumulation normalised by the whole pack's target count = gradient of the token mean
        (sample_sum / total_targets).backward()
        logits.append(out[0].detach())
        loss_sum += sample_sum.detach().double()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits, loss_sum, total_targets, grads


def assert_packed_matches_unpacked(model: TinyCausalLM, samples: list[dict[str, torch.Tensor]], batch: Any) -> None:
    """The check itself: same logits per sequence, same loss (sum and token mean), same gradients."""
    p_logits, p_loss, p_targets, p_grads = _packed_run(model, batch)
    u_logits, u_loss_sum, u_targets, u_grads = _unpacked_run(model, samples)
    start = 0
    for i, ref in enumerate(u_logits):
        # sliced by the samples' own lengths, so a batch with wrong cu_seqlens is still compared per sample
        torch.testing.assert_close(
            p_logits[0, start : start + ref.shape[0]],
            ref,
            atol=1e-5,
            rtol=1e-5,
            msg=lambda m, i=i: f"logits of sequence {i}: {m}",
        )
        start += ref.shape[0]
    assert p_targets == u_targets, f"packed labels have {p_targets} targets, the samples {u_targets}"
    torch.testing.assert_close(p_loss.double() * p_targets, u_loss_sum, atol=0.0, rtol=LOSS_RTOL)
    torch.testing.assert_close(p_loss.double(), u_loss_sum / u_targets, atol=0.0, rtol=LOSS_RTOL)
    for name, grad in u_grads.items():
        scale = grad.abs().max().item()
        assert scale > 0, f"{name} got no gradient: the check would be vacuous"
        torch.testing.assert_close(
            p_grads[name], grad, atol=GRAD_RTOL * scale, rtol=0.0, msg=lambda m, name=name: f"gradient of {name}: {m}"
        )


def test_packed_equals_one_at_a_time(pack) -> None:
    samples = _samples(LENGTHS)
    assert_packed_matches_unpacked(_model(), samples, pack(samples))


@pytest.mark.parametrize("lengths", [[97], [1, 1, 1, 5], [40, 3, 64, 64, 9]], ids=["batch1", "tiny", "mixed"])
def test_packed_equals_one_at_a_time_other_batches(pack, lengths: list[int]) -> None:
    samples = _samples(lengths, seed=len(lengths))
    assert_packed_matches_unpacked(_model(seed=1), samples, pack(samples))


def test_local_pack_fields() -> None:
    batch = pack_local(_samples([3, 1, 2]))
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"].tolist() == [0, 3, 4, 6]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1]]
    assert batch["labels"][0, [0, 3, 4]].tolist() == [-100, -100, -100]
    assert torch.equal(batch["labels"][0, [1, 2, 5]], batch["input_ids"][0, [1, 2, 5]])
    assert batch["max_seqlen"] == 3


# ----------------------------------------------------------------------------------------------------
# the check catches leakage


def test_merged_segments_fail_the_check() -> None:
    # cu_seqlens that glue sequences 1..3 into one segment: later tokens attend across the boundary
    samples = _samples(LENGTHS)
    batch = pack_local(samples)
    cu = batch["cu_seqlens"]
    batch["cu_seqlens"] = torch.cat([cu[:2], cu[4:]])
    batch["max_seqlen"] = int((batch["cu_seqlens"][1:] - batch["cu_seqlens"][:-1]).max())
    with pytest.raises(AssertionError, match="logits of sequence"):
        assert_packed_matches_unpacked(_model(), samples, batch)


@pytest.mark.slow
def test_one_segment_for_everything_fails_the_check() -> None:
    samples = _samples(LENGTHS)
    batch = pack_local(samples)
    total = batch["input_ids"].shape[1]
    batch["cu_seqlens"] = torch.tensor([0, total], dtype=torch.int32)
    batch["max_seqlen"] = total
    model = _model()
    # the loss itself moves, not only some logits
    p_loss = _packed_run(model, batch)[1]
    u_loss_sum, u_targets = _unpacked_run(model, samples)[1:3]
    assert abs(p_loss.item() - u_loss_sum.item() / u_targets) > 100 * LOSS_RTOL * abs(p_loss.item())
    with pytest.raises(AssertionError):
        assert_packed_matches_unpacked(model, samples, batch)


@pytest.mark.slow
def test_wrong_positions_fail_the_check() -> None:
    # a packer that loses position_ids (all zeros): rotary attention no longer sees token order.
    # (Positions that run on across the pack without restarting are *not* caught, and need not be:
    # rotary attention depends only on position differences within a segment, so a constant offset per
    # sequence changes nothing but rounding. Restarting positions matter for absolute position encodings.)
    samples = _samples(LENGTHS)
    batch = pack_local(samples)
    batch["position_ids"] = torch.zeros_like(batch["input_ids"])
    with pytest.raises(AssertionError, match="logits of sequence"):
        assert_packed_matches_unpacked(_model(), samples, batch)


@pytest.mark.slow
def test_labels_across_a_boundary_fail_the_check() -> None:
    samples = _samples(LENGTHS)
    batch = pack_local(samples)
    batch["labels"] = batch["input_ids"].clone()  # no -100 at sequence starts
    with pytest.raises(AssertionError, match="targets"):
        assert_packed_matches_unpacked(_model(), samples, batch)
