"""A plain ``PackCollator()`` batch fed to a real transformers causal LM as ``model(**batch)`` trains the per-sample
loss: the samples' token losses, each sample run alone, summed and divided by the total target count.

Models: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` built from their default configs, shrunk (2 layers, hidden
64, 4 heads, 2 KV heads), float32 on the CPU; ``use_cache`` stays at the config default (on), as a user's own
training loop leaves it. Each sample alone is the model's ordinary unpacked forward (batch of one, the model
numbers the positions); its token losses are cross-entropy of the logits, summed, so the reference does not go
through transformers' loss. Loss and gradients match within ``RTOL``; the negative control (the same batch with
``use_cache=True``, what a batch without the key gets from the config) fails the same comparison: transformers
then builds a cache and, with a cache, skips packed-sequence detection, so the samples attend to each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

from omnibal_kernels import BalancedBatchSampler, PlanOptions  # noqa: E402
from omnibal_kernels.packing import PackCollator, PackOptions, pack_batch  # noqa: E402
from omnibal_kernels.testing.hf_models import lengths_of  # noqa: E402

# float32: the packed and the unpacked runs differ in summation order only; a leak across one boundary moves the
# loss by about 1e-4 relative or more and the gradients by far more
RTOL = 1e-5
VOCAB = 256
SHRINK = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
# off the usual block sizes, a one-token sample (no target) and one whose labels are all masked
LENGTHS = (37, 1, 60, 5, 22, 13)
COLLATORS = {
    "plain": lambda: PackCollator(warmup=False),
    "pad_to_multiple_of": lambda: PackCollator(options=PackOptions(pad_to_multiple_of=64), warmup=False),
    "pad_to_length": lambda: PackCollator(options=PackOptions(pad_to_length=256), warmup=False),
    "pack_batch": lambda: pack_batch,
}


def _config(name: str, vocab: int = VOCAB) -> Any:
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[name]
    return cls(vocab_size=vocab, **SHRINK)


def _model(config: Any, attn: str, mode: str = "train") -> Any:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    assert model.config.use_cache is True  # the default, which the batch must make harmless
    return model.train(mode == "train")


def _samples(lengths: tuple[int, ...], seed: int, vocab: int = VOCAB) -> list[dict[str, torch.Tensor]]:
    """Random tokens; a random prompt prefix of each sample's labels masked (sample 4: all of it)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.tensor(rng.integers(3, vocab, n))
        labels = ids.clone()
        labels[: n if i == 4 else int(rng.integers(0, n))] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


def _targets(samples: list[dict[str, torch.Tensor]]) -> int:
    return sum(int((s["labels"][1:] != -100).sum()) for s in samples)


def _grads(model: Any) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _per_sample(model: Any, samples: list[dict[str, torch.Tensor]]) -> tuple[float, dict[str, torch.Tensor]]:
    """The reference: every sample alone, its token losses summed over all samples / the total target count."""
    model.zero_grad(set_to_none=True)
    total = sum(
        F.cross_entropy(model(input_ids=s["input_ids"][None]).logits[0, :-1], s["labels"][1:], reduction="sum")
        for s in samples
    )
    loss = total / _targets(samples)
    loss.backward()
    return float(loss.detach()), _grads(model)


def _packed(model: Any, batches: list[Any]) -> tuple[float, dict[str, torch.Tensor]]:
    """``model(**batch).loss`` summed over ``batches`` (micro-steps of one optimizer step) and its gradients."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        total += float(loss.detach())
    return total, _grads(model)


def _relative_errors(got: tuple[float, dict], want: tuple[float, dict]) -> tuple[float, float]:
    """``(loss error, largest gradient error)``, each relative to the reference; a parameter's gradient error is
    relative to its reference norm, or to 1e-3 of the largest one where the reference is smaller (an exact zero:
    a pack whose only targets follow one-token prefixes gives the query and key weights none)."""
    (got_loss, got_grads), (want_loss, want_grads) = got, want
    assert got_grads.keys() == want_grads.keys()
    floor = 1e-3 * max(float(g.norm()) for g in want_grads.values())
    grad = max(float((got_grads[k] - g).norm()) / max(float(g.norm()), floor) for k, g in want_grads.items())
    return abs(got_loss - want_loss) / abs(want_loss), grad


@pytest.mark.parametrize("collator", list(COLLATORS))
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_generic_batch_trains_the_per_sample_loss(name: str, attn: str, mode: str, collator: str) -> None:
    model = _model(_config(name), attn, mode)
    samples = _samples(LENGTHS, seed=1)
    batch = COLLATORS[collator]()(samples)
    assert batch["use_cache"] is False
    loss_err, grad_err = _relative_errors(_packed(model, [batch]), _per_sample(model, samples))
    assert loss_err <= RTOL and grad_err <= RTOL, (loss_err, grad_err)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_planned_batches_train_the_step_loss(name: str, attn: str) -> None:
    """Batches of ``sampler.wrap(dataset)``: each micro-step's loss over the step's ``num_items_in_batch``, summed
    over the step's micro-steps, is the per-sample token mean of the optimizer step, gradients included."""
    micro_steps = 2
    data = _samples(tuple(np.random.default_rng(5).integers(1, 40, 24).tolist()), seed=2)
    options = PlanOptions(vit_capacity=0, llm_capacity=80, seed=3)
    sampler = BalancedBatchSampler(
        lengths_of(data), options=options, world_size=1, rank=0, micro_steps_per_step=micro_steps
    )
    loader = torch.utils.data.DataLoader(
        sampler.wrap(data), batch_sampler=sampler, collate_fn=PackCollator(warmup=False)
    )
    batches, steps = list(loader), sampler.rank_batches()
    assert len(batches) == len(steps) >= 2 * micro_steps
    model = _model(_config(name), attn)
    for first in range(0, 2 * micro_steps, micro_steps):
        step = [data[i] for ids in steps[first : first + micro_steps] for i in ids]
        micro = batches[first : first + micro_steps]
        assert all(int(b["num_items_in_batch"]) == _targets(step) for b in micro)
        loss_err, grad_err = _relative_errors(_packed(model, micro), _per_sample(model, step))
        assert loss_err <= RTOL and grad_err <= RTOL, (first, loss_err, grad_err)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_a_cache_lets_the_samples_attend_to_each_other(name: str, attn: str) -> None:
    """The negative control: with ``use_cache`` on, the same batch gives another loss; the batch's own setting
    cannot be overridden beside it."""
    model = _model(_config(name), attn)
    samples = _samples(LENGTHS, seed=1)
    batch = PackCollator(warmup=False)(samples)
    cached = {**batch, "use_cache": True}
    loss_err, grad_err = _relative_errors(_packed(model, [cached]), _per_sample(model, samples))
    assert loss_err > RTOL and grad_err > RTOL, (loss_err, grad_err)
    with pytest.raises(TypeError, match="use_cache"):
        model(**batch, use_cache=True)


