"""The transports a config's ``backend`` names, each describing how it is started and what it
builds: `TRANSPORTS`, a `Registry` of `Transport` classes.

A transport says whether it runs every peer in this process (`in_process`), which launcher starts
it, how to tell that this process was started for it (`detect`) and refuse a wrong start with the
command that works (`check_started`), how many processes the launcher started (`world_size`) and
how to run a function on its peers (`run_peers`; a launched one builds this process's
`communicator`). `launch.py` asks the entry instead of naming backends, so a new transport is one
file with a `Transport` subclass plus `register_transport(...)`.

The launcher environment is read here from variables only, before MPI or torch is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from ..registries import Registry

if TYPE_CHECKING:
    from topologies import Topology

    from .base import Communicator

__all__ = [
    "Transport",
    "TRANSPORTS",
    "register_transport",
    "transport",
    "launched_by_mpiexec",
    "launched_by_torchrun",
    "torchrun_world_size",
    "local_under_torchrun_error",
]


def launched_by_torchrun() -> bool:
    """True when torchrun (or a launcher setting its variables by hand) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ
    )


def torchrun_world_size() -> int:
    """WORLD_SIZE when torchrun (or a launcher setting its variables) started this process, else 1."""
    if not launched_by_torchrun():
        return 1
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def launched_by_mpiexec() -> bool:
    """True when this process is one rank of an mpiexec/mpirun job (MPICH, Open MPI, Slurm PMI)."""
    markers = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    return any(m in os.environ for m in markers)


def mpi_world_size() -> int:
    from .mpi import _mpi  # initialises MPI, the GIL released (see comm/mpi_world.py)

    return _mpi().COMM_WORLD.Get_size()


def local_under_torchrun_error(world_size: int) -> ValueError:
    """The one line for backend local in one of torchrun's processes: each would run every peer
    and all would then fight over the run directory's lock, which is all a user would see."""
    return ValueError(
        f"backend local runs every peer as a thread of one process, but torchrun "
        f"started {world_size} processes (WORLD_SIZE={world_size}): use --set "
        "backend=torch, or run without torchrun"
    )


def _fix(backend: str, cli: Optional[str]) -> str:
    return f"--set backend={backend}" if cli else f"backend {backend}"


class Transport:
    """One transport. Subclasses declare `name`, `summary`, `in_process` and, when launched,
    `launcher` (the command that starts one process per peer: "mpiexec", "torchrun"), and override
    `detect`, `check_started`, `world_size` and `communicator` (or `run_peers`)."""

    name: Optional[str] = None
    summary: Optional[str] = None
    options: Dict[str, Any] = {}
    #: Every peer runs in this process (the run's results hold every rank's value).
    in_process: Optional[bool] = None
    #: The launcher of a launched transport (None for an in-process one).
    launcher: Optional[str] = None
    #: Whether the run's `device` (a GPU) applies: the communicator is built for it.
    uses_device = False
    #: How a run with `on_peer_loss: continue` learns that peers left: "schedule" (a `churn:`
    #: schedule drives the membership, in process), "detected" (the liveness monitor finds a peer
    #: lost), or None: `continue` is refused, `peer_loss_note` saying why.
    peer_loss: Optional[str] = None
    #: Said after "on_peer_loss: continue is not supported on backend NAME": why (or "").
    peer_loss_note = ""
    #: The devices a `continue` run may use on this transport (None: any).
    peer_loss_devices: Optional[tuple] = None

    def detect(self) -> bool:
        """Whether this process was started for this transport (``backend: auto``)."""
        return False

    def check_started(self, cli: Optional[str], n: Any) -> None:
        """Refuse, with the command that works, a process started in a way this transport cannot
        run in (`cli`: the module the user runs; `n`: the number of peers)."""

    def command(self, n: Any = "N", cli: Optional[str] = None) -> str:
        """The command that starts `n` peers of this transport."""
        python = Path(sys.executable).name if cli else "python"
        return f"{self.launcher} -n {n} {python} -m {cli or '...'} ..."

    def launcher_name(self) -> str:
        """The launcher that started this process, as errors name it."""
        return self.launcher or "this process"

    def world_size(self) -> int:
        """How many processes the launcher started (1 in process)."""
        return 1

    def communicator(
        self, topology: "Topology", timeout: Optional[float], device: str
    ) -> "Communicator":
        raise ValueError(
            f"backend {self.name!r} has no communicator per process (local runs every "
            "peer in this one: run_peers)"
        )

    def connect(
        self, topology: "Topology", timeout: Optional[float], device: str
    ) -> "Communicator":
        """This process's communicator, after checking that the launcher started as many
        processes as `topology` has peers (an in-process transport has none: refused)."""
        if self.in_process:
            return self.communicator(topology, timeout, device)
        world = self.world_size()
        if topology.size != world:
            raise ValueError(
                f"topology {topology.name!r} has {topology.size} peers but "
                f"{self.launcher_name()} started {world} processes: start {topology.size}"
            )
        return self.communicator(topology, timeout, device)

    def run_peers(
        self,
        topology: "Topology",
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        timeout: Optional[float],
        device: str,
    ) -> Dict[int, Any]:
        """{rank: fn(comm, *args, **kwargs)} for this process's peer (a launched transport)."""
        comm = self.connect(topology, timeout, device)
        value = fn(comm, *args, **kwargs)
        if hasattr(comm, "close"):
            comm.barrier()  # every peer is done with the group before any leaves it
            comm.close()
        return {comm.rank: value}


