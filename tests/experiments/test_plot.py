"""experiments/plot.py: `python -m experiments.plot` is the `gossip-plot` program under the name a
checkout's commands use; the program itself: tests/cli/test_plot.py."""

from __future__ import annotations

import pytest

import experiments.plot as shim
from gossip_powersgd.cli import plot as program


def test_it_is_the_plotting_program_under_its_own_module_name(capsys):
    assert (shim.plot_runs, shim.read_run, shim.FIGURES) == (
        program.plot_runs,
        program.read_run,
        program.FIGURES,
    )
    with pytest.raises(SystemExit) as ended:
        shim.run(["--help"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m experiments.plot ")
