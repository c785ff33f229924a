"""experiments/train.py: `python -m experiments.train` is the `gossip-train` program under the name
a checkout's commands use (its help and usage say `python -m experiments.train`); the programs'
runs themselves: tests/cli/test_train.py."""

from __future__ import annotations

import pytest

import experiments.train as shim
from gossip_powersgd.cli import train as program


def test_it_is_the_training_program_under_its_own_module_name(capsys):
    assert (shim.build_parser, shim.resolve) == (program.build_parser, program.resolve)
    with pytest.raises(SystemExit) as ended:
        shim.run(["--help"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m experiments.train ")
