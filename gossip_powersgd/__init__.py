"""gossip_powersgd: decentralized training with low-rank compressed gossip (PowerGossip).

Peers sit on a graph (see the `topologies` package) and talk only to their neighbours, through an
MPI transport (`MPICommunicator`, one peer per rank), a torch.distributed one (`TorchCommunicator`,
gloo or NCCL, one peer per process) or an in-process one (`LocalCluster`, one
thread per peer). Algorithms are written once for both.
"""

from .faults import early as _early  # noqa: F401 - first: standard library only, before torch
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
from .runner import RunResult, run
from .training.features import declare as _declare_feature
from .version import __version__  # noqa: F401

#: The config-driven features (`training/features.py`): each module registers its own when
#: imported, on first use; their hooks run in this order. A new feature is a module and a line here.
FEATURE_MODULES = (
    "gossip_powersgd.training.extensions",  # hooks: (user hooks), then loggers: (trackers)
    "gossip_powersgd.privacy.training",  # dp_*: differential privacy (DP-SGD)
    "gossip_powersgd.privacy.observing",  # observers:, observe_every: (last: they record the rest)
    "gossip_powersgd.training.churn",  # on_peer_loss:, churn:, churn_join: (its hook: the trainer's)
)
for _module in FEATURE_MODULES:
    _declare_feature(_module)

__all__ = [
    "ExactGossip",
    "PowerGossip",
    "PushSum",
    "ChocoGossip",
    "DeepSqueeze",
    "AllReduce",
    "PowerSGDAllReduce",
    "GossipAlgorithm",
    "NonFiniteError",
    "make_algorithm",
    "AgreementError",
    "Communicator",
    "CommunicationError",
    "LocalCluster",
    "MPICommunicator",
    "PeerAborted",
    "TorchCommunicator",
    "consensus_distance",
    "run_peers",
    "run",
    "RunResult",
]
