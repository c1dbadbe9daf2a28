"""The JSON length-record scanner: ViT sequence lengths and label counts beside the loads, strict UTF-8 with
errors at the right line and column, and what ``load_lengths`` does with the optional fields."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from omnibal_kernels import load_lengths
from omnibal_kernels._ext import load as load_extension
from omnibal_kernels.cli import main
from omnibal_kernels.lengths.read import _read_records


def _parse(text: bytes):
    return load_extension().parse_length_records(text, "vit_num", "token_num")


def _where(error: str) -> tuple[int, int]:
    found = re.search(r"\(line (\d+), column (\d+)\)$", error)
    assert found, error
    return int(found[1]), int(found[2])


RECORDS = [
    {"token_num": 900, "vit_num": 512, "vit_seqlens": [256, 256], "label_num": 300},
    {"token_num": 40, "label_num": 0},  # text only
    {"vit_seqlens": [64, 0, 16], "token_num": 120, "label_num": 7},  # vit_num from the list
    {"token_num": 50, "vit_num": 0, "vit_seqlens": [], "label_num": 49},
    {"token_num": 70, "label_num": 1, "vit_seqlens_note": [1, 2]},  # text only, without the key
]


@pytest.mark.parametrize("layout", ["list", "lines"])
def test_vit_seqlens_and_labels_are_read_as_csr_with_their_presence(layout):
    lines = [json.dumps(r) for r in RECORDS]
    text = ("[\n" + ",\n".join(lines) + "\n]" if layout == "list" else "\n".join(lines) + "\n").encode()
    r = _parse(text)
    assert r.error == "" and r.error_sample == -1
    assert r.vit.tolist() == [512, 0, 80, 0, 0] and r.llm.tolist() == [900, 40, 120, 50, 70]
    assert r.vit_seqlens.tolist() == [256, 256, 64, 0, 16]
    assert r.vit_seqlens_offsets.tolist() == [0, 2, 2, 5, 5, 5]
    assert r.vit_seqlens_given.dtype == np.bool_
    assert r.vit_seqlens_given.tolist() == [True, False, True, True, False]
    assert r.label.tolist() == [300, 0, 7, 49, 1]
    assert all(a.dtype == np.int64 for a in (r.vit, r.llm, r.vit_seqlens, r.vit_seqlens_offsets, r.label))


def test_optional_fields_are_none_without_their_keys_and_start_late_with_their_first_sample():
    plain = _parse(b'[{"vit_num": 2, "token_num": 10}, {"token_num": 7}]')
    assert (plain.vit_seqlens, plain.vit_seqlens_offsets, plain.vit_seqlens_given, plain.label) == (None,) * 4
    late = _parse(b'{"token_num": 1}\n{"token_num": 2}\n{"token_num": 3, "vit_seqlens": [4], "label_num": 2}\n')
    assert late.vit_seqlens_offsets.tolist() == [0, 0, 0, 1] and late.vit_seqlens_given.tolist() == [0, 0, 1]
    assert late.label.tolist() == [-1, -1, 2] and late.vit.tolist() == [0, 0, 4]


def test_a_repeated_key_counts_with_its_last_value_as_in_json():
    text = (
        b'[{"token_num": 9, "vit_seqlens": [1, 2, 3], "vit_num": 5, "vit_seqlens": [5], "label_num": 9, '
        b'"label_num": 2}, {"token_num": 1, "vit_seqlens": [7], "vit_seqlens": []}]'
    )
    r = _parse(text)
    assert r.error == ""
    assert r.vit_seqlens.tolist() == [5] and r.vit_seqlens_offsets.tolist() == [0, 1, 1]
    assert r.vit.tolist() == [5, 0] and r.label.tolist() == [2, -1]
    records = json.loads(text)
    assert [rec["vit_seqlens"] for rec in records] == [[5], []] and records[0]["label_num"] == 2


def test_custom_keys_are_read_escaped_or_not():
    r = load_extension().parse_length_records(b'[{"n": 3, "v\\u0073": [3], "l": 1}]', "vit", "n", "vs", "l")
    assert (r.vit.tolist(), r.vit_seqlens.tolist(), r.label.tolist()) == ([3], [3], [1])


def test_errors_point_at_the_value_at_fault_in_characters():
    # The sum is checked once the object is read; the error points where the list starts.
    text = (
        '[{"token_num": 9},\n {"n\u00f6te": "\u00e9\u20ac\U0001f600", "vit_num": 8, "vit_seqlens": [4, 5], '
        '"token_num": 9}]'
    )
    r = _parse(text.encode())
    assert r.error_sample == 1 and r.error.startswith("'vit_seqlens' sum to 9, but 'vit_num' is 8")
    second_line = text.split("\n")[1]
    assert _where(r.error) == (2, second_line.index("[4, 5]") + 1)
    # A bad byte after multi-byte characters: its column counts characters, not bytes.
    before = '{"token_num": 1, "\u00e9\u00e9": "\u20ac'
    r = _parse(('{"token_num": 1}\n' + before).encode() + b'\xe2\x28"}\n')
    assert r.error.startswith("bytes that are not UTF-8: 0xE2 0x28") and _where(r.error) == (2, len(before) + 1)
    assert r.error_sample == 1
    r = _parse(b'[{"token_num": 9, "label_num": 12}]')
    assert r.error.startswith("'label_num' is 12, more than 'token_num' - 1 (9 - 1)") and _where(r.error) == (1, 32)


@pytest.mark.parametrize("character", ["\u00e9", "\u20ac", "\U0001f600"])
def test_quoted_values_never_cut_a_character(tmp_path, character):
    """The issue's case: a long non-ASCII string in a count field is a ValueError that quotes whole characters."""
    for n in range(15, 26):
        path = tmp_path / "text_count.json"
        path.write_text(
            json.dumps([{"token_num": 4}, {"vit_num": character * n, "token_num": 5}], ensure_ascii=False),
            encoding="utf-8",
        )
        with pytest.raises(ValueError) as info:
            load_lengths(path)
        message = str(info.value)
        assert message.startswith(f"{path}: sample 1: 'vit_num' is a non-integer value \"{character}"), message
        quoted = message.split("value ", 1)[1].split(" (line")[0]
        shown = quoted.removesuffix("...")
        cut = shown != quoted
        body = shown[1:] if cut else shown[1:-1]  # the string's characters, between its quotes
        assert len(shown.encode()) <= 40 and body == character * (len(body) if cut else n), message
        assert cut == (len(json.dumps(character * n, ensure_ascii=False).encode()) > 40), message


