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
from hypothesis import given, seed, settings
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
    # bytes that are not UTF-8, anywhere: the message names them (and the line and column)
    ("latin1_in_key.json", b'[{"token_num": 1, "caf\xe9": 2}]', "not UTF-8: 0xE9 0x22", 0),
    ("latin1_in_ignored_value.json", b'[{"token_num": 1}, {"token_num": 2, "note": "caf\xe9"}]', "0xE9 0x22", 1),
    ("latin1_nested.jsonl", b'{"token_num": 1, "meta": {"a": ["ok", "\xe9t\xe9"]}}\n', "0xE9 0x74", 0),
    ("overlong_slash.json", b'[{"token_num": 1, "p": "\xc0\xaf"}]', "not UTF-8: 0xC0", 0),
    ("encoded_surrogate.json", b'[{"token_num": 1, "p": "\xed\xa0\x80"}]', "not UTF-8: 0xED 0xA0", 0),
    ("above_u10ffff.json", b'[{"token_num": 1, "p": "\xf4\x90\x80\x80"}]', "not UTF-8: 0xF4 0x90", 0),
    ("lone_continuation.json", b'[{"token_num": 1, "p": "a\x80"}]', "not UTF-8: 0x80", 0),
    ("cut_character.json", b'[{"token_num": 1, "p": "\xe2\x82', "not UTF-8: 0xE2 0x82", 0),
    ("byte_after_list.json", GOOD_LIST + b"\n\xff", "not UTF-8: 0xFF", None),
    ("byte_in_number.json", b'[{"token_num": 12\xff}]', "not UTF-8: 0xFF", 0),
    ("byte_between_lines.jsonl", b'{"token_num": 1}\n\xfe\n{"token_num": 2}\n', "not UTF-8: 0xFE", 1),
    # UTF-8 that is fine where JSON is not
    ("text_count.json", b'[{"token_num": 1, "vit_num": "' + "\u00e9".encode() * 30 + b'"}]', "non-integer", 0),
    ("character_outside_string.json", '[{"token_num": 1, "n": \u00e9}]'.encode(), "malformed value", 0),
    # ViT sequence lengths and label counts
    ("seqlens_negative.json", b'[{"token_num": 9, "vit_seqlens": [4, -1]}]', "element 1 is a negative value", 0),
    ("seqlens_float.json", b'[{"token_num": 9}, {"token_num": 9, "vit_seqlens": [4.0]}]', "non-integer", 1),
    ("seqlens_string.jsonl", b'{"token_num": 9, "vit_seqlens": ["4"]}\n', "element 0 is a non-integer", 0),
    ("seqlens_nested.json", b'[{"token_num": 9, "vit_seqlens": [[4, 5]]}]', "nested list", 0),
    ("seqlens_objects.json", b'[{"token_num": 9, "vit_seqlens": [{"n": 4}]}]', "nested object", 0),
    ("seqlens_not_list.json", b'[{"token_num": 9, "vit_seqlens": 4}]', "expected a list", 0),
    ("seqlens_null.json", b'[{"token_num": 9, "vit_seqlens": null}]', "expected a list", 0),
    ("seqlens_trailing_comma.json", b'[{"token_num": 9, "vit_seqlens": [4,]}]', "malformed value", 0),
    ("seqlens_unclosed.json", b'[{"token_num": 9, "vit_seqlens": [4 5]}]', "malformed list", 0),
    ("seqlens_sum.json", b'[{"token_num": 9, "vit_num": 8, "vit_seqlens": [4, 5]}]', "sum to 9, but 'vit_num' is 8", 0),
    (
        "seqlens_sum_zero.jsonl",
        b'{"token_num": 9, "vit_num": 0}\n{"token_num": 9, "vit_num": 0, "vit_seqlens": [1]}\n',
        "sum to 1",
        1,
    ),
    ("seqlens_too_large.json", b'[{"token_num": 9, "vit_seqlens": [2147483647, 1]}]', "too large for a ViT load", 0),
    ("label_negative.json", b'[{"token_num": 9, "label_num": -2}]', "'label_num' is a negative value", 0),
    ("label_float.json", b'[{"token_num": 9, "label_num": 2.5}]', "'label_num' is a non-integer", 0),
    ("label_above_tokens.json", b'[{"token_num": 9, "label_num": 9}]', "more than 'token_num' - 1 (9 - 1)", 0),
    (
        "label_missing.json",
        b'[{"token_num": 9, "label_num": 3}, {"token_num": 4}]',
        "'label_num' is missing, but sample 0",
        1,
    ),
    ("label_missing_first.jsonl", b'{"token_num": 4}\n{"token_num": 9, "label_num": 3}\n', "but sample 1 has it", 0),
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
    for name, data in (
        ("e.json", b""),
        ("b.jsonl", b"\n\n"),
        ("l.json", b"[]"),
        ("n.npy", _npy(np.zeros(0, np.int64))),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="no samples"):
            load_lengths(tmp_path / "a.json", tmp_path / name)
        both = load_lengths(tmp_path / "a.json", tmp_path / name, allow_empty=True)
        assert both.llm.tolist() == [10, 20] and both.sources == (str(tmp_path / "a.json"), str(tmp_path / name))


