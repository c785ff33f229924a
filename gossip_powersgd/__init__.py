"""gossip_powersgd: decentralized training with low-rank compressed gossip (PowerGossip).

Peers sit on a graph (see the `topologies` package) and talk only to their neighbours, through an
MPI transport (`MPICommunicator`, one peer per rank), a torch.distributed one (`TorchCommunicator`,
gloo or NCCL, one peer per process) or an in-process one (`LocalCluster`, one
thread per peer). Algorithms are written once for both.
"""

from .algorithms import (
    AllReduce,
    ChocoGossip,
    DeepSqueeze,
    ExactGossip,
    GossipAlgorithm,
    NonFiniteError,
    PowerGossip,
    PowerSGDAllReduce,
    PushSum,
    make_algorithm,
)
from .comm import (
    AgreementError,
    Communicator,
    CommunicationError,
    LocalCluster,
    MPICommunicator,
    PeerAborted,
    TorchCommunicator,
)
from .launch import run_peers
from .metrics import consensus_distance

__version__ = "0.1.0"

__all__ = [
    "ExactGossip", "PowerGossip", "PushSum", "ChocoGossip", "DeepSqueeze", "AllReduce",
    "PowerSGDAllReduce",
    "GossipAlgorithm", "NonFiniteError", "make_algorithm",
    "AgreementError", "Communicator", "CommunicationError", "LocalCluster", "MPICommunicator",
    "PeerAborted", "TorchCommunicator", "consensus_distance", "run_peers",
]
