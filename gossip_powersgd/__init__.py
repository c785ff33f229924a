"""gossip_powersgd: decentralized training with low-rank compressed gossip (PowerGossip).

Peers sit on a graph (see the `topologies` package) and talk only to their neighbours, through an
MPI transport (`MPICommunicator`, one peer per rank), a torch.distributed one (`TorchCommunicator`,
gloo or NCCL, one peer per process) or an in-process one (`LocalCluster`, one
thread per peer). Algorithms are written once for both.

The names below are imported on first use (PEP 562), so that ``import gossip_powersgd`` (and the
`gossip-train` program, which prints its first line before torch is imported) costs no import of
torch until something that needs it is touched: ``from gossip_powersgd import PowerGossip`` works
as before.
"""

from .faults import early as _early  # noqa: F401 - first: standard library only, before torch
from typing import TYPE_CHECKING

from .training.features import declare as _declare_feature
from .utils import lazy_exports
from .version import __version__  # noqa: F401

#: Each public name -> the module it lives in (imported when the name is first read).
_HOMES = {
    "ExactGossip": "algorithms",
    "PowerGossip": "algorithms",
    "PushSum": "algorithms",
    "ChocoGossip": "algorithms",
    "DeepSqueeze": "algorithms",
    "AllReduce": "algorithms",
    "PowerSGDAllReduce": "algorithms",
    "GossipAlgorithm": "algorithms",
    "NonFiniteError": "errors",
    "make_algorithm": "algorithms",
    "AgreementError": "errors",
    "Communicator": "comm",
    "CommunicationError": "errors",
    "LocalCluster": "comm",
    "MPICommunicator": "comm",
    "PeerAborted": "errors",
    "TorchCommunicator": "comm",
    "consensus_distance": "metrics",
    "run_peers": "launch",
    "run": "runner",
    "RunResult": "runner",
}

if TYPE_CHECKING:  # what a type checker and an editor see: the same names, imported eagerly
    from .algorithms import (  # noqa: F401
        AllReduce,
        ChocoGossip,
        DeepSqueeze,
        ExactGossip,
        GossipAlgorithm,
        PowerGossip,
        PowerSGDAllReduce,
        PushSum,
        make_algorithm,
    )
    from .comm import Communicator, LocalCluster, MPICommunicator, TorchCommunicator  # noqa: F401
    from .errors import (  # noqa: F401
        AgreementError,
        CommunicationError,
        NonFiniteError,
        PeerAborted,
    )
    from .launch import run_peers  # noqa: F401
    from .metrics import consensus_distance  # noqa: F401
    from .runner import RunResult, run  # noqa: F401


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


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

__all__ = list(_HOMES)
