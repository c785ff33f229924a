"""Run one test scenario, or one bad input, on this torch.distributed process and save the result.

    python -m torch.distributed.run --nproc-per-node 4 tests/support/torch_worker.py MODULE:FUNCTION TOPOLOGY OUT_DIR
    python tests/support/torch_worker.py --case CASE        (RANK/WORLD_SIZE/MASTER_* set by the test)

FUNCTION(comm) runs with a `TorchCommunicator` (gloo, CPU) on `topologies.parse(TOPOLOGY)`; its
return value is saved to OUT_DIR/rank-K.pt for a bit-for-bit comparison with the other transports.
A failure prints `error (rank K): <one line>` and exits 1 on every rank that failed.
"""

import importlib
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [
    str(HERE),
    str(HERE.parents[1]),
]  # the support modules; tests.<package>.test_<module>
torch.set_num_threads(1)

import topologies  # noqa: E402
from gossip_powersgd import ExactGossip, TorchCommunicator  # noqa: E402
from gossip_powersgd.comm.torch import exit_after_peers  # noqa: E402
from gossip_powersgd.utils import one_line, write_stderr_line  # noqa: E402


def scenario(target, spec, out_dir) -> None:
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    comm = TorchCommunicator(topologies.parse(spec), timeout=60)
    result = function(comm)
    path = Path(out_dir) / f"rank-{comm.rank}.pt"
    torch.save(result, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    comm.close()


def world_size() -> None:
    TorchCommunicator(topologies.ring(8), timeout=20)


def topologies_differ() -> None:
    n = int(os.environ["WORLD_SIZE"])
    spec = "star" if int(os.environ["RANK"]) == n - 1 else "ring"  # star:3 is no ring:3
    TorchCommunicator(topologies.parse(spec, n=n), timeout=20)


def shapes_differ() -> None:
    comm = TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), timeout=20)
    ExactGossip([torch.zeros(6 if comm.rank == 2 else 5, 3)], comm)


def message_size() -> None:
    comm = TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), timeout=20)
    size = 7 if comm.rank == 1 else 5
    comm.exchange(
        {j: torch.zeros(size) for j in comm.neighbors}, {j: torch.zeros(5) for j in comm.neighbors}
    )


def silent_peer() -> None:
    comm = TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), timeout=3)
    if comm.rank == 2:
        import time

        time.sleep(15)  # never sends: its neighbours must give up naming it
        return
    comm.exchange(
        {j: torch.zeros(4) for j in comm.neighbors}, {j: torch.zeros(4) for j in comm.neighbors}
    )


def nccl_without_cuda() -> None:
    TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), backend="nccl", timeout=20)


def device_differs() -> None:
    # the last rank claims a CUDA device; on a machine without CUDA the local check fires first, so the
    # disagreement is staged with a device type the store compares before any tensor moves
    n = int(os.environ["WORLD_SIZE"])
    comm_class = TorchCommunicator
    if int(os.environ["RANK"]) == n - 1 and not torch.cuda.is_available():
        import gossip_powersgd.comm.torch as transport

        transport.resolve_device = lambda device, backend: (torch.device("meta"), "gloo")
    comm_class(topologies.ring(n), timeout=20)


def tiny_timeout() -> None:
    # far below what connecting to the rendezvous takes
    TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), timeout=1e-6)


def join_ring() -> None:
    # joins a ring of WORLD_SIZE peers and leaves (a test holds the port or the store)
    TorchCommunicator(topologies.ring(int(os.environ["WORLD_SIZE"])), timeout=10).close()


CASES = {
    f.__name__: f
    for f in (
        world_size,
        topologies_differ,
        shapes_differ,
        message_size,
        silent_peer,
        nccl_without_cuda,
        device_differs,
        tiny_timeout,
        join_ring,
    )
}


def main() -> None:
    try:
        if sys.argv[1] == "--case":
            CASES[sys.argv[2]]()
        else:
            scenario(*sys.argv[1:4])
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and exit 1
        write_stderr_line(f"error (rank {os.environ.get('RANK', '?')}): {one_line(exc)}")
        exit_after_peers(1)


if __name__ == "__main__":
    main()
