"""training/session.py: what surrounds the training loop. An epoch's end makes the evaluation and
the checkpoint that are due (every `eval_every` and `checkpoint_every` epochs, and at the last);
config.yaml is written once, its provenance as comments above a config that reads back as the
run's whatever the command line held; a checkpoint that cannot be written stops every rank, advising
--resume only where every rank holds an earlier one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train
from tests.conftest import TINY, no_space_for, one_error
from tests.conftest import errors_on_every_rank as every_rank
from tests.conftest import tiny_config as tiny

ROOT = Path(__file__).resolve().parents[2]


def test_evaluations_and_checkpoints_fall_on_their_multiples_and_on_the_last_epoch(tmp_path):
    out = tmp_path / "run"
    config = tiny(f"out_dir={out}", "epochs=5", "eval_every=2", "checkpoint_every=3")
    summaries = LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)
    total = summaries[0]["steps"]
    per_epoch = total // 5
    assert total == 5 * per_epoch
    for summary in summaries:
        history = summary["history"]
        evals = [(r["epoch"], r["step"]) for r in history if r["kind"] == "eval"]
        assert evals == [(2, 2 * per_epoch), (4, 4 * per_epoch), (5, total)]
        logs = [r["step"] for r in history if r["kind"] == "log"]
        assert logs == list(range(config.log_every, total + 1, config.log_every))
    assert [ckpt.available_epochs(out, rank) for rank in range(4)] == [[3, 5]] * 4


def test_config_yaml_reads_back_as_the_run_config_whatever_the_command_line_held(tmp_path):
    """A run started by a `python -c` program of several lines: its command line, on one comment
    line with the line breaks escaped, leaves config.yaml valid YAML that loads as the run's
    config (what --resume reads)."""
    out = tmp_path / "run"
    program = textwrap.dedent(
        f"""
        import sys
        from gossip_powersgd import run
        from gossip_powersgd.training.config import load_config

        run(load_config({str(TINY)!r}, ["quiet=true", "epochs=1", "out_dir=" + sys.argv[1]]))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run(
        [sys.executable, "-c", program, str(out)], check=True, timeout=120, cwd=tmp_path, env=env
    )
    lines = (out / "config.yaml").read_text().splitlines()
    comments = [line for line in lines if line.startswith("# ")]
    assert lines[: len(comments)] == comments and len(comments) == 4
    assert comments[2].startswith("# command: ") and "\\nimport sys\\n" in comments[2]
    expected = tiny(f"out_dir={out}", "epochs=1").replace(peers=4)  # as `run` completes it
    assert load_config(out / "config.yaml") == expected


def test_a_full_disk_during_a_checkpoint_stops_every_rank_keeping_the_previous_one(
    tmp_path, monkeypatch
):
    out = tmp_path / "run"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-2.pt")
    errors = every_rank(tiny(f"out_dir={out}"))
    assert set(errors) == {
        f"ValueError: rank 1: cannot write the epoch-2 checkpoint in "
        f"{out / 'checkpoints'}: No space left on device; the previous "
        "checkpoints are intact (free space, then --resume)"
    }
    assert ckpt.available_epochs(out, 1) == [1]
    for rank in range(4):
        assert ckpt.read_checkpoint(ckpt.checkpoint_path(out, rank, 1))["header"]["epoch"] == 1


def test_a_full_disk_at_the_first_checkpoint_does_not_advise_resume(tmp_path, monkeypatch):
    """No rank can resume when the first checkpoint failed: the line says to start again; a full
    disk at a later checkpoint, once every rank holds an earlier one, says --resume."""
    out = tmp_path / "run"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-1.pt")
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2")))
    assert "--resume" not in error
    assert error.endswith(
        "no checkpoint is held by every rank yet, so the run cannot be resumed: free space, "
        f"then start it again (in a new run directory, or after emptying {out})"
    )
    monkeypatch.undo()
    later = tmp_path / "later"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-2.pt")
    error = one_error(every_rank(tiny(f"out_dir={later}", "epochs=2")))
    assert error.endswith("the previous checkpoints are intact (free space, then --resume)")
