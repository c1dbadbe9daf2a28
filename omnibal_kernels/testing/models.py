"""A tiny causal language model and its loss, for proving that packing changes nothing and for examples.

The blocks run attention through :func:`omnibal_kernels.attention.varlen_attention` on packed batches, so a
packed batch and the same samples one at a time can be compared exactly.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import varlen_attention

# ----------------------------------------------------------------------------------------------------
# a tiny causal language model, for proving that packing changes nothing and for end-to-end examples


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy with the Hugging Face shift: ``logits[..., i, :]`` predicts ``labels[..., i + 1]``.

    logits: ``(batch, seq, vocab)``; labels: ``(batch, seq)``, -100 where no target. Labels are *not*
    pre-shifted (they equal ``input_ids`` where defined). In a packed row, -100 on the first token of
    every sequence is what keeps the last token of one sequence from being trained to predict the first
    token of the next. ``reduction``: ``"sum"`` over targets, or ``"mean"`` (sum / number of targets).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    shifted_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1]).float()
    shifted_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shifted_logits, shifted_labels, ignore_index=-100, reduction=reduction)


def count_lm_targets(labels: torch.Tensor) -> int:
    """Number of targets :func:`causal_lm_loss` averages over: labels other than -100 after the shift."""
    return int((labels[:, 1:] != -100).sum())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TinyBlock(nn.Module):
    """Pre-norm decoder block: rotary grouped-query attention and a SiLU-gated MLP."""

    inv_freq: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, hidden: int, heads: int, kv_heads: int, mlp_hidden: int, rope_base: float) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = hidden // heads
        self.attn_norm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, mlp_hidden, bias=False)
        self.up_proj = nn.Linear(hidden, mlp_hidden, bias=False)
        self.down_proj = nn.Linear(mlp_hidden, hidden, bias=False)
        inv_freq = 1.0 / rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotary(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        # x: (batch, seq, heads, head_dim); position_ids: (batch, seq)
        angles = position_ids.float()[..., None] * self.inv_freq  # (batch, seq, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
        return x * angles.cos().to(x.dtype) + _rotate_half(x) * angles.sin().to(x.dtype)

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        max_seqlen: int | None,
        attention_backend: str,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.attn_norm(x)
        q = self._rotary(self.q_proj(h).view(batch, seq, self.heads, self.head_dim), position_ids)
        k = self._rotary(self.k_proj(h).view(batch, seq, self.kv_heads, self.head_dim), position_ids)
        v = self.v_proj(h).view(batch, seq, self.kv_heads, self.head_dim)
        if cu_seqlens is None:
            # ordinary dense causal attention over (batch, seq): the unpacked model
            group = self.heads // self.kv_heads
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.repeat_interleave(group, dim=2).transpose(1, 2),
                v.repeat_interleave(group, dim=2).transpose(1, 2),
                is_causal=True,
            ).transpose(1, 2)
        else:
            assert max_seqlen is not None
            attn = varlen_attention(q[0], k[0], v[0], cu_seqlens, max_seqlen, causal=True, backend=attention_backend)[
                None
            ]
        x = x + self.o_proj(attn.reshape(batch, seq, -1))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyCausalLM(nn.Module):
    """A few-layer decoder-only language model (Llama-shaped: RMSNorm, rotary, GQA, gated MLP).

    Two ways to run it, which must agree on every sequence:

    * unpacked: ``input_ids (batch, seq)`` of equal-length samples, dense causal attention, positions
      ``0..seq-1`` unless ``position_ids`` is given;
    * packed: ``input_ids (1, total_tokens)`` with ``position_ids (1, total_tokens)`` restarting at 0 per
      sequence and ``cu_seqlens`` (int32, ``(batch + 1,)``) / ``max_seqlen``; attention goes through
      :func:`omnibal_kernels.attention.varlen_attention`.
    """

    def __init__(
        self,
        vocab_size: int = 64,
        hidden: int = 32,
        layers: int = 2,
        heads: int = 4,
        kv_heads: int = 2,
        mlp_hidden: int = 64,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__()
        if hidden % heads != 0 or (hidden // heads) % 2 != 0:
            raise ValueError(f"hidden ({hidden}) / heads ({heads}) must be an even head_dim")
        if heads % kv_heads != 0:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.embed = nn.Embedding(vocab_size, hidden)
        self.blocks = nn.ModuleList(TinyBlock(hidden, heads, kv_heads, mlp_hidden, rope_base) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        attention_backend: str = "auto",
    ) -> torch.Tensor:
        """Returns logits ``(batch, seq, vocab_size)`` for ``input_ids (batch, seq)``."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}")
        if cu_seqlens is not None:
            if input_ids.shape[0] != 1:
                raise ValueError(f"packed input_ids must have shape (1, total_tokens), got {tuple(input_ids.shape)}")
            if position_ids is None:
                raise ValueError("packed input needs position_ids restarting at 0 for every sequence")
            if max_seqlen is None:
                raise ValueError("packed input needs max_seqlen with cu_seqlens")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, cu_seqlens, max_seqlen, attention_backend)
        return self.lm_head(self.norm(x))


class RecordingLM(nn.Module):
    """A :class:`TinyCausalLM` that trains on packed batches and records the ``sample_id`` of every batch it sees
    (what a Trainer test compares between runs); ``forward`` returns ``{"loss": ...}`` as transformers expects.

    Args:
        seed: ``torch.manual_seed`` before the weights are made (None: the global generator as it is).
    """

    def __init__(self, seed: Optional[int] = None) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.lm = TinyCausalLM(vocab_size=64, hidden=16, layers=1, heads=2, kv_heads=1, mlp_hidden=32)
        self.seen: list[list[int]] = []

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        sample_id: torch.Tensor,
        **_: object,
    ) -> dict:
        self.seen.append(sample_id.tolist())
        logits = self.lm(input_ids, position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        return {"loss": causal_lm_loss(logits, labels)}
