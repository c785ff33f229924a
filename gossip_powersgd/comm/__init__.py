"""Transports (in-process, MPI, torch.distributed): who talks to whom, and the only place where
bytes are counted.

The names are imported on first use (PEP 562), so that the MPI start-up (`comm.mpi`) is reached
from the training program without importing torch."""

from typing import TYPE_CHECKING

from ..utils import lazy_exports

#: Each public name -> the module it lives in (imported when the name is first read).
_HOMES = {
    "AgreementError": "base",
    "Comm": "base",
    "CommStats": "base",
    "Communicator": "base",
    "CommunicationError": "base",
    "PeerAborted": "base",
    "reduce_in_rank_order": "reduce",
    "ring_allreduce_bytes": "base",
    "ring_chunks": "base",
    "LocalCluster": "local",
    "LocalCommunicator": "local",
    "run_local": "local",
    "MPICommunicator": "mpi",
    "TorchCommunicator": "torch",
}

if TYPE_CHECKING:
    from .base import (  # noqa: F401
        AgreementError,
        Comm,
        CommStats,
        Communicator,
        CommunicationError,
        PeerAborted,
        ring_allreduce_bytes,
        ring_chunks,
    )
    from .reduce import reduce_in_rank_order  # noqa: F401
    from .local import LocalCluster, LocalCommunicator, run_local  # noqa: F401
    from .mpi import MPICommunicator  # noqa: F401
    from .torch import TorchCommunicator  # noqa: F401

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = list(_HOMES)
