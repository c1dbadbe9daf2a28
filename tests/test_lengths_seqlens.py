"""Lengths.vit_seqlens: per-sample ViT sequence lengths in CSR form, validated, kept by subsets, read and written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import Lengths, load_lengths, write_lengths

SEQS = [[2, 3], [], [5], [1, 1, 1]]


def _lengths(seqs=SEQS) -> Lengths:
    vit = [sum(s) for s in seqs]
    return Lengths(
        vit,
        [10 * (i + 1) + v for i, v in enumerate(vit)],
        vit_seqlens=[x for s in seqs for x in s],
        vit_seqlens_offsets=np.cumsum([0] + [len(s) for s in seqs]),
    )


def _rows(lengths: Lengths) -> list[list[int]]:
    o, s = lengths.vit_seqlens_offsets, lengths.vit_seqlens
    return [s[a:b].tolist() for a, b in zip(o[:-1], o[1:])]


def test_csr_arrays_are_int64_and_read_only():
    lengths = _lengths()
    assert lengths.vit_seqlens.dtype == np.int64 and lengths.vit_seqlens_offsets.dtype == np.int64
    assert _rows(lengths) == SEQS
    with pytest.raises(ValueError, match="read-only"):
        lengths.vit_seqlens[0] = 7
    given_array = np.array([2, 3, 5, 1, 1, 1])
    copy = Lengths(lengths.vit, lengths.llm, vit_seqlens=given_array, vit_seqlens_offsets=lengths.vit_seqlens_offsets)
    given_array[0] = 4  # editing the caller's array cannot reach the Lengths
    assert copy.vit_seqlens[0] == 2
    assert Lengths([1], [2]).vit_seqlens is None


@pytest.mark.parametrize(
    "seqlens,offsets,message",
    [
        ([2, 3, 5, 1, 1], [0, 2, 2, 3, 5], "sample 3: vit_seqlens sum to 2, but its ViT load is 3"),
        ([2, 3, 5, 1, 3, -1], [0, 2, 2, 3, 6], "sample 3: vit_seqlens holds a negative length"),
        ([2, 3, 5, 1, 1, 1], [0, 2, 3, 2, 6], "sample 2: vit_seqlens_offsets must be non-decreasing"),
        ([2, 3, 5, 1, 1, 1], [1, 2, 2, 3, 6], "must start at 0"),
        ([2, 3, 5, 1, 1, 1], [0, 2, 2, 6], "must have 5 entries"),
        ([2, 3, 5, 1, 1, 1], [0, 2, 2, 3, 5], "must end at the number of values"),
        ([2.0, 3, 5, 1, 1, 1], [0, 2, 2, 3, 6], "1-D integer array"),
        ([2, 3, 5, 1, 1, 1], None, "vit_seqlens_offsets is missing"),
    ],
)
def test_bad_sequences_name_the_sample(seqlens, offsets, message):
    with pytest.raises(ValueError, match=message):
        Lengths([5, 0, 5, 3], [9, 9, 9, 9], vit_seqlens=seqlens, vit_seqlens_offsets=offsets)


def test_subsets_keep_their_sequences():
    lengths = _lengths()
    assert _rows(lengths[[3, 0, 0]]) == [SEQS[3], SEQS[0], SEQS[0]]
    assert _rows(lengths[1:3]) == SEQS[1:3]
    assert _rows(lengths[np.array([True, False, False, True])]) == [SEQS[0], SEQS[3]]
    assert _rows(lengths[[-1]]) == [SEQS[3]]
    assert lengths[2:2].vit_seqlens_offsets.tolist() == [0]


def test_concat_joins_sequences_and_text_only_parts():
    text = Lengths([0, 0], [5, 6])
    joined = Lengths.concat([_lengths(), text, _lengths(SEQS[:1])])
    assert _rows(joined) == [*SEQS, [], [], SEQS[0]]
    assert Lengths.concat([text, Lengths([3], [9])]).vit_seqlens is None
    with pytest.raises(ValueError, match="has no vit_seqlens but ViT loads"):
        Lengths.concat([_lengths(), Lengths([3], [9], sources=("images.json",))])


@pytest.mark.parametrize("suffix", [".npz", ".json", ".jsonl"])
def test_write_then_load_round_trips_sequences(tmp_path, suffix):
    lengths = _lengths()
    back = load_lengths(write_lengths(tmp_path / f"l{suffix}", lengths))
    assert back.vit.tolist() == lengths.vit.tolist() and back.llm.tolist() == lengths.llm.tolist()
    assert _rows(back) == SEQS
    plain = load_lengths(write_lengths(tmp_path / f"p{suffix}", Lengths(lengths.vit, lengths.llm)))
    assert plain.vit_seqlens is None


def test_json_holds_one_list_per_sample(tmp_path):
    path = write_lengths(tmp_path / "l.json", _lengths())
    records = json.loads(path.read_text())
    assert [r["vit_seqlens"] for r in records] == SEQS
    lines = write_lengths(tmp_path / "l.jsonl", _lengths()).read_text().splitlines()
    assert [json.loads(line)["vit_seqlens"] for line in lines] == SEQS


def test_npz_arrays(tmp_path):
    path = write_lengths(tmp_path / "l.npz", _lengths())
    with np.load(path) as z:
        assert z["vit_seqlens"].tolist() == [2, 3, 5, 1, 1, 1] and z["vit_seqlens_offsets"].tolist() == [0, 2, 2, 3, 6]
        assert z["vit_seqlens"].dtype == np.int64


def test_write_takes_sequences_from_a_mapping_and_checks_them(tmp_path):
    lengths = _lengths()
    loads = {
        "vit": lengths.vit,
        "llm": lengths.llm,
        "vit_seqlens": [2, 3, 5, 1, 1, 1],
        "vit_seqlens_offsets": [0, 2, 2, 3, 6],
    }
    assert _rows(load_lengths(write_lengths(tmp_path / "m.npz", loads))) == SEQS
    loads["vit_seqlens"] = [2, 3, 5, 1, 1, 2]
    with pytest.raises(ValueError, match=r"writing .*m2.json: sample 3: vit_seqlens sum to 4"):
        write_lengths(tmp_path / "m2.json", loads)
    assert not (tmp_path / "m2.json").exists()


def test_reading_bad_sequences_names_file_and_sample(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"vit_num": 2, "token_num": 9, "vit_seqlens": [1, 1]}\n{"vit_num": 3, "token_num": 9, "vit_seqlens": [1, 1]}\n'
    )
    with pytest.raises(ValueError, match=f"{path}: sample 1: 'vit_seqlens' sum to 2, but 'vit_num' is 3"):
        load_lengths(path)
    path.write_text('[{"vit_num": 2, "token_num": 9, "vit_seqlens": [2]}, {"vit_num": 1, "token_num": 9}]')
    with pytest.raises(ValueError, match="sample 1: no vit_seqlens but a ViT load of 1"):
        load_lengths(path)
    path.write_text('[{"vit_num": 2, "token_num": 9, "vit_seqlens": [2.0]}]')
    with pytest.raises(ValueError, match="sample 0: 'vit_seqlens' element 0 is a non-integer value 2.0"):
        load_lengths(path)
    path.write_text('[{"vit_num": 2, "token_num": 9, "vit_seqlens": [2]}, {"token_num": 9}]')
    assert _rows(load_lengths(path)) == [[2], []]  # a text-only sample needs none
    npz = tmp_path / "bad.npz"
    np.savez(npz, vit=np.array([2]), llm=np.array([5]), vit_seqlens=np.array([3]), vit_seqlens_offsets=np.array([0, 1]))
    with pytest.raises(ValueError, match=f"{npz}: sample 0: vit_seqlens sum to 3"):
        load_lengths(npz)
    np.savez(npz, vit=np.array([2]), llm=np.array([5]), vit_seqlens=np.array([2]))
    with pytest.raises(ValueError, match=f"{npz}: vit_seqlens and vit_seqlens_offsets come together"):
        load_lengths(npz)


def test_a_key_inside_a_string_is_not_a_sequence_list(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('[{"vit_num": 2, "token_num": 9, "note": "\\"vit_seqlens\\""}]')
    assert load_lengths(path).vit_seqlens is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**20), max_size=5), min_size=1, max_size=30),
    st.integers(0, 2**32 - 1),
    st.sampled_from([".npz", ".json", ".jsonl"]),
)
def test_round_trip_and_subsets_for_any_sequences(tmp_path_factory, seqs, seed, suffix):
    lengths = _lengths(seqs)
    back = load_lengths(write_lengths(tmp_path_factory.mktemp("l") / f"x{suffix}", lengths))
    assert _rows(back) == seqs
    pick = np.random.default_rng(seed).integers(0, len(seqs), 7)
    assert _rows(lengths[pick]) == [seqs[i] for i in pick]