def test_a_sample_cannot_turn_the_cache_on() -> None:
    """``use_cache`` is the batch's: a sample field of that name is an error, not a per-sample value."""
    samples = _samples((4, 3), seed=0)
    samples[1]["use_cache"] = True
    with pytest.raises(ValueError, match="sample 1 has a 'use_cache' field"):
        PackCollator(warmup=False)(samples)


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 32), min_size=1, max_size=6),
    pad=st.sampled_from([None, 8, 64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_pack_trains_the_per_sample_loss(lengths: list[int], pad: int | None, seed: int) -> None:
    samples = _samples(tuple(lengths), seed)
    if _targets(samples) == 0:  # no target in the pack: both means are 0 / 0
        return
    model = _model(_config("llama"), "sdpa")
    batch = PackCollator(options=PackOptions(pad_to_multiple_of=pad), warmup=False)(samples)
    loss_err, grad_err = _relative_errors(_packed(model, [batch]), _per_sample(model, samples))
    assert loss_err <= RTOL and grad_err <= RTOL, (loss_err, grad_err)


def _other_config(name: str) -> Any:
    small = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, **small)
    if name == "gpt_neox":
        return transformers.GPTNeoXConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, **small
        )
    cls = {
        "mistral": transformers.MistralConfig,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
        "olmo2": transformers.Olmo2Config,
    }[name]
    extra = {"head_dim": 16} if name == "gemma" else {}
    return cls(**SHRINK, **small, **extra)


@pytest.mark.parametrize("name", ["mistral", "qwen3", "gemma", "olmo2", "gpt_neox", "gpt2"])
def test_other_causal_lms_train_the_per_sample_loss(name: str) -> None:
    """Further architectures, default configs shrunk, eval mode (GPT-2's default dropout would differ between
    the runs in train mode)."""
    model = _model(_other_config(name), "sdpa", "eval")
    samples = _samples(LENGTHS, seed=4)
    batch = PackCollator(options=PackOptions(pad_to_multiple_of=16), warmup=False)(samples)
    loss_err, grad_err = _relative_errors(_packed(model, [batch]), _per_sample(model, samples))
    assert loss_err <= RTOL and grad_err <= RTOL, (loss_err, grad_err)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_generic_batch_trains_internvl_per_sample(attn: str) -> None:
    """A vision-language model whose text model takes 1-D positions (InternVL: tiles in ``pixel_values``) trains
    the per-sample loss from the plain collator's batch as well."""
    from omnibal_kernels.testing.hf_models import alone, internvl_sample, tiny_model

    rng = np.random.default_rng(3)
    samples = [internvl_sample(rng, tiles) for tiles in (2, 0, 1, 3)]
    model = tiny_model("internvl", attn)
    assert model.config.text_config.use_cache is True
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for s in samples:
        inputs = {k: v for k, v in alone(s).items() if k not in ("labels", "use_cache")}
        logits = model(**inputs).logits[0]
        total = total + F.cross_entropy(logits[:-1], s["labels"][1:], reduction="sum")
    loss = total / _targets(samples)
    loss.backward()
    want = (float(loss.detach()), _grads(model))
    loss_err, grad_err = _relative_errors(_packed(model, [PackCollator(warmup=False)(samples)]), want)
    assert loss_err <= RTOL and grad_err <= RTOL, (loss_err, grad_err)
