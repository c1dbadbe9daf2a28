"""varlen_attention against a per-sequence explicit-softmax reference: values, gradients, errors, backends."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import attention
from omnibal_kernels.attention import available_backends, varlen_attention
from omnibal_kernels.testing import varlen_attention_reference

# float32 attention against a float64 reference: a few ulps of the O(1) outputs
ATOL_F32 = 1e-5
RTOL_F32 = 1e-5


def _cu(lengths: list[int], device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)


def _qkv(
    total: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype=torch.float32,
    device="cpu",
    total_k: int | None = None,
    seed: int = 0,
):
    gen = torch.Generator().manual_seed(seed)
    total_k = total if total_k is None else total_k
    q = torch.randn(total, heads, head_dim, generator=gen, dtype=torch.float32)
    k = torch.randn(total_k, kv_heads, head_dim, generator=gen, dtype=torch.float32)
    v = torch.randn(total_k, kv_heads, head_dim, generator=gen, dtype=torch.float32)
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v))


LENGTH_CASES = {
    "edge": [0, 1, 97],
    "batch1": [97],
    "single_token": [1],
    "zeros_between": [5, 0, 0, 17, 3, 64, 0],
    "off_block": [113, 31, 1, 2, 65],
    # distinct lengths: one SDPA call per segment in the sdpa backend
    "spread": [200, 150, 99, 60, 41, 20, 9, 4, 1, 180, 7],
    # equal lengths back to back (one call over a view) and scattered among others (one gathered call)
    "tiles": [16, 16, 16, 16, 16],
    "equal_scattered": [16, 5, 16, 0, 16, 3, 5, 16],
}


@pytest.mark.parametrize("case", sorted(LENGTH_CASES))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_sdpa_matches_reference(case: str, causal: bool, heads: int, kv_heads: int) -> None:
    lengths = LENGTH_CASES[case]
    cu = _cu(lengths)
    q, k, v = _qkv(sum(lengths), heads, kv_heads, 16)
    out = varlen_attention(q, k, v, cu, max(lengths), causal=causal, backend="sdpa")
    ref = varlen_attention_reference(q, k, v, cu, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, atol=ATOL_F32, rtol=RTOL_F32)


def test_random_lengths_match_reference() -> None:
    rng = np.random.default_rng(7)
    for trial in range(4):
        lengths = rng.integers(0, 80, size=rng.integers(1, 12)).tolist()
        cu = _cu(lengths)
        q, k, v = _qkv(sum(lengths), 4, 2, 8, seed=trial)
        causal = bool(trial % 2)
        out = varlen_attention(q, k, v, cu, max(lengths), causal=causal)
        torch.testing.assert_close(
            out, varlen_attention_reference(q, k, v, cu, causal=causal), atol=ATOL_F32, rtol=RTOL_F32
        )


def test_sequences_do_not_see_each_other() -> None:
    # changing one sequence's tokens leaves every other sequence's output bit-for-bit unchanged
    lengths = [13, 40, 7]
    cu = _cu(lengths)
    q, k, v = _qkv(sum(lengths), 2, 2, 8)
    out = varlen_attention(q, k, v, cu, 40, causal=False)
    k2, v2 = k.clone(), v.clone()
    k2[13:53] += 1.0
    v2[13:53] -= 3.0
    out2 = varlen_attention(q, k2, v2, cu, 40, causal=False)
    assert torch.equal(out[:13], out2[:13]) and torch.equal(out[53:], out2[53:])
    assert not torch.allclose(out[13:53], out2[13:53])


def test_softmax_scale() -> None:
    lengths = [9, 30]
    cu = _cu(lengths)
    q, k, v = _qkv(39, 2, 1, 8)
    out = varlen_attention(q, k, v, cu, 30, softmax_scale=0.05)
    torch.testing.assert_close(
        out, varlen_attention_reference(q, k, v, cu, softmax_scale=0.05), atol=ATOL_F32, rtol=RTOL_F32
    )
    assert not torch.allclose(out, varlen_attention(q, k, v, cu, 30), atol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_different_query_and_key_lengths(causal: bool) -> None:
    # includes more queries than keys (bottom-right causal leaves the first queries with no key), a
    # segment with keys but no queries, and one with queries but no keys
    lengths_q = [5, 12, 1, 0, 7, 30]
    lengths_k = [9, 4, 1, 6, 0, 30]
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    q, k, v = _qkv(sum(lengths_q), 4, 2, 8, total_k=sum(lengths_k))
    out = varlen_attention(q, k, v, cu_q, 30, causal=causal, cu_seqlens_k=cu_k, max_seqlen_k=30)
    ref = varlen_attention_reference(q, k, v, cu_q, causal=causal, cu_seqlens_k=cu_k)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=ATOL_F32, rtol=RTOL_F32)
    # queries 6..12 of the second segment see keys; queries 0..7 there see none under causal
    assert bool((out[5:13] == 0).all()) == causal
    assert bool((out[18:25] == 0).all())  # keyless segment: zeros


def test_bfloat16_error_within_twice_torch_error() -> None:
    # flash-attention's rule: our low-precision error at most 2x that of plain torch in the same dtype
    lengths = [0, 1, 97, 50]
    cu = _cu(lengths)
    q, k, v = _qkv(sum(lengths), 4, 2, 32)
    ref = varlen_attention_reference(q, k, v, cu).double()
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    ours = varlen_attention(qb, kb, vb, cu, 97).double()
    torch_same_dtype = torch.cat(
        [
            F.scaled_dot_product_attention(
                qb[s:e].transpose(0, 1),
                kb[s:e].repeat_interleave(2, 1).transpose(0, 1),
                vb[s:e].repeat_interleave(2, 1).transpose(0, 1),
                is_causal=True,
            ).transpose(0, 1)
            for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())
        ]
    ).double()
    ours_err = (ours - ref).abs().max().item()
    torch_err = (torch_same_dtype - ref).abs().max().item()
    assert 0 < torch_err and ours_err <= 2 * torch_err + 1e-6


@pytest.mark.slow
def test_gradcheck_float64() -> None:
    lengths = [3, 0, 1, 5]
    cu = _cu(lengths)
    q, k, v = _qkv(9, 2, 1, 4, dtype=torch.float64)
    for causal in (True, False):
        inputs = tuple(x.clone().requires_grad_() for x in (q, k, v))
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: varlen_attention(a, b, c, cu, 5, causal=causal), inputs
        )


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_reference(causal: bool) -> None:
    lengths = [0, 1, 97, 20, 45]
    cu = _cu(lengths)
    base = _qkv(sum(lengths), 4, 2, 16)
    grad_out = torch.randn(sum(lengths), 4, 16, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (
        lambda a, b, c: varlen_attention(a, b, c, cu, 97, causal=causal),
        lambda a, b, c: varlen_attention_reference(a, b, c, cu, causal=causal),
    ):
        inputs = [x.clone().requires_grad_() for x in base]
        fn(*inputs).backward(grad_out)
        grads.append([x.grad for x in inputs])
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=8),
    same_keys=st.booleans(),
    causal=st.booleans(),
    heads=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
    seed=st.integers(0, 2**16),
)
def test_sdpa_values_and_gradients_match_the_per_sequence_reference(
    pairs: list[tuple[int, int]], same_keys: bool, causal: bool, heads: tuple[int, int], seed: int
) -> None:
    """Any lengths (0 and 1 included, queries and keys apart or equal, repeated lengths that share one call):
    the CPU path's outputs and the gradients of q, k and v equal those of each sequence attended alone."""
    lengths_q = [a for a, _ in pairs]
    lengths_k = lengths_q if same_keys else [b for _, b in pairs]
    cu_q, cu_k = _cu(lengths_q), _cu(lengths_k)
    base = _qkv(sum(lengths_q), heads[0], heads[1], 8, total_k=sum(lengths_k), seed=seed)
    grad_out = torch.randn(sum(lengths_q), heads[0], 8, generator=torch.Generator().manual_seed(seed + 1))
    keys = {} if same_keys else dict(cu_seqlens_k=cu_k, max_seqlen_k=max(lengths_k))
    results = []
    for fn in (
        lambda a, b, c: varlen_attention(a, b, c, cu_q, max(lengths_q), causal=causal, backend="sdpa", **keys),
        lambda a, b, c: varlen_attention_reference(
            a, b, c, cu_q, causal=causal, cu_seqlens_k=None if same_keys else cu_k
        ),
    ):
        inputs = [x.clone().requires_grad_() for x in base]
        out = fn(*inputs)
        out.backward(grad_out)
        results.append([out.detach()] + [x.grad for x in inputs])
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_empty_batch_of_zero_length_sequences() -> None:
    q, k, v = (x.requires_grad_() for x in _qkv(0, 2, 2, 8))
    out = varlen_attention(q, k, v, _cu([0, 0]), 0)
    assert out.shape == (0, 2, 8)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_validate_false_gives_same_result() -> None:
    lengths = [4, 0, 19]
    cu = _cu(lengths)
    q, k, v = _qkv(23, 2, 2, 8)
    assert torch.equal(varlen_attention(q, k, v, cu, 19), varlen_attention(q, k, v, cu, 19, validate=False))


