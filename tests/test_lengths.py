"""load_lengths: every supported format, validation with file and sample named, the bundled data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnibal_kernels import Lengths, load_lengths
from omnibal_kernels.lengths import default_lengths

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "internvl_sft_lengths"


def _write_json(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records, indent=2))
    return path


def test_omnibal_json_list(tmp_path):
    p = _write_json(
        tmp_path / "a.json",
        [{"vit_num": 5, "token_num": 1420, "image_flags": 5}, {"vit_num": 1, "token_num": 300, "image_flags": 1}],
    )
    lengths = load_lengths(p)
    assert len(lengths) == 2
    assert lengths.vit.tolist() == [5, 1] and lengths.llm.tolist() == [1420, 300]
    assert lengths.vit.dtype == np.int64 and lengths.sources == (str(p),)


def test_jsonl_and_text_only_samples(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"token_num": 12, "meta": {"x": [1, "}"]}}\n{"vit_num": 2, "token_num": 40}\n')
    lengths = load_lengths(p)
    assert lengths.vit.tolist() == [0, 2] and lengths.llm.tolist() == [12, 40]


def test_meta_file_relative_paths_in_order(tmp_path):
    _write_json(tmp_path / "x.json", [{"vit_num": 1, "token_num": 10}])
    (tmp_path / "sub").mkdir()
    _write_json(tmp_path / "sub" / "y.json", [{"vit_num": 2, "token_num": 20}, {"vit_num": 3, "token_num": 30}])
    meta = tmp_path / "meta.json"
    meta.write_text(
        json.dumps({"first": {"token_lengths": "x.json", "root": "/img"}, "second": {"token_lengths": "sub/y.json"}})
    )
    lengths = load_lengths(meta)
    assert lengths.llm.tolist() == [10, 20, 30]
    assert lengths.source.tolist() == [0, 1, 1]


def test_meta_file_that_lists_itself_is_an_error(tmp_path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"loop": {"token_lengths": "meta.json"}}))
    with pytest.raises(ValueError, match="leads back to itself"):
        load_lengths(meta)


def test_a_json_object_without_token_lengths_reads_as_one_record(tmp_path):
    p = tmp_path / "one.json"
    p.write_text(json.dumps({"vit_num": 2, "token_num": 30}))
    lengths = load_lengths(p)
    assert lengths.vit.tolist() == [2] and lengths.llm.tolist() == [30]


def test_npy_and_npz(tmp_path):
    np.save(tmp_path / "tok.npy", np.array([5, 6, 7], np.int32))
    np.save(tmp_path / "pairs.npy", np.array([[1, 10], [2, 20]], np.int64))
    np.savez(tmp_path / "z.npz", vit=np.array([3]), llm=np.array([33]))
    np.savez(tmp_path / "omni.npz", vit_num=np.array([4]), token_num=np.array([44]))
    lengths = load_lengths(tmp_path / "tok.npy", tmp_path / "pairs.npy", tmp_path / "z.npz", tmp_path / "omni.npz")
    assert lengths.vit.tolist() == [0, 0, 0, 1, 2, 3, 4]
    assert lengths.llm.tolist() == [5, 6, 7, 10, 20, 33, 44]
    assert lengths.source.tolist() == [0, 0, 0, 1, 1, 2, 3]


@pytest.mark.parametrize(
    "record, message",
    [
        ({"vit_num": -1, "token_num": 5}, "negative"),
        ({"vit_num": 1, "token_num": 3.5}, "non-integer"),
        ({"vit_num": 1, "token_num": "12"}, "non-integer"),
        ({"vit_num": None, "token_num": 12}, "non-integer"),
        ({"vit_num": 1}, "missing"),
        ({"vit_num": 1, "token_num": 2**31}, "too large"),
    ],
)
def test_bad_json_values_name_file_and_sample(tmp_path, record, message):
    p = _write_json(tmp_path / "bad.json", [{"vit_num": 1, "token_num": 2}, {"vit_num": 1, "token_num": 2}, record])
    with pytest.raises(ValueError, match=message) as info:
        load_lengths(p)
    assert str(p) in str(info.value) and "sample 2" in str(info.value)


def test_bad_array_values_name_file_and_sample(tmp_path):
    np.save(tmp_path / "neg.npy", np.array([3, -4, 5]))
    with pytest.raises(ValueError, match=r"neg\.npy: sample 1: llm is negative"):
        load_lengths(tmp_path / "neg.npy")
    np.save(tmp_path / "frac.npy", np.array([[1, 2.5]]))
    with pytest.raises(ValueError, match=r"sample 0: llm is not an integer"):
        load_lengths(tmp_path / "frac.npy")


def test_unknown_format_missing_file_and_no_paths(tmp_path):
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(ValueError, match="unknown length file type"):
        load_lengths(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        load_lengths(tmp_path / "missing.json")
    with pytest.raises(ValueError):
        load_lengths()
    with pytest.raises(ValueError, match="not closed"):
        (tmp_path / "open.json").write_text('[{"token_num": 1}')
        load_lengths(tmp_path / "open.json")


def test_progress_bar_over_files_goes_to_stderr(tmp_path, capsys):
    pytest.importorskip("tqdm")
    for name in ("a", "b"):
        _write_json(tmp_path / f"{name}.json", [{"vit_num": 1, "token_num": 10}])
    lengths = load_lengths(tmp_path / "a.json", tmp_path / "b.json", progress=True)
    assert len(lengths) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "reading length files" in captured.err


def test_lengths_validation_and_subsets():
    with pytest.raises(ValueError, match="same length"):
        Lengths(np.array([1, 2]), np.array([3]))
    lengths = Lengths(np.array([1, 2, 3]), np.array([10, 20, 30]))
    sub = lengths[np.array([2, 0])]
    assert sub.vit.tolist() == [3, 1] and sub.llm.tolist() == [30, 10]
    assert lengths.summary()["llm_total"] == 60


def test_bundled_data_matches_the_shared_files():
    lengths = default_lengths()
    assert len(lengths) == 70_706
    assert len(lengths.sources) == 4
    if not SHARED.exists():
        pytest.skip("the shared length files are not beside this checkout")
    names = [Path(s).name for s in lengths.sources]
    full = load_lengths(*(SHARED / n for n in names))
    np.testing.assert_array_equal(full.vit, lengths.vit)
    np.testing.assert_array_equal(full.llm, lengths.llm)


def test_label_counts_are_kept_checked_and_written(tmp_path):
    from omnibal_kernels import write_lengths

    vit, llm, label = np.array([0, 2, 1]), np.array([10, 30, 5]), np.array([9, 12, 0])
    lengths = Lengths(vit, llm, label=label)
    label[0] = 1  # a copy is kept, read-only
    assert lengths.label.tolist() == [9, 12, 0] and not lengths.label.flags.writeable
    assert lengths[np.array([2, 0])].label.tolist() == [0, 9]
    assert Lengths.concat([lengths, lengths[:1]]).label.tolist() == [9, 12, 0, 9]
    assert Lengths.concat([lengths, Lengths(vit, llm)]).label is None  # only where every part has them
    assert Lengths(vit, llm).label is None
    with pytest.raises(ValueError, match="sample 2: label is 5 but llm is 5; a sample has at most llm - 1"):
        Lengths(vit, llm, label=[1, 1, 5])
    with pytest.raises(ValueError, match="sample 1: label is negative"):
        Lengths(vit, llm, label=[1, -1, 0])
    with pytest.raises(ValueError, match="label must have one entry per sample, got 2 for 3"):
        Lengths(vit, llm, label=[1, 1])

    back = load_lengths(write_lengths(tmp_path / "l.npz", lengths))
    assert back.label.tolist() == [9, 12, 0] and back.llm.tolist() == [10, 30, 5]
    assert load_lengths(write_lengths(tmp_path / "plain.npz", Lengths(vit, llm))).label is None
    back = load_lengths(write_lengths(tmp_path / "m.npz", {"vit": vit, "llm": llm, "label": [1, 2, 3]}))
    assert back.label.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="writing .*: sample 0: label is 10 but llm is 10"):
        write_lengths(tmp_path / "bad.npz", {"vit": vit, "llm": llm, "label": [10, 0, 0]})
    np.savez(tmp_path / "stale.npz", vit=vit, llm=llm, label=np.array([1, 40, 0]))
    with pytest.raises(ValueError, match="stale.npz: sample 1: label is 40 but llm is 30"):
        load_lengths(tmp_path / "stale.npz")
    records = json.loads((write_lengths(tmp_path / "l.json", lengths)).read_text())
    assert records == [
        {"vit_num": 0, "token_num": 10, "label_num": 9},
        {"vit_num": 2, "token_num": 30, "label_num": 12},
        {"vit_num": 1, "token_num": 5, "label_num": 0},
    ]
