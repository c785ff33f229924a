"""Transports (in-process, MPI, torch.distributed): who talks to whom, and the only place where
bytes are counted."""

from .base import (
    AgreementError,
    Comm,
    CommStats,
    Communicator,
    CommunicationError,
    PeerAborted,
    reduce_in_rank_order,
    ring_allreduce_bytes,
    ring_chunks,
)
from .local import LocalCluster, LocalCommunicator, run_local
from .mpi import MPICommunicator
from .torch import TorchCommunicator

__all__ = [
    "AgreementError",
    "Comm",
    "CommStats",
    "Communicator",
    "CommunicationError",
    "PeerAborted",
    "reduce_in_rank_order",
    "ring_allreduce_bytes",
    "ring_chunks",
    "LocalCluster",
    "LocalCommunicator",
    "run_local",
    "MPICommunicator",
    "TorchCommunicator",
]