def test_auto_uses_sdpa_for_cpu() -> None:
    assert "sdpa" in available_backends()
    lengths = [4, 11]
    cu = _cu(lengths)
    q, k, v = _qkv(15, 2, 2, 8)
    assert torch.equal(varlen_attention(q, k, v, cu, 11), varlen_attention(q, k, v, cu, 11, backend="sdpa"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=40))
def test_length_groups_hold_every_live_segment_once_at_one_length(pairs: list[tuple[int, int]]) -> None:
    lens_q, lens_k = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    groups = attention._length_groups(lens_q, lens_k)
    members = np.concatenate(groups) if groups else np.array([], dtype=np.int64)
    assert sorted(members.tolist()) == np.flatnonzero((lens_q > 0) & (lens_k > 0)).tolist()
    for group in groups:
        assert len(set(lens_q[group].tolist())) == 1 and len(set(lens_k[group].tolist())) == 1
        assert (np.diff(group) > 0).all()  # packed order within a group
    # one group per distinct pair: segments of one length are never split over calls
    assert len(groups) == len({p for p in pairs if p[0] > 0 and p[1] > 0})


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_backend_pads_nothing(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """Every SDPA call of the sdpa backend sees segments of one length and no padded row: the query rows and
    key columns it is given add up to each segment's own, so a pack costs what its segments cost."""
    calls: list[tuple[int, ...]] = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        calls.append((q.shape[0], q.shape[2], k.shape[2]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    lengths = [200, 16, 3, 16, 101, 16, 0, 7]
    q, k, v = _qkv(sum(lengths), 4, 2, 8)
    out = varlen_attention(q, k, v, _cu(lengths), 200, causal=causal, backend="sdpa")
    torch.testing.assert_close(
        out, varlen_attention_reference(q, k, v, _cu(lengths), causal=causal), atol=ATOL_F32, rtol=RTOL_F32
    )
    assert sum(n * lq for n, lq, _ in calls) == sum(lengths)
    assert sum(n * lq * lk for n, lq, lk in calls) == sum(x * x for x in lengths)
    assert sorted(calls) == [(1, 3, 3), (1, 7, 7), (1, 101, 101), (1, 200, 200), (3, 16, 16)]


# ----------------------------------------------------------------------------------------------------
# errors


def _valid_args():
    lengths = [3, 5]
    q, k, v = _qkv(8, 4, 2, 8)
    return dict(q=q, k=k, v=v, cu_seqlens=_cu(lengths), max_seqlen=5)


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(cu_seqlens=torch.tensor([0, 3, 8])), TypeError, "cu_seqlens must have dtype torch.int32"),
        (dict(cu_seqlens=[0, 3, 8]), TypeError, "cu_seqlens must be a torch.Tensor"),
        (dict(cu_seqlens=torch.tensor([[0, 3, 8]], dtype=torch.int32)), ValueError, r"cu_seqlens must have shape"),
        (dict(cu_seqlens=torch.tensor([8], dtype=torch.int32)), ValueError, r"cu_seqlens must have shape"),
        (dict(cu_seqlens=torch.tensor([1, 3, 8], dtype=torch.int32)), ValueError, "cu_seqlens must start at 0"),
        (
            dict(cu_seqlens=torch.tensor([0, 6, 3, 8], dtype=torch.int32)),
            ValueError,
            r"non-decreasing, but cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 6",
        ),
        (
            # the int32 difference -2e9 - 2e9 wraps around to a positive number: the check works in int64
            dict(cu_seqlens=torch.tensor([0, 2_000_000_000, -2_000_000_000, 8], dtype=torch.int32)),
            ValueError,
            r"sequence 1: cu_seqlens must be non-decreasing, but cu_seqlens\[2\] = -2000000000",
        ),
        (
            dict(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32)),
            ValueError,
            r"cu_seqlens must end at the number of tokens \(8\), got cu_seqlens\[-1\] = 7",
        ),
        (dict(max_seqlen=4), ValueError, r"max_seqlen = 4 is smaller than the longest segment"),
        (dict(max_seqlen=5.0), TypeError, "max_seqlen must be a Python int"),
        (dict(max_seqlen=-1), ValueError, "max_seqlen must be >= 0"),
        (dict(q=torch.randn(8, 32)), ValueError, r"q must have shape \(total_tokens, heads, head_dim\)"),
        (dict(q=torch.ones(8, 4, 8, dtype=torch.int64)), TypeError, "q must be a floating-point tensor"),
        (dict(k=torch.randn(8, 3, 8), v=torch.randn(8, 3, 8)), ValueError, r"multiple of k/v heads \(3\)"),
        (dict(v=torch.randn(8, 2, 4)), ValueError, "k and v must have the same shape"),
        (dict(k=torch.randn(8, 2, 4), v=torch.randn(8, 2, 4)), ValueError, "same head_dim"),
        (dict(k=torch.randn(9, 2, 8), v=torch.randn(9, 2, 8)), ValueError, "pass cu_seqlens_k"),
        (dict(k=torch.randn(8, 2, 8, dtype=torch.float64)), TypeError, "share a dtype"),
        (dict(backend="triton"), ValueError, "backend must be one of"),
        (dict(backend="flash_attn"), RuntimeError, "backend 'flash_attn' cannot be used"),
        (dict(backend="torch_varlen"), RuntimeError, "backend 'torch_varlen' cannot be used"),
        (dict(dropout_p=1.0), ValueError, "dropout_p"),
        (dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
        (
            dict(cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32), max_seqlen_k=8),
            ValueError,
            "cu_seqlens_k has 2 entries but cu_seqlens has 3",
        ),
        (
            dict(cu_seqlens_k=torch.tensor([0, 4, 8], dtype=torch.int32)),
            ValueError,
            "cu_seqlens_k given without max_seqlen_k",
        ),
        (
            dict(cu_seqlens_k=torch.tensor([0, 4, 9], dtype=torch.int32), max_seqlen_k=5),
            ValueError,
            r"cu_seqlens_k must end at the number of tokens \(8\), got cu_seqlens_k\[-1\] = 9",
        ),
        (
            dict(cu_seqlens_k=torch.tensor([0, 2, 8], dtype=torch.int32), max_seqlen_k=5),
            ValueError,
            r"max_seqlen_k = 5 is smaller than the longest segment in cu_seqlens_k \(6\)",
        ),
        (dict(max_seqlen_k=7), ValueError, "max_seqlen_k given without cu_seqlens_k"),
    ],
)
def test_bad_input_names_the_argument(change: dict, error: type, match: str) -> None:
    args = _valid_args()
    args.update(change)
    with pytest.raises(error, match=match):
        varlen_attention(**args)