def test_utf8_byte_order_mark_is_skipped(tmp_path):
    for name, data in (
        ("bom.json", b"\xef\xbb\xbf" + GOOD_LIST),
        ("bom.jsonl", b'\xef\xbb\xbf{"token_num": 4}\n{"token_num": 5}\n'),
    ):
        (tmp_path / name).write_bytes(data)
        assert len(load_lengths(tmp_path / name)) == 2
    meta = tmp_path / "meta.json"
    meta.write_bytes(b"\xef\xbb\xbf" + json.dumps({"a": {"token_lengths": "bom.json"}}).encode())
    assert load_lengths(meta).llm.tolist() == [10, 20]


def test_escaped_keys_are_decoded_and_minus_zero_is_zero(tmp_path):
    path = tmp_path / "escaped.json"
    path.write_bytes(
        b'[{"token\\u005fnum": 7, "vit\\u005Fnum": 2, "n\\u00f6te\\ud83d\\ude00": "\\"x\\\\"},'
        b' {"token_num": -0, "vit_num": -0}]'
    )
    lengths = load_lengths(path)
    assert lengths.vit.tolist() == [2, 0] and lengths.llm.tolist() == [7, 0]


def test_meta_file_errors_name_the_meta_file_and_entry(tmp_path):
    (tmp_path / "a.json").write_bytes(GOOD_LIST)
    cases = {
        "number.json": ({"a": {"token_lengths": 5}}, "entry 'a': 'token_lengths' must be a path string, got 5"),
        "list.json": ({"a": {"token_lengths": ["a.json"]}}, "'token_lengths' must be a path string"),
        "missing_one.json": (
            {"a": {"token_lengths": "a.json"}, "b": {"root": "/img"}},
            "entry 'b' has no 'token_lengths'",
        ),
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

_KEYS = st.sampled_from(
    ["vit_num", "token_num", "vit_seqlens", "label_num", "image_flags", "other", "vit_numx", "token"]
)
_SCALARS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_COUNTS = st.integers(-3, 2**31 + 3)
# Long texts too: an error quotes at most 40 bytes of a value, and must not cut a character doing so.
_ANY_RECORD = st.dictionaries(
    _KEYS,
    st.one_of(_COUNTS, st.lists(_COUNTS, max_size=3), _VALUES, st.lists(st.text(min_size=1, max_size=30), max_size=2)),
    max_size=4,
)


@st.composite
def _valid_record(draw: st.DrawFn) -> dict:
    """A record the scanner must accept (loads, ViT sequence lengths and labels that agree), with extra fields."""
    seqlens = draw(st.lists(st.integers(0, 2**29), max_size=4))
    tokens = draw(st.integers(0, 2**31 - 1))
    rec = {"token_num": tokens}
    if draw(st.booleans()):
        rec["vit_seqlens"] = seqlens
    if "vit_seqlens" not in rec or draw(st.booleans()):
        rec["vit_num"] = sum(seqlens)
    if draw(st.booleans()):
        rec["label_num"] = draw(st.integers(0, max(tokens - 1, 0)))
    rec.update(draw(st.dictionaries(st.text(max_size=4), _VALUES, max_size=2)))
    return dict(draw(st.permutations(list(rec.items()))))


_RECORDS = st.lists(st.one_of(_valid_record(), _ANY_RECORD), max_size=6)


def _is_count(v: object) -> bool:
    return type(v) is int and 0 <= v < 2**31


def _reference(records: object) -> tuple | None:
    """What a strict reader must return for decoded records (by the rules of length_records.hpp); None: fail."""
    if not isinstance(records, list):
        return None
    vit, llm, label, seqlens, offsets, given = [], [], [], [], [0], []
    for rec in records:
        if not isinstance(rec, dict) or "token_num" not in rec:
            return None
        counts = [rec[k] for k in ("vit_num", "token_num", "label_num") if k in rec]
        if not all(_is_count(v) for v in counts):
            return None
        v = rec.get("vit_num")
        if "vit_seqlens" in rec:
            run = rec["vit_seqlens"]
            if not isinstance(run, list) or not all(_is_count(x) for x in run):
                return None
            if (v is None and sum(run) >= 2**31) or (v is not None and sum(run) != v):
                return None
            v = sum(run)
            seqlens.extend(run)
        if rec.get("label_num", -1) > max(rec["token_num"] - 1, 0):
            return None
        vit.append(v or 0)
        llm.append(rec["token_num"])
        label.append(rec.get("label_num", -1))
        offsets.append(len(seqlens))
        given.append("vit_seqlens" in rec)
    has_seqlens = any(given)
    return (
        vit,
        llm,
        seqlens if has_seqlens else None,
        offsets if has_seqlens else None,
        given if has_seqlens else None,
        label if any(x >= 0 for x in label) else None,
    )


def _json_reference(text: bytes, lines: bool = False) -> tuple | None:
    """``_reference`` of ``text`` decoded by Python's json (one document, or one per line); None: must fail."""
    no_constants = {"parse_constant": lambda c: (_ for _ in ()).throw(ValueError(c))}
    try:
        decoded = text.decode("utf-8")
        if lines:
            records = [json.loads(line, **no_constants) for line in decoded.split("\n") if line.strip()]
        else:
            records = json.loads(decoded, **no_constants)
    except (ValueError, UnicodeDecodeError):
        return None
    return _reference(records)


def _scan(text: bytes) -> tuple | None:
    r = load_extension().parse_length_records(text, "vit_num", "token_num")
    if r.error:
        return None
    return tuple(
        None if a is None else a.tolist()
        for a in (r.vit, r.llm, r.vit_seqlens, r.vit_seqlens_offsets, r.vit_seqlens_given, r.label)
    )


def _reads_what_json_reads(records: list, indent: int | None, ascii_only: bool, lines: bool) -> None:
    if lines:  # JSON Lines: one object per line, so no indentation
        text = "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in records).encode()
    else:
        text = json.dumps(records, indent=indent, ensure_ascii=ascii_only).encode()
    expected = _json_reference(text, lines)
    assert expected == _reference(records)  # the text holds the records
    assert _scan(text) == expected, text


def _never_accepts_what_json_rejects(records: list, data: st.DataObject) -> None:
    """Cut, doubled, deleted or inserted bytes: whatever the scanner accepts, json reads the same way."""
    text = bytearray(json.dumps(records, separators=(",", ":")).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["delete", "insert", "double", "cut"]))
        if kind == "delete" and i < len(text):
            del text[i]
        elif kind == "insert":
            text[i:i] = data.draw(
                st.sampled_from([b",", b"]", b"[", b"{", b"}", b'"', b":", b"-", b"0", b" ", b"\\", b"e", b"n"])
            )
        elif kind == "double" and i < len(text):
            text[i:i] = text[i : i + 1]
        elif kind == "cut":
            del text[i:]
    text = bytes(text)
    if text.lstrip().startswith(b"["):  # a JSON list: json is the judge (JSON Lines it cannot read)
        assert _scan(text) == _json_reference(text), text


