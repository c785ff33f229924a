"""Run one test scenario on this MPI rank and save what it returns.

    mpiexec -n 4 python tests/support/mpi_worker.py MODULE:FUNCTION TOPOLOGY OUT_DIR [ARGS...]

FUNCTION(comm, *ARGS) runs with an `MPICommunicator` on `topologies.parse(TOPOLOGY)`; its return
value (tensors, numbers, dicts or lists of them) is saved to OUT_DIR/rank-K.pt, so that the test can
compare it bit for bit with the same function run under `LocalCluster`.
"""

import importlib
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [
    str(HERE),
    str(HERE.parents[1]),
]  # the support modules; tests.<package>.test_<module>
torch.set_num_threads(1)


def main() -> None:
    target, spec, out_dir, *args = sys.argv[1:]
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)

    import topologies
    from gossip_powersgd import MPICommunicator

    comm = MPICommunicator(topologies.parse(spec), timeout=60)
    result = function(comm, *args)
    path = Path(out_dir) / f"rank-{comm.rank}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(result, tmp)
    tmp.replace(path)


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