def test_cuda_backend_rejects_cpu_tensors_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # even with the module importable, a CPU tensor is refused by name, not sent to a CUDA kernel
    monkeypatch.setattr(attention, "_flash_attn_varlen_func", lambda: lambda *a, **kw: None)
    with pytest.raises(RuntimeError, match="only on CUDA tensors, got q on cpu"):
        varlen_attention(**_valid_args(), backend="flash_attn")


# ----------------------------------------------------------------------------------------------------
# the torch varlen adapter, against stand-ins with the older and the newer signature (runs on CPU)


def _fake_varlen_old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.9/2.10 shape: is_causal, no scale (1/sqrt(d) always), no GQA."""
    assert key.shape[1] == query.shape[1], "the old signature has no enable_gqa"
    return varlen_attention_reference(query, key, value, cu_seq_q, causal=is_causal, cu_seqlens_k=cu_seq_k)


def _fake_varlen_new(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    """torch >= 2.12 shape: window_size instead of is_causal, scale, enable_gqa."""
    assert tuple(window_size) in ((-1, -1), (-1, 0))
    assert enable_gqa or key.shape[1] == query.shape[1]
    return varlen_attention_reference(
        query, key, value, cu_seq_q, causal=tuple(window_size) == (-1, 0), softmax_scale=scale, cu_seqlens_k=cu_seq_k
    )


@pytest.mark.parametrize("fake", [_fake_varlen_old, _fake_varlen_new], ids=["old_signature", "new_signature"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [None, 0.1])
def test_torch_varlen_adapter_maps_signatures(monkeypatch, fake, causal: bool, scale: float | None) -> None:
    params = frozenset(inspect.signature(fake).parameters)
    monkeypatch.setattr(attention, "_torch_varlen_attn", lambda: (fake, params))
    lengths = [0, 6, 1, 20]
    cu = _cu(lengths)
    q, k, v = _qkv(27, 4, 2, 8)
    used_scale = 1 / math.sqrt(8) if scale is None else scale
    out = attention._torch_varlen(q, k, v, cu, cu, 20, 20, causal, used_scale)
    ref = varlen_attention_reference(q, k, v, cu, causal=causal, softmax_scale=scale)
    torch.testing.assert_close(out, ref, atol=ATOL_F32, rtol=RTOL_F32)


def test_installed_torch_varlen_signature_is_understood() -> None:
    found = attention._torch_varlen_attn()
    if found is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    _, params = found
    assert "window_size" in params or "is_causal" in params


# ----------------------------------------------------------------------------------------------------
# CUDA backends (run with `pytest -m gpu` on a CUDA machine)


def _cuda_case(backend: str, dtype: torch.dtype, causal: bool, heads: int, kv_heads: int) -> None:
    lengths = [0, 1, 97, 1023, 1025, 128]
    cu = _cu(lengths, "cuda")
    q32, k32, v32 = _qkv(sum(lengths), heads, kv_heads, 64, device="cuda")
    ref = varlen_attention_reference(q32, k32, v32, cu, causal=causal).double()
    q, k, v = (x.to(dtype).requires_grad_() for x in (q32, k32, v32))
    out = varlen_attention(q, k, v, cu, 1025, causal=causal, backend=backend)
    assert out.dtype == dtype and out.shape == q.shape
    group = heads // kv_heads
    same_dtype = torch.cat(
        [
            F.scaled_dot_product_attention(
                q[s:e].detach().transpose(0, 1),
                k[s:e].detach().repeat_interleave(group, 1).transpose(0, 1),
                v[s:e].detach().repeat_interleave(group, 1).transpose(0, 1),
                is_causal=causal,
            ).transpose(0, 1)
            for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())
        ]
    ).double()
    ours_err = (out.detach().double() - ref).abs().max().item()
    torch_err = (same_dtype - ref).abs().max().item()
    assert ours_err <= 2 * torch_err + 1e-5, (ours_err, torch_err)
    # gradients against the sdpa backend in float32
    grad = torch.randn_like(out)
    out.backward(grad)
    q2, k2, v2 = (x.clone().requires_grad_() for x in (q32, k32, v32))
    varlen_attention(q2, k2, v2, cu, 1025, causal=causal, backend="sdpa").backward(grad.float())
    for ours, ref_grad in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        scale = ref_grad.abs().max().item()
        assert (ours.double() - ref_grad.double()).abs().max().item() <= 0.05 * scale + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 2)])
def test_torch_varlen_on_cuda(dtype, causal, heads, kv_heads) -> None:
    if attention._torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    _cuda_case("torch_varlen", dtype, causal, heads, kv_heads)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 2)])
def test_flash_attn_on_cuda(causal, heads, kv_heads) -> None:
    pytest.importorskip("flash_attn")
    _cuda_case("flash_attn", torch.bfloat16, causal, heads, kv_heads)


@pytest.mark.gpu
def test_sdpa_backend_on_cuda_float32() -> None:
    lengths = [0, 1, 97, 1025, 33]
    cu = _cu(lengths, "cuda")
    q, k, v = _qkv(sum(lengths), 8, 2, 64, device="cuda")
    out = varlen_attention(q, k, v, cu, 1025, backend="sdpa")
    # TF32 may be on for CUDA matmuls: a looser bound than on CPU, still far below any leakage
    torch.testing.assert_close(out, varlen_attention_reference(q, k, v, cu), atol=2e-3, rtol=2e-3)