def test_cli_reports_text_in_a_count_field_as_one_line(tmp_path, capsys):
    path = tmp_path / "text_count.json"
    path.write_bytes(b'[{"vit_num": "' + "\u00e9".encode() * 40 + b'", "token_num": 5}]')
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"omnibal-kernels: error: {path}: sample 0: 'vit_num' is a non-integer") and "\n" not in err


def _write(tmp_path: Path, records: list, name: str = "records.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(records))
    return path


def test_read_records_returns_the_checked_fields_by_name(tmp_path):
    path = _write(tmp_path, RECORDS)
    got = _read_records(path, memoryview(path.read_bytes()))
    assert got._fields == ("vit", "llm", "vit_seqlens", "vit_seqlens_offsets", "label")
    assert got.vit.tolist() == [512, 0, 80, 0, 0] and got.llm.tolist() == [900, 40, 120, 50, 70]
    assert got.vit_seqlens.tolist() == [256, 256, 64, 0, 16]
    assert got.vit_seqlens_offsets.tolist() == [0, 2, 2, 5, 5, 5]
    assert got.label.tolist() == [300, 0, 7, 49, 1]
    plain = _write(tmp_path, [{"token_num": 3, "vit_num": 2}], "plain.json")
    got = _read_records(plain, memoryview(plain.read_bytes()))
    assert (got.vit_seqlens, got.vit_seqlens_offsets, got.label) == (None, None, None)


def test_a_sample_with_images_needs_vit_seqlens_where_others_have_them(tmp_path):
    records = [
        {"token_num": 1},
        {"token_num": 1, "vit_seqlens": [1, 2]},
        {"token_num": 1, "vit_num": 0},
        {"token_num": 1, "vit_num": 7},
        {"token_num": 1, "vit_num": 3, "vit_seqlens": [3]},
    ]
    path = _write(tmp_path, records, "mixed.json")
    with pytest.raises(ValueError, match=r"mixed\.json: sample 3: no vit_seqlens but a ViT load of 7, while other"):
        load_lengths(path)
    del records[3]
    assert load_lengths(_write(tmp_path, records, "ok.json")).vit_seqlens_offsets.tolist() == [0, 0, 2, 2, 3]


def test_labels_are_given_for_every_sample_or_none(tmp_path):
    path = _write(tmp_path, [{"token_num": 4, "label_num": 1}, {"token_num": 4}, {"token_num": 4}])
    with pytest.raises(ValueError, match=r"sample 1: 'label_num' is missing, but sample 0 has it"):
        load_lengths(path)


def test_a_data_set_s_records_in_place_of_a_length_file_point_to_the_lengths_command(tmp_path):
    # a newcomer's first try: the data set's own records, which hold images and text but no loads
    path = _write(tmp_path, [{"image": "a.jpg", "conversations": [{"from": "human", "value": "hi"}]}])
    with pytest.raises(ValueError, match=r"sample 0: 'token_num' is missing .*`omnibal-kernels lengths` writes one"):
        load_lengths(path)
    # a length file that lacks one sample's count: the sample, line and column at fault come first
    path = _write(tmp_path, [{"token_num": 4}, {"vit_num": 1}])
    with pytest.raises(ValueError, match=r"sample 1: 'token_num' is missing \(line 1, column \d+\) \(a length"):
        load_lengths(path)


def test_load_lengths_keeps_the_optional_fields(tmp_path):
    """Never a silent loss: each optional field of a file reaches the Lengths as read."""
    path = _write(tmp_path, RECORDS)
    expected = _read_records(path, memoryview(path.read_bytes()))
    for key, names in (("vit_seqlens", ("vit_seqlens", "vit_seqlens_offsets")), ("label_num", ("label",))):
        one = _write(
            tmp_path,
            [{k: v for k, v in r.items() if k in ("token_num", "vit_num", key)} for r in RECORDS],
            f"{key}.json",
        )
        lengths = load_lengths(one)
        for name in names:
            assert getattr(lengths, name).tolist() == getattr(expected, name).tolist()
    assert load_lengths(_write(tmp_path, [{"token_num": 3, "vit_num": 1}], "plain.json")).vit.tolist() == [1]
