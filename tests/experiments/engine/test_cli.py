"""experiments/engine/cli.py: `python -m experiments`'s one-line errors on bad input (--jobs out
of range or not a whole number: exit 2; an unknown page, an --out that is a file or cannot be
written: exit 1) and its listing of the pages (no page, or --list)."""

from __future__ import annotations

import os
import subprocess

import pytest

from experiments.engine.cli import main
from experiments.engine.pool import MAX_JOBS

from engine_pages import registry
from tests.experiments.engine._support import _cli


@pytest.mark.parametrize("jobs", ["0", "-1", "abc", "1.5", "2e3", str(10**18), str(MAX_JOBS + 1)])
def test_bad_jobs_is_one_line_and_exit_2(tmp_path, capsys, jobs):
    code, err = _cli(["engine-test", "--jobs", jobs, "--out", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: argument --jobs: "), err
    assert not (tmp_path / "engine-test.jsonl").exists()


def test_unknown_page_and_unwritable_out_are_one_line(tmp_path, capsys):
    code, err = _cli(["nope"], capsys)
    assert code == 1 and err == [
        "error: unknown page 'nope'; pages: engine-test (python -m experiments --list)"
    ]
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, text in ((afile, "is a file, not a folder"), (afile / "sub", "not a folder")):
        code, err = _cli(["engine-test", "--out", str(out)], capsys)
        assert code == 1 and len(err) == 1 and f"--out {out}" in err[0] and text in err[0]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write: mode 0555, or for root (whom modes do not stop) the
    immutable attribute or a read-only tmpfs, whichever this machine allows."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        yield folder
        subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("root here can neither set the immutable attribute nor mount a tmpfs")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_out_is_one_line(read_only_folder, capsys):
    for argv in ([], ["--render-only"]):
        code, err = _cli(["engine-test", *argv, "--out", str(read_only_folder)], capsys)
        assert code == 1 and len(err) == 1
        assert err[0].startswith(f"error: --out {read_only_folder} is not a folder this process")


def test_no_page_or_list_lists_the_pages(capsys):
    for argv in ([], ["--list"]):
        assert main(argv, registry) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1] == "  engine-test  a page for the engine's tests"


def test_list_with_a_page_is_refused_in_one_line(capsys):
    """`--list PAGE` listed the pages and exit 0, the page word dropped unsaid."""
    code, err = _cli(["engine-test", "--list"], capsys)
    assert code == 1 and err == [
        "error: --list takes no page (got 'engine-test'): run `python -m experiments --list`, "
        "or `python -m experiments engine-test` to make it"
    ]
