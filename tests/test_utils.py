"""The shared helpers: one-line errors, atomic writes, rank ranges, and run_peers on one process."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import topologies
from gossip_powersgd import run_peers
from gossip_powersgd.launch import resolve_backend
from gossip_powersgd.utils import (
    atomic_write,
    escaped,
    format_ranks,
    one_line,
    remove_leftover_temporaries,
    write_stderr_line,
)

ROOT = Path(__file__).resolve().parents[1]


def test_one_line_takes_the_first_line_and_unquotes_key_errors():
    assert one_line(ValueError("first\nsecond")) == "first"
    assert one_line(KeyError("missing key")) == "missing key"
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(ValueError("x" * 300), limit=200) == "x" * 200


def test_escaped_keeps_printable_text_and_writes_the_rest_as_python_escapes():
    assert escaped("café, 東京 and spaces") == "café, 東京 and spaces"
    assert escaped("a\nb\r\tc\x1b[1m") == "a\\nb\\r\\tc\\x1b[1m"
    assert escaped("\u2028\x85\udce9") == "\\u2028\\x85\\udce9"  # YAML's breaks; a surrogate
    assert "\n" not in escaped("x\n" * 3) and escaped("x\ny").encode("utf-8")


def test_format_ranks_compacts_runs():
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([3]) == "3"
    assert format_ranks([2, 0, 1]) == "0-2"


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.txt"
    atomic_write(path, "old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(path.parent) == ["out.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    atomic_write(path, "old")
    with pytest.raises(TypeError):
        atomic_write(path, 12345)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "new")  # fails after the data went to the temporary file
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def killed_while_writing(path: Path) -> Path:
    """atomic_write(path) in a process SIGKILLed between its mkstemp and its os.replace (a kill
    no `finally` sees): the temporary file it leaves behind."""
    before = set(path.parent.iterdir()) if path.parent.is_dir() else set()
    code = (
        "import os, signal, sys\nfrom gossip_powersgd.utils import atomic_write\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write(sys.argv[1], 'half of a new version')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL
    (left,) = set(path.parent.iterdir()) - before
    return left


def test_a_killed_writers_temporary_is_removed_where_the_file_is_written_again(tmp_path):
    """A kill between mkstemp and os.replace leaves `.NAME.XXXXXXXX.tmp`; the writer's next
    process removes those of its own files only (a file another writer writes may be mid-write)."""
    path = tmp_path / "rank-2-x.json"
    atomic_write(path, "whole")
    mine, theirs = killed_while_writing(path), killed_while_writing(tmp_path / "rank-1-x.json")
    assert re.fullmatch(r"\.rank-2-x\.json\.[^.]+\.tmp", mine.name), mine.name
    remove_leftover_temporaries(tmp_path, re.escape(path.name))
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, theirs.name])
    assert path.read_text() == "whole"
    remove_leftover_temporaries(tmp_path / "absent", "x")  # no folder: nothing to do


def test_atomic_write_without_sync_replaces_whole_and_calls_no_fsync(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    atomic_write(path, "old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(AssertionError("fsync")))
    atomic_write(path, "new", mode=0o600, sync=False)
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["out.txt"]


def test_run_peers_local_returns_every_rank_by_rank():
    def fn(comm, base):
        t = torch.tensor([float(comm.rank)])
        comm.allreduce_(t, op="sum")
        return base + comm.rank, float(t)

    results = run_peers(topologies.ring(4), fn, 10, backend="local")
    assert results == {r: (10 + r, 6.0) for r in range(4)}


def test_backend_choice_outside_mpiexec():
    assert resolve_backend(None) == "local"
    assert resolve_backend("auto") == "local"
    with pytest.raises(
        ValueError, match="backend mpi runs one peer per MPI rank: launch with mpiexec"
    ):
        resolve_backend("mpi")
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_backend("gloo")


def test_stderr_line_is_one_write_so_ranks_cannot_interleave(monkeypatch):
    """mpiexec merges every rank's stderr; `print` would write the text and its newline apart."""
    calls = []

    class Recorder:
        def write(self, text):
            calls.append(text)

        def flush(self):
            calls.append(None)

    monkeypatch.setattr("sys.stderr", Recorder())
    write_stderr_line("error (rank 2): bad data")
    assert calls == ["error (rank 2): bad data\n", None]


def test_check_writable_dir_makes_the_directory_and_leaves_nothing_in_it(tmp_path):
    from gossip_powersgd.utils import check_writable_dir

    target = tmp_path / "a" / "b"
    assert check_writable_dir(target) == target and target.is_dir() and not any(target.iterdir())
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"cannot write to .*f/c: Not a directory; pick another"):
        check_writable_dir(tmp_path / "f" / "c", "pick another")
