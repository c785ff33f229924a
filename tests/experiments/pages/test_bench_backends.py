"""experiments/pages/bench_backends.py: the one training command each backend's run starts (the
same program, config and settings; the launcher and its process count per backend). The page end
to end (--quick: a run under each of local, mpiexec and torchrun, the same models):
tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.pages import bench_backends as page


def test_each_backend_runs_the_same_training_program_under_its_own_launcher():
    c = dict(page.SETTING[True], peers=4)
    program = ["-m", "gossip_powersgd.cli.train", "--config", c["config"], "--quiet"]
    commands = {b: page.command(b, c, "OUT") for b in ("local", "mpi", "torch")}
    for backend, argv in commands.items():
        i = argv.index("-m")
        assert argv[i : i + 5] == program
        assert argv[i - 1] == ("4" if backend == "torch" else sys.executable)  # torchrun: its own
        sets = [argv[k + 1] for k in range(len(argv) - 1) if argv[k] == "--set"]
        assert sets == [f"backend={backend}", "out_dir=OUT", *c["set"]]
    assert commands["local"][0] == sys.executable
    assert Path(commands["mpi"][0]).name.startswith("mpiexec") and commands["mpi"][1:3] == [
        "-n",
        "4",
    ]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    assert commands["torch"][:4] == [torchrun, "--standalone", "--nproc-per-node", "4"]