def _declares_in_process(cls) -> list:
    problems = []
    if not isinstance(cls.in_process, bool):
        problems.append("`in_process` (True if every peer runs in this process)")
    elif not cls.in_process and not cls.launcher:
        problems.append("`launcher` (the command that starts its processes)")
    return problems


TRANSPORTS = Registry("transport", "backend", Transport, check=_declares_in_process)
register_transport = TRANSPORTS.register
transport = TRANSPORTS.get


@register_transport
class MPITransport(Transport):
    name = "mpi"
    summary = "one peer per MPI rank (mpiexec -n N ...; mpi4py)"
    in_process = False
    launcher = "mpiexec"
    peer_loss_note = " (MPICH is fail-stop: a dead rank ends the job)"

    def detect(self) -> bool:
        return launched_by_mpiexec() and mpi_world_size() > 1

    def check_started(self, cli, n) -> None:
        if launched_by_mpiexec():
            return
        if launched_by_torchrun():
            raise ValueError(
                f"backend mpi runs one peer per MPI rank, but torchrun started this "
                f"process: add {_fix('torch', cli)} (torch.distributed, the same "
                f"numbers), or launch with {self.command(n, cli)}"
            )
        raise ValueError(
            f"backend mpi runs one peer per MPI rank: launch with "
            f"{self.command(n, cli)}, or use {_fix('local', cli)}"
        )

    def world_size(self) -> int:
        return mpi_world_size()

    def communicator(self, topology: "Topology", timeout: Optional[float], device: str):
        from .mpi import MPICommunicator

        return MPICommunicator(topology, timeout=timeout)


@register_transport
class LocalTransport(Transport):
    name = "local"
    peer_loss = "schedule"
    summary = "every peer a thread of this one process (no launcher)"
    in_process = True

    def check_started(self, cli, n) -> None:
        if launched_by_mpiexec() and mpi_world_size() > 1:
            raise ValueError(
                f"backend local runs every peer as a thread of one process; do not "
                f"launch it with mpiexec -n {mpi_world_size()} (or use "
                f"{_fix('mpi', cli)})"
            )
        if torchrun_world_size() > 1:
            raise local_under_torchrun_error(torchrun_world_size())

    def run_peers(
        self,
        topology: "Topology",
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        timeout: Optional[float],
        device: str,
    ) -> Dict[int, Any]:
        from .local import LocalCluster

        values = LocalCluster(topology, timeout=timeout).run(fn, *args, **kwargs)
        return dict(enumerate(values))


@register_transport
class TorchTransport(Transport):
    name = "torch"
    peer_loss = "detected"
    peer_loss_devices = ("cpu",)  # the hand-over and the per-epoch groups are gloo's
    summary = "one peer per process of torch.distributed (torchrun; gloo, NCCL on cuda)"
    in_process = False
    launcher = "torchrun"
    uses_device = True

    def detect(self) -> bool:
        return launched_by_torchrun()

    def command(self, n="N", cli=None) -> str:
        return f"torchrun --nproc-per-node {n} -m {cli or '...'} ..."

    def launcher_name(self) -> str:
        return "torchrun" if launched_by_torchrun() else "mpiexec"

    def check_started(self, cli, n) -> None:
        if not (launched_by_torchrun() or launched_by_mpiexec()):
            raise ValueError(
                f"backend torch runs one peer per process: launch with "
                f"{self.command(n, cli)}, or use {_fix('local', cli)}"
            )

    def world_size(self) -> int:
        from .torch import launcher_environment

        return launcher_environment()[1]

    def communicator(self, topology: "Topology", timeout: Optional[float], device: str):
        from .torch import TorchCommunicator
        from .torch_rejoin import RejoiningCommunicator, rejoining

        kind = TorchCommunicator if rejoining() is None else RejoiningCommunicator
        return kind(topology, device=device, timeout=timeout)