# Whole characters, pieces of characters, and byte sequences that are never UTF-8 (an overlong form, an
# encoded surrogate, a code point past U+10FFFF, bytes that never occur).
_BYTES = [
    b"\xc3\xa9",
    b"\xe2\x82\xac",
    b"\xf0\x9f\x98\x80",
    b"\xc3",
    b"\xa9",
    b"\xe2\x82",
    b"\xf0\x9f\x98",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf8",
    b"\xff",
    b"\n",
]


def _line_column(text: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of a byte offset, from the valid UTF-8 before it."""
    line_start = text.rfind(b"\n", 0, offset) + 1
    return text.count(b"\n", 0, offset) + 1, len(text[line_start:offset].decode("utf-8")) + 1


def _refuses_what_is_not_utf8(records: list, data: st.DataObject) -> None:
    """Bytes inserted anywhere: text that is not UTF-8 is an error at its first bad byte (or at a grammar error
    before it), and the message is always text."""
    text = bytearray(json.dumps(records, ensure_ascii=data.draw(st.booleans())).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        text[i:i] = data.draw(st.sampled_from(_BYTES))
    text = bytes(text)
    error = load_extension().parse_length_records(text, "vit_num", "token_num").error  # a str, whatever it holds
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        found = re.search(r"\(line (\d+), column (\d+)\)$", error)
        assert found, (text, error)
        where, first_bad = (int(found[1]), int(found[2])), _line_column(text, exc.start)
        if "not UTF-8" in error:
            assert where == first_bad, (text, error)
        else:
            assert where <= first_bad, (text, error)
        return
    assert (error == "") == (_json_reference(text) is not None), (text, error)


_AGREEMENT = {
    "records": _RECORDS,
    "indent": st.sampled_from([None, 0, 2]),
    "ascii_only": st.booleans(),
    "lines": st.booleans(),
}
_MUTATED = {"records": _RECORDS.filter(bool), "data": st.data()}


@settings(max_examples=80, deadline=None)
@given(**_AGREEMENT)
def test_scanner_reads_what_json_reads(records, indent, ascii_only, lines):
    _reads_what_json_reads(records, indent, ascii_only, lines)


@settings(max_examples=150, deadline=None)
@given(**_MUTATED)
def test_scanner_never_accepts_what_json_rejects(records, data):
    _never_accepts_what_json_rejects(records, data)


@settings(max_examples=150, deadline=None)
@given(**_MUTATED)
def test_scanner_refuses_what_is_not_utf8(records, data):
    _refuses_what_is_not_utf8(records, data)


# CI runs the properties on fixed draws (tests/conftest.py); these seeds make it draw again, differently.
_CI_SEEDS = (1, 2, 3, 5, 8, 13)


@pytest.mark.parametrize("seed_value", _CI_SEEDS)
@pytest.mark.parametrize(
    "check, strategies",
    [
        (_reads_what_json_reads, _AGREEMENT),
        (_never_accepts_what_json_rejects, _MUTATED),
        (_refuses_what_is_not_utf8, _MUTATED),
    ],
    ids=["reads_what_json_reads", "never_accepts_what_json_rejects", "refuses_what_is_not_utf8"],
)
def test_scanner_properties_on_more_seeds(check, strategies, seed_value):
    seed(seed_value)(settings(max_examples=60, deadline=None, database=None)(given(**strategies)(check)))()
