"""gossip_powersgd/cli/__init__.py: how a program's usage line names it, its console script when
that is what ran, else ``python -m <module>``."""

from __future__ import annotations

import sys

from gossip_powersgd.cli import program_name


def test_a_program_names_its_console_script_only_when_that_ran(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gossip-train", "--config", "tiny"])
    assert program_name("gossip_powersgd.cli.train", "gossip-train") == "gossip-train"
    for argv in (["/repo/experiments/train.py"], ["-m"], [], ["/venv/bin/gossip-plot"]):
        monkeypatch.setattr(sys, "argv", argv)
        assert program_name("experiments.train", "gossip-train") == "python -m experiments.train"
