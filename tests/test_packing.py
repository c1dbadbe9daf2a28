"""pack_batch / PackedBatch / PackCollator against the plain reference in omnibal_kernels.testing."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import PackCollator, PackedBatch, pack_batch
from omnibal_kernels.packing import TEXT_FIELDS, PackOptions, pack_sequences
from omnibal_kernels.testing import pack_batch_reference

BACKENDS = ["numba", "torch"]


def _samples(lens: list[int], seed: int = 0, labels: bool = True, kind: str = "tensor") -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lens:
        ids = torch.randint(0, 50_000, (n,), generator=gen)
        sample: dict[str, Any] = {"input_ids": ids}
        if labels:
            sample["labels"] = torch.randint(0, 50_000, (n,), generator=gen)
        if kind == "numpy":
            sample = {k: v.numpy().astype(np.int32) for k, v in sample.items()}
        elif kind == "list":
            sample = {k: v.tolist() for k, v in sample.items()}
        out.append(sample)
    return out


def _assert_same(got: Any, want: dict[str, Any]) -> None:
    assert set(want) <= set(got)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[key], torch.Tensor), key
            assert got[key].dtype == value.dtype, key
            assert got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert type(got[key]) is type(value) and got[key] == value, key


def _options(**kw: Any) -> dict[str, Any]:
    """Split pack options into those the reference understands."""
    return {k: v for k, v in kw.items() if k not in ("backend", "allow_empty", "token_fields")}


def test_reference_by_hand() -> None:
    samples = [{"input_ids": [5, 6, 7], "labels": [15, 16, 17]}, {"input_ids": [8, 9]}]
    ref = pack_batch_reference(samples, pad_to_multiple_of=4)
    assert ref["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert ref["labels"].tolist() == [[-100, 16, 17, -100, 9, -100, -100, -100]]
    assert ref["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert ref["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    assert ref["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert ref["seq_lens"].tolist() == [3, 2, 3]
    assert ref["max_seqlen"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("lens", [[1], [7], [1, 1, 1], [97, 1023, 1025, 1], [113] * 16, [3, 1, 4, 1, 5, 9, 2, 6]])
def test_matches_reference(lens: list[int], backend: str, shared: bool) -> None:
    samples = _samples(lens)
    opts = PackOptions(backend=backend)
    got = pack_sequences([s["input_ids"] for s in samples], [s["labels"] for s in samples], options=opts, shared=shared)
    _assert_same(got, pack_batch_reference(samples))
    assert got["input_ids"].is_shared() == shared and got["seq_idx"].is_shared() == shared
    assert got["cu_seq_lens_q"] is got["cu_seqlens"] and got["cu_seq_lens_k"] is got["cu_seqlens"]


def test_pack_batch_fields_and_dtypes() -> None:
    samples = _samples([4, 2, 6])
    batch = pack_batch(samples)
    assert isinstance(batch, PackedBatch)
    assert list(batch) == list(TEXT_FIELDS)
    assert "attention_mask" not in batch
    assert batch["input_ids"].shape == (1, 12) and batch["input_ids"].dtype == torch.int64
    assert batch["labels"].dtype == torch.int64 and batch["position_ids"].dtype == torch.int64
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["seq_idx"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 4, 6, 12]
    assert type(batch["max_seqlen"]) is int and batch["max_seqlen"] == 6
    assert batch["max_length_q"] == batch["max_length_k"] == 6
    # the samples are not modified by the boundary labels
    assert samples[0]["labels"][0] != -100
    _assert_same(batch, pack_batch_reference(samples))


@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
@pytest.mark.parametrize("labels", [True, False])
def test_input_kinds(kind: str, labels: bool) -> None:
    samples = _samples([5, 1, 9], seed=3, labels=labels, kind=kind)
    _assert_same(pack_batch(samples), pack_batch_reference(samples))


def test_int32_and_mixed_labels() -> None:
    samples = _samples([6, 3, 4], seed=4)
    samples[0]["input_ids"] = samples[0]["input_ids"].int()
    samples[1]["labels"] = samples[1]["labels"].int()
    del samples[2]["labels"]
    batch = pack_batch(samples)
    assert batch["input_ids"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
    _assert_same(batch, pack_batch_reference(samples))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_boundary_mask(backend: str) -> None:
    samples = _samples([3, 4], seed=5)
    batch = pack_batch(samples, PackOptions(mask_first_label=False, ignore_index=-1, backend=backend))
    _assert_same(batch, pack_batch_reference(samples, mask_first_label=False, ignore_index=-1))
    assert batch["labels"][0, 0] == samples[0]["labels"][0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_is_its_own_segment(backend: str) -> None:
    samples = _samples([5, 6], seed=6)
    batch = pack_batch(samples, PackOptions(pad_to_multiple_of=8, pad_token_id=7, backend=backend))
    assert batch["input_ids"].shape == (1, 16)
    assert batch["cu_seqlens"].tolist() == [0, 5, 11, 16]
    assert batch["input_ids"][0, 11:].tolist() == [7] * 5
    assert batch["labels"][0, 11:].tolist() == [-100] * 5
    assert batch["position_ids"][0, 11:].tolist() == [0, 1, 2, 3, 4]
    assert batch["seq_idx"][0, 11:].tolist() == [2] * 5
    # no padding segment when the total is already a multiple
    assert pack_batch(samples, PackOptions(pad_to_multiple_of=11, backend=backend))["cu_seqlens"].tolist() == [0, 5, 11]


@pytest.mark.parametrize("backend", BACKENDS)
def test_static_shapes(backend: str) -> None:
    opts = dict(pad_to_length=64, max_num_seqs=6, max_seqlen_buckets=(16, 32, 64))
    shapes: set = set()
    for lens in ([5, 6], [10, 20, 3], [1, 1, 1, 1, 1]):
        samples = _samples(lens, seed=len(lens))
        batch = pack_batch(samples, PackOptions(backend=backend, **opts))
        _assert_same(batch, pack_batch_reference(samples, **opts))
        shapes.add(tuple((k, tuple(v.shape)) for k, v in batch.items() if isinstance(v, torch.Tensor)))
        assert batch["max_seqlen"] in (16, 32, 64)
    assert len(shapes) == 1
    batch = pack_batch(_samples([5, 6]), PackOptions(max_num_seqs=4, max_seqlen_buckets=8, backend=backend))
    assert batch["cu_seqlens"].tolist() == [0, 5, 11, 11, 11]
    assert batch["seq_lens"].tolist() == [5, 6, 0, 0]
    assert batch["max_seqlen"] == 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_allow_empty(backend: str) -> None:
    samples = _samples([0, 3, 0, 2, 0], seed=7)
    batch = pack_batch(samples, PackOptions(allow_empty=True, backend=backend))
    _assert_same(batch, pack_batch_reference(samples))
    assert batch["cu_seqlens"].tolist() == [0, 0, 3, 3, 5, 5]
    all_empty = pack_batch(_samples([0, 0]), PackOptions(allow_empty=True, pad_to_multiple_of=4, backend=backend))
    assert all_empty["input_ids"].shape == (1, 0) and all_empty["max_seqlen"] == 0


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 300), min_size=1, max_size=24),
    multiple=st.sampled_from([None, 1, 2, 7, 64, 128]),
    extra_length=st.sampled_from([None, 0, 1, 50]),
    extra_slots=st.sampled_from([None, 0, 3]),
    buckets=st.sampled_from([None, 1, 16, (64, 256, 1024, 4096)]),
    mask=st.booleans(),
    labels=st.booleans(),
    backend=st.sampled_from(BACKENDS),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(
    lens: list[int],
    multiple: int | None,
    extra_length: int | None,
    extra_slots: int | None,
    buckets: Any,
    mask: bool,
    labels: bool,
    backend: str,
    shared: bool,
    seed: int,
) -> None:
    samples = _samples(lens, seed=seed, labels=labels)
    total = sum(lens)
    pad_to_length = None
    if extra_length is not None:
        pad_to_length = total + extra_length
        if multiple is not None:
            pad_to_length = -(-pad_to_length // multiple) * multiple
    padded = pad_to_length or (-(-total // multiple) * multiple if multiple else total)
    segments = len(lens) + (padded > total)
    max_num_seqs = None if extra_slots is None else segments + extra_slots
    opts = dict(
        pad_to_multiple_of=multiple,
        pad_to_length=pad_to_length,
        max_num_seqs=max_num_seqs,
        max_seqlen_buckets=buckets,
        mask_first_label=mask,
    )
    got = pack_sequences(
        [s["input_ids"] for s in samples],
        [s["labels"] for s in samples] if labels else None,
        options=PackOptions(backend=backend, **opts),
        shared=shared,
    )
    _assert_same(got, pack_batch_reference(samples, **opts))
    # invariants, independent of the reference
    cu = got["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == padded == got["input_ids"].shape[1]
    assert all(a <= b for a, b in zip(cu, cu[1:]))
    assert got["seq_lens"].tolist() == [b - a for a, b in zip(cu, cu[1:])]
    assert got["max_seqlen"] >= max(got["seq_lens"].tolist())
    if multiple:
        assert padded % multiple == 0
    pos = got["position_ids"][0]
    for a, b in zip(cu, cu[1:]):
        assert torch.equal(pos[a:b], torch.arange(b - a))
    if padded > total:
        assert (got["labels"][0, total:] == -100).all()
        assert (got["seq_idx"][0, total:] == len(lens)).all()


# --------------------------------------------------------------------------------------------- errors


def test_empty_batch() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        pack_batch([])


def test_empty_sample_rejected_by_default() -> None:
    with pytest.raises(ValueError, match="sample 2: input_ids is empty"):
        pack_batch(_samples([3, 4, 0, 2]))


@pytest.mark.parametrize("shared", [False, True])
def test_two_dimensional_input_ids(shared: bool) -> None:
    samples = _samples([3, 4, 5])
    samples[1]["input_ids"] = samples[1]["input_ids"][None]
    with pytest.raises(ValueError, match=r"sample 1: input_ids must be 1-D, got shape \(1, 4\)"):
        pack_sequences([s["input_ids"] for s in samples], options=None, shared=shared)
    # every sample 2-D with the same shape: torch.cat would succeed, pack_batch must not
    same = [{"input_ids": torch.ones(1, 4, dtype=torch.int64)} for _ in range(3)]
    with pytest.raises(ValueError, match="sample 0: input_ids must be 1-D"):
        pack_batch(same)


def test_labels_of_another_length() -> None:
    samples = _samples([3, 4, 5])
    samples[2]["labels"] = samples[2]["labels"][:4]
    with pytest.raises(ValueError, match="sample 2: labels has 4 tokens but input_ids has 5"):
        pack_batch(samples)
    # the same total, but not per sample
    samples = _samples([3, 4])
    samples[0]["labels"] = torch.zeros(4, dtype=torch.int64)
    samples[1]["labels"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="sample 0: labels has 4 tokens but input_ids has 3"):
        pack_batch(samples)


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([1.0, 2.0]),
        np.array([1.5, 2.5]),
        [1.0, 2.0],
        [True, False],
        "abc",
    ],
)
def test_non_integer_ids(bad: Any) -> None:
    samples = _samples([3, 2, 4])
    samples[1]["input_ids"] = bad
    samples[1].pop("labels")
    with pytest.raises(TypeError, match="sample 1: input_ids"):
        pack_batch(samples)


def test_non_integer_labels() -> None:
    samples = _samples([3, 2])
    samples[1]["labels"] = samples[1]["labels"].float()
    with pytest.raises(TypeError, match="sample 1: labels must hold integers"):
        pack_batch(samples)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("field", ["input_ids", "labels"])
@pytest.mark.parametrize("which", [[1], [0, 1]])
def test_non_cpu_tensors(backend: str, field: str, which: list[int]) -> None:
    # "meta" stands in for an accelerator: the error names the first sample off the CPU, for one or all
    samples = _samples([3, 2])
    for i in which:
        samples[i][field] = samples[i][field].to("meta")
    with pytest.raises(ValueError, match=f"sample {which[0]}: {field} is on meta"):
        pack_batch(samples, PackOptions(backend=backend))
    with pytest.raises(ValueError, match=f"sample {which[0]}: {field} is on meta"):
        pack_sequences([s["input_ids"] for s in samples], [s["labels"] for s in samples], shared=True)


def test_bad_samples() -> None:
    with pytest.raises(TypeError, match="sample 1 must be a mapping"):
        pack_batch([{"input_ids": [1, 2]}, [3, 4]])
    with pytest.raises(ValueError, match="sample 1 has no 'input_ids'"):
        pack_batch([{"input_ids": [1, 2]}, {"text": "x"}])
    with pytest.raises(TypeError, match="list of samples"):
        pack_batch({"input_ids": [1, 2]})


def test_int32_overflow() -> None:
    # stride-0 views: 2**30 tokens each without the memory; the check runs before anything is copied
    big = torch.zeros(1, dtype=torch.int64).expand(2**30)
    with pytest.raises(ValueError, match="int32 cu_seqlens"):
        pack_batch([{"input_ids": big}, {"input_ids": big}])
    with pytest.raises(ValueError, match="int32 cu_seqlens"):
        pack_batch([{"input_ids": big}, {"input_ids": big[: 2**30 - 1]}], PackOptions(pad_to_multiple_of=64))


def test_static_limits() -> None:
    with pytest.raises(ValueError, match="more than pad_to_length=8"):
        pack_batch(_samples([5, 6]), PackOptions(pad_to_length=8))
    with pytest.raises(ValueError, match=r"3 segments \(2 samples \+ padding\), more than max_num_seqs=2"):
        pack_batch(_samples([5, 6]), PackOptions(pad_to_multiple_of=4, max_num_seqs=2))
    with pytest.raises(ValueError, match="longer than the largest of max_seqlen_buckets"):
        pack_batch(_samples([50]), PackOptions(max_seqlen_buckets=(16, 32)))


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(pad_to_multiple_of=0), ValueError),
        (dict(pad_to_length=-3), ValueError),
        (dict(max_num_seqs=1.5), ValueError),
        (dict(pad_to_length=10, pad_to_multiple_of=4), ValueError),
        (dict(max_seqlen_buckets=(32, 16)), ValueError),
        (dict(max_seqlen_buckets=0), ValueError),
        (dict(max_seqlen_buckets="x"), ValueError),
        (dict(mask_first_label=1), TypeError),
        (dict(ignore_index=1.0), TypeError),
        (dict(token_fields="loss_weight"), TypeError),
        (dict(token_fields=("position_ids",)), ValueError),
        (dict(backend="cuda"), ValueError),
    ],
)
def test_bad_options(options: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        pack_batch(_samples([2]), PackOptions(**options))


def test_unknown_option() -> None:
    with pytest.raises(TypeError):
        pack_batch(_samples([2]), no_such_option=1)


# --------------------------------------------------------------------------------------- extra fields


def test_extra_fields() -> None:
    samples = _samples([3, 2, 4])
    for i, sample in enumerate(samples):
        sample["weight"] = 0.5 * i
        sample["id"] = f"s{i}"
        sample["score"] = torch.tensor(i)
        sample["attention_mask"] = torch.ones(len(sample["input_ids"]), dtype=torch.int64)
        sample["loss_weight"] = torch.full((len(sample["input_ids"]),), float(i + 1))
    samples[1]["only_here"] = [1, 2]
    batch = pack_batch(samples, PackOptions(token_fields=("loss_weight",), pad_to_multiple_of=4))
    _assert_same(batch, pack_batch_reference(samples, pad_to_multiple_of=4))
    assert torch.equal(batch["weight"], torch.tensor([0.0, 0.5, 1.0]))
    assert torch.equal(batch["score"], torch.tensor([0, 1, 2]))
    assert batch["id"] == ["s0", "s1", "s2"]
    assert batch["only_here"] == [None, [1, 2], None]
    assert "attention_mask" not in batch
    assert batch["loss_weight"].tolist() == [[1.0] * 3 + [2.0] * 2 + [3.0] * 4 + [0.0] * 3]


def test_extra_field_errors() -> None:
    samples = _samples([3, 2])
    samples[1]["attention_mask"] = torch.tensor([1, 0])
    with pytest.raises(ValueError, match="sample 1: attention_mask has zeros"):
        pack_batch(samples)
    samples = _samples([3, 2])
    samples[1]["cu_seqlens"] = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="sample 1 has a 'cu_seqlens' field"):
        pack_batch(samples)
    samples = _samples([3, 2])
    samples[0]["w"] = [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="sample 1 has no 'w' field"):
        pack_batch(samples, PackOptions(token_fields=("w",)))
    samples[1]["w"] = [1.0]
    with pytest.raises(ValueError, match="sample 1: token field 'w' must be 1-D with 2 values"):
        pack_batch(samples, PackOptions(token_fields=("w",)))


def _count_images(samples: list, fields: dict, options: PackOptions) -> None:
    fields["num_images"] = torch.tensor([len(s.get("pixel_values", ())) for s in samples])
    fields["packer_calls"] = fields.get("packer_calls", 0) + 1


def test_field_packer_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnibal_kernels.packing import fields

    monkeypatch.setattr(fields, "pack_batch_vision", _count_images)
    samples = _samples([3, 2, 4])
    samples[0]["pixel_values"] = [torch.zeros(3, 4, 4)] * 2
    samples[0]["image_grid_thw"] = [(1, 2, 2)] * 2
    samples[2]["pixel_values"] = [torch.zeros(3, 4, 4)]
    batch = pack_batch(samples)
    assert batch["num_images"].tolist() == [2, 0, 1] and batch["packer_calls"] == 1
    assert "pixel_values" not in batch and "image_grid_thw" not in batch
    _assert_same(batch, pack_batch_reference(samples))


# --------------------------------------------------------------------------------------- PackedBatch


def test_packed_batch_mapping() -> None:
    batch = pack_batch(_samples([3, 5]))

    def model(input_ids: torch.Tensor, cu_seq_lens_q: torch.Tensor, max_length_q: int, **kwargs: Any):
        return input_ids.shape, cu_seq_lens_q.tolist(), max_length_q, sorted(kwargs)

    shape, cu, max_len, rest = model(**batch)
    assert shape == (1, 8) and cu == [0, 3, 8] and max_len == 5
    assert "attention_mask" not in rest and "position_ids" in rest
    assert batch.cu_seqlens is batch["cu_seqlens"]
    assert len(batch) == len(TEXT_FIELDS) and "labels" in batch and "x" not in batch
    assert dict(batch) == batch.to_dict()
    with pytest.raises(AttributeError):
        _ = batch.no_such_field
    with pytest.raises(TypeError):
        batch["input_ids"] = None  # type: ignore[index]
    assert "input_ids: (1, 8) int64" in repr(batch)


def test_packed_batch_pickle() -> None:
    batch = pack_batch(_samples([300, 700]))
    data = pickle.dumps(batch)
    # every tensor is stored once (cu_seqlens once for its three keys): about the bytes of the fields
    tensor_bytes = 1000 * (3 * 8 + 4) + 4 * (3 + 2)
    assert tensor_bytes < len(data) < tensor_bytes + 3000
    back = pickle.loads(data)
    assert isinstance(back, PackedBatch) and list(back) == list(batch)
    _assert_same(back, batch.to_dict())
    assert back["cu_seq_lens_q"] is back["cu_seqlens"]


def test_packed_batch_to() -> None:
    batch = pack_batch(_samples([3, 5]))
    batch = PackedBatch({**batch, "names": [torch.ones(2), "a"]})
    moved = batch.to("meta", non_blocking=True)
    assert isinstance(moved, PackedBatch)
    assert moved["input_ids"].device.type == "meta" and moved["names"][0].device.type == "meta"
    assert moved["names"][1] == "a" and moved["max_seqlen"] == 5
    assert moved["cu_seq_lens_q"] is moved["cu_seqlens"] is moved["cu_seq_lens_k"]
    assert batch["input_ids"].device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_packed_batch_pin_memory() -> None:
    pinned = pack_batch(_samples([3, 5])).pin_memory()
    assert pinned["input_ids"].is_pinned() and pinned["cu_seqlens"].is_pinned()
    assert pinned["cu_seq_lens_q"] is pinned["cu_seqlens"]


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, lens: list[int]) -> None:
        self.samples = _samples(lens, seed=11)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.samples[index]


def test_dataloader_workers() -> None:
    lens = [1, 97, 5, 1023, 3, 64, 2, 40, 7, 1025, 11, 13]
    data = _Dataset(lens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator only warns
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, pin_memory=True, collate_fn=pack_batch)
        batches = list(loader)
    assert len(batches) == 3
    for i, batch in enumerate(batches):
        assert isinstance(batch, PackedBatch)
        _assert_same(batch, pack_batch_reference(data.samples[4 * i : 4 * i + 4]))
        # written into shared memory in the worker: one storage crosses the process boundary
        storages = {v.untyped_storage().data_ptr() for v in batch.values() if isinstance(v, torch.Tensor)}
        assert len(storages) == 1


def test_collator() -> None:
    collate = PackCollator(PackOptions(pad_to_multiple_of=8), warmup=False)
    samples = _samples([3, 6])
    _assert_same(collate(samples), pack_batch_reference(samples, pad_to_multiple_of=8))
    again = pickle.loads(pickle.dumps(collate))
    assert again.options == collate.options
    with pytest.raises(ValueError):
        PackCollator(PackOptions(pad_to_multiple_of=-1))


@pytest.mark.slow
def test_import_is_light() -> None:
    code = (
        "import sys, omnibal_kernels, omnibal_kernels.packing; "
        "omnibal_kernels.pack_batch; "
        "assert 'numba' not in sys.modules and 'triton' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
