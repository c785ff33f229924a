"""experiments/engine/rows.py: a stored line that is not a whole row (cut short, a field missing,
not a JSON object) or that repeats a run's key is refused in one line naming its file and line,
never skipped, and the file is not rewritten; the temporary file a write killed midway left is
removed by the page's next write."""

from __future__ import annotations

import pytest

from tests.experiments.engine._support import _cli, _line, _stored


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"key": "k1", "config": {"i": 1', ":2: not a JSON row"),  # a write cut short
        ('{"key": "k1", "config": {}, "seed": 1}\n', ":2: the row has no 'quick'"),
        ('["k1"]\n', ":2: a row must be a JSON object"),
        (_line("k0", 0), ":2: run 'k0' is already at "),
    ],
)
def test_a_corrupt_partial_or_repeated_row_is_refused_in_one_line(tmp_path, capsys, bad, message):
    path = _stored(tmp_path, [_line("k0", 0), bad])
    for argv in (["--render-only"], []):
        code, err = _cli(["engine-test", *argv, "--out", str(tmp_path)], capsys)
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"error: {path}{message}"), err
    assert path.read_text().startswith(_line("k0", 0))  # nothing rewritten


def test_a_rows_file_that_is_not_utf8_is_refused_naming_it(tmp_path, capsys):
    """Before: "error: 'utf-8' codec can't decode byte 0xff in position ...", naming no file."""
    path = _stored(tmp_path, [_line("k0", 0)])
    path.write_bytes(path.read_bytes() + b"\xff\n")
    for argv in (["--render-only"], []):
        code, err = _cli(["engine-test", *argv, "--out", str(tmp_path)], capsys)
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"error: {path} is not UTF-8 text (byte "), err
    assert path.read_bytes().endswith(b"\xff\n")  # nothing rewritten


def test_the_next_write_removes_what_a_write_killed_midway_left_of_its_page_only(tmp_path):
    """A sweep killed inside a rows write (between atomic_write's mkstemp and its rename) leaves
    a hidden temporary file; before, nothing ever removed it from --out."""
    from experiments.engine import Record, RowFile

    ours = tmp_path / ".engine-test.jsonl.k1ll3d00.tmp"
    others = [tmp_path / ".other.jsonl.k1ll3d00.tmp", tmp_path / ".engine-test.jsonl2.ab12cd34.tmp"]
    for path in [ours, *others]:
        path.write_text('{"key": "k9"')
    record = Record("k0", {"i": 0}, 10, True, {"y": 0}, "abc", "2026-01-01", 0.5)
    RowFile(tmp_path / "engine-test.jsonl").append(record)
    assert not ours.exists()
    assert all(path.exists() for path in others)  # other pages' writers may still use theirs
    assert list(RowFile(tmp_path / "engine-test.jsonl").read()) == ["k0"]
