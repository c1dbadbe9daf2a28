"""Malformed length files, generated here: each gives a clear ValueError naming the file (and the sample where
there is one), never a wrong result, a raw library message or a silent loss."""
from __future__ import annotations

import io
import json
import re
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnibal_kernels import load_lengths
from omnibal_kernels._ext import load as load_extension


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


GOOD_LIST = b'[{"vit_num": 1, "token_num": 10}, {"vit_num": 2, "token_num": 20}]'
GOOD_NPZ = _npz(vit=np.arange(200), llm=np.arange(200) + 7)

# name, file bytes, what the message must say, the sample it must name (None: no sample applies)
CORPUS = [
    # truncated
    ("cut_list.json", GOOD_LIST[:-1], "not closed with ']'", None),
    ("cut_object.json", GOOD_LIST[:40], "", 1),
    ("cut_number.jsonl", b'{"token_num": 1}\n{"token_num": ', "missing value", 1),
    ("cut_string.json", b'[{"token_num": 1, "note": "abc', "unterminated string", 0),
    ("cut.npy", _npy(np.arange(100))[:-8], "not a readable .npy file", None),
    ("cut_header.npy", _npy(np.arange(100))[:30], "not a readable .npy file", None),
    ("cut.npz", GOOD_NPZ[: len(GOOD_NPZ) // 2], "not a readable .npz file", None),
    # concatenated, or commas wrong
    ("two_lists.json", GOOD_LIST + b"\n" + GOOD_LIST, "after the closing ']'", None),
    ("list_then_object.json", GOOD_LIST + b'{"token_num": 3}', "after the closing ']'", None),
    ("no_comma.json", b'[{"token_num": 1} {"token_num": 2}]', "expected ',' or ']'", 1),
    ("no_comma_in_object.json", b'[{"token_num": 1 "vit_num": 2}]', "expected ',' or '}'", 0),
    ("double_comma.json", b'[{"token_num": 1},, {"token_num": 2}]', "expected an object", 1),
    ("trailing_comma.json", b'[{"token_num": 1},]', "',' before the closing ']'", None),
    ("two_per_line.jsonl", b'{"token_num": 1} {"token_num": 2}\n', "one object per line", 1),
    ("comma_lines.jsonl", b'{"token_num": 1},\n{"token_num": 2}\n', "one object per line", 1),
    ("bad_literal.json", b'[{"token_num": 1, "flag": tru}]', "malformed value", 0),
    ("leading_zero.json", b'[{"token_num": 012}]', "leading zero", 0),
    ("not_objects.json", b"[1, 2, 3]", "expected an object", 0),
    # wrong encodings
    ("utf16.json", GOOD_LIST.decode().encode("utf-16"), "UTF-16", None),
    ("utf16be.json", b"\xfe\xff" + GOOD_LIST.decode().encode("utf-16-be"), "UTF-16 (big-endian)", None),
    ("utf32.json", GOOD_LIST.decode().encode("utf-32"), "UTF-32", None),
    ("utf16_no_bom.jsonl", b'{"token_num": 1}\n'.decode().encode("utf-16-le"), "UTF-16", None),
    ("latin1_in_key.json", b'[{"token_num": 1, "caf\xe9": 2}]', None, None),  # bytes inside strings: loads
    # wrong types and dtypes
    ("string_count.json", b'[{"token_num": 1}, {"token_num": "12"}]', "non-integer", 1),
    ("float_count.json", b'[{"token_num": 1}, {"token_num": 1.0}]', "non-integer", 1),
    ("exp_count.json", b'[{"token_num": 1e3}]', "non-integer", 0),
    ("null_vit.json", b'[{"vit_num": null, "token_num": 1}]', "non-integer", 0),
    ("no_tokens.json", b'[{"vit_num": 1}]', "'token_num' is missing", 0),
    ("strings.npy", _npy(np.array(["1", "2"])), "must hold integers", None),
    ("objects.npy", None, "not a readable .npy file", None),  # filled below (needs allow_pickle to write)
    ("complex.npy", _npy(np.array([1 + 2j])), "must hold integers", None),
    ("three_columns.npy", _npy(np.ones((3, 3), np.int64)), "(N, 2)", None),
    ("npy_named_npz.npz", _npy(np.arange(3)), "not an .npz archive", None),
    ("no_llm.npz", _npz(tokens=np.arange(3)), "needs an array 'llm'", None),
    ("ragged.npz", _npz(vit=np.arange(3), llm=np.arange(4)), "vit has 3 samples, llm has 4", None),
    ("not_a_zip.npz", b"PK\x03\x04 this is not a zip archive", "not a readable .npz file", None),
    # extreme values
    ("uint64_huge.npy", _npy(np.array([5, 2**63, 1], np.uint64)), "too large", 1),
    ("float_huge.npy", _npy(np.array([5.0, 1e30])), "too large", 1),
    ("float_inf.npy", _npy(np.array([5.0, np.inf])), "not an integer", 1),
    ("float_nan.npz", _npz(llm=np.array([1.0, 2.0, np.nan])), "not an integer", 2),
    ("negative.npy", _npy(np.array([[1, 2], [-1, 3]])), "negative", 1),
    ("int32_max_plus.npz", _npz(llm=np.array([1, 2**31], np.int64)), "too large", 1),
    ("count_2_31.json", b'[{"token_num": 2147483648}]', "too large", 0),
    ("count_huge.json", b'[{"token_num": 1}, {"token_num": ' + b"9" * 400 + b"}]", "too large", 1),
    ("negative_huge.json", b'[{"token_num": -' + b"9" * 30 + b"}]", "negative", 0),
    ("negative.json", b'[{"token_num": 1, "vit_num": -1}]', "negative", 0),
    ("deep_nesting.json", b'[{"token_num": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}]", "nested", 0),
    # empty
    ("empty.json", b"", "no samples", None),
    ("blank.json", b" \n\t\r\n", "no samples", None),
    ("empty_list.json", b"[ ]", "no samples", None),
    ("blank_lines.jsonl", b"\n\n   \n", "no samples", None),
    ("empty.npy", _npy(np.zeros(0, np.int64)), "no samples", None),
    ("empty_pairs.npy", _npy(np.zeros((0, 2), np.int64)), "no samples", None),
    ("empty.npz", _npz(vit=np.zeros(0, np.int64), llm=np.zeros(0, np.int64)), "no samples", None),
    ("zero_bytes.npy", b"", "not a readable .npy file", None),
    ("bom_only.json", b"\xef\xbb\xbf", "no samples", None),
]


def _objects_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([1, None], dtype=object), allow_pickle=True)
    return buf.getvalue()


@pytest.mark.parametrize("name, data, message, sample", CORPUS, ids=[c[0] for c in CORPUS])
def test_malformed_file_is_a_clear_error(tmp_path, name, data, message, sample):
    path = tmp_path / name
    path.write_bytes(_objects_npy() if data is None else data)
    if message is None:
        assert len(load_lengths(path)) == 1
        return
    with pytest.raises(ValueError) as info:
        load_lengths(path)
    text = str(info.value)
    assert text.startswith(f"{path}: "), text
    assert message in text, text
    if sample is not None:
        assert f"sample {sample}:" in text, text
    else:
        assert not re.search(r"sample \d+:", text), text


def test_empty_files_load_when_asked_and_never_vanish_beside_others(tmp_path):
    (tmp_path / "a.json").write_bytes(GOOD_LIST)
    for name, data in (("e.json", b""), ("b.jsonl", b"\n\n"), ("l.json", b"[]"),
                       ("n.npy", _npy(np.zeros(0, np.int64)))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="no samples"):
            load_lengths(tmp_path / "a.json", tmp_path / name)
        both = load_lengths(tmp_path / "a.json", tmp_path / name, allow_empty=True)
        assert both.llm.tolist() == [10, 20] and both.sources == (str(tmp_path / "a.json"), str(tmp_path / name))


def test_utf8_byte_order_mark_is_skipped(tmp_path):
    for name, data in (("bom.json", b"\xef\xbb\xbf" + GOOD_LIST),
                       ("bom.jsonl", b'\xef\xbb\xbf{"token_num": 4}\n{"token_num": 5}\n')):
        (tmp_path / name).write_bytes(data)
        assert len(load_lengths(tmp_path / name)) == 2
    meta = tmp_path / "meta.json"
    meta.write_bytes(b"\xef\xbb\xbf" + json.dumps({"a": {"token_lengths": "bom.json"}}).encode())
    assert load_lengths(meta).llm.tolist() == [10, 20]


def test_escaped_keys_are_decoded_and_minus_zero_is_zero(tmp_path):
    path = tmp_path / "escaped.json"
    path.write_bytes(b'[{"token\\u005fnum": 7, "vit\\u005Fnum": 2, "n\\u00f6te\\ud83d\\ude00": "\\"x\\\\"},'
                     b' {"token_num": -0, "vit_num": -0}]')
    lengths = load_lengths(path)
    assert lengths.vit.tolist() == [2, 0] and lengths.llm.tolist() == [7, 0]


def test_meta_file_errors_name_the_meta_file_and_entry(tmp_path):
    (tmp_path / "a.json").write_bytes(GOOD_LIST)
    cases = {
        "number.json": ({"a": {"token_lengths": 5}}, "entry 'a': 'token_lengths' must be a path string, got 5"),
        "list.json": ({"a": {"token_lengths": ["a.json"]}}, "'token_lengths' must be a path string"),
        "missing_one.json": ({"a": {"token_lengths": "a.json"}, "b": {"root": "/img"}},
                             "entry 'b' has no 'token_lengths'"),
    }
    for name, (meta, message) in cases.items():
        (tmp_path / name).write_text(json.dumps(meta))
        with pytest.raises(ValueError) as info:
            load_lengths(tmp_path / name)
        assert str(info.value).startswith(f"{tmp_path / name}: ") and message in str(info.value)


def test_directories_and_non_paths(tmp_path):
    (tmp_path / "data.json").mkdir()
    with pytest.raises(ValueError, match=r"data\.json: is a directory"):
        load_lengths(tmp_path / "data.json")
    with pytest.raises(ValueError, match="is a directory"):
        load_lengths(tmp_path)
    with pytest.raises(TypeError, match="path 1 must be a str or os.PathLike, got int"):
        load_lengths(tmp_path / "data.json", 3)


def test_corrupt_member_inside_a_valid_zip(tmp_path):
    path = tmp_path / "flipped.npz"
    data = bytearray(GOOD_NPZ)
    with zipfile.ZipFile(io.BytesIO(GOOD_NPZ)) as z:
        info = z.getinfo("llm.npy")
    # Flip bytes in the middle of one member's compressed data (after its local header and extra field).
    name_len, extra_len = struct.unpack_from("<HH", GOOD_NPZ, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
    for k in range(start, start + 8):
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        load_lengths(path)
    assert str(err.value).startswith(f"{path}: not a readable .npz file")


# ------------------------------------------------------------------ the scanner against Python's json module

_KEYS = st.sampled_from(["vit_num", "token_num", "image_flags", "other", "vit_numx", "token"])
_SCALARS = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=5), st.booleans(), st.none())
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_RECORDS = st.lists(st.dictionaries(_KEYS, st.one_of(st.integers(-3, 2**31 + 3), _VALUES), max_size=4), max_size=6)


def _reference(text: bytes) -> tuple[list[int], list[int]] | None:
    """What a strict reader must return for a JSON list of records, by Python's json; None: must fail."""
    try:
        records = json.loads(text.decode("utf-8"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(records, list):
        return None
    vit, llm = [], []
    for rec in records:
        if not isinstance(rec, dict) or "token_num" not in rec:
            return None
        values = (rec.get("vit_num", 0), rec["token_num"])
        if not all(type(v) is int and 0 <= v < 2**31 for v in values):
            return None
        vit.append(values[0])
        llm.append(values[1])
    return vit, llm


def _scan(text: bytes) -> tuple[list[int], list[int]] | None:
    records = load_extension().parse_length_records(text, "vit_num", "token_num")
    return None if records.error else (records.vit.tolist(), records.llm.tolist())


@settings(max_examples=80, deadline=None)
@given(records=_RECORDS, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_scanner_reads_what_json_reads(records, indent, ascii_only):
    text = json.dumps(records, indent=indent, ensure_ascii=ascii_only).encode()
    assert _scan(text) == _reference(text)


@settings(max_examples=150, deadline=None)
@given(records=_RECORDS.filter(bool), data=st.data())
def test_scanner_never_accepts_what_json_rejects(records, data):
    """Cut, doubled, deleted or inserted bytes: whatever the scanner accepts, json reads the same way."""
    text = bytearray(json.dumps(records, separators=(",", ":")).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["delete", "insert", "double", "cut"]))
        if kind == "delete" and i < len(text):
            del text[i]
        elif kind == "insert":
            text[i:i] = data.draw(st.sampled_from([b",", b"]", b"[", b"{", b"}", b'"', b":", b"-", b"0", b" ",
                                                   b"\\", b"e", b"n"]))
        elif kind == "double" and i < len(text):
            text[i:i] = text[i:i + 1]
        elif kind == "cut":
            del text[i:]
    text = bytes(text)
    if text.lstrip().startswith(b"["):  # a JSON list: json is the judge (JSON Lines it cannot read)
        assert _scan(text) == _reference(text), text
