"""What a communicator offers (`Comm`, the protocol every `comm` argument of the package satisfies)
and what it counts (`CommStats`). The one implementation of it is `comm.base.Communicator`, which
re-exports both names."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Protocol, Tuple, runtime_checkable

if TYPE_CHECKING:
    from topologies import AnyTopology
    from torch import Tensor


@runtime_checkable
class Comm(Protocol):
    """What a communicator offers the algorithms, hooks and the trainer: every `comm` argument in
    the package is one. The transports (`LocalCommunicator`, `MPICommunicator`,
    `TorchCommunicator`) implement it by subclassing `Communicator`, which writes the shared part
    once; a wrapper (the view recorder) satisfies it by delegation. `tests/comm/test_base.py`
    checks each against this list, names and parameters."""

    rank: int  #: this peer
    size: int  #: number of peers
    topology: AnyTopology  #: the `Topology` (or schedule) this peer gossips on
    neighbors: Tuple[int, ...]  #: every peer this one ever talks to (a schedule's union graph)
    timeout: float  #: seconds a peer waits for a neighbour or a collective
    stats: "CommStats"  #: the traffic this peer sent (training and metric)

    @property
    def is_static(self) -> bool: ...

    @property
    def is_directed(self) -> bool: ...

    def topology_at(self, step: int) -> Any: ...

    def neighbors_at(self, step: int) -> Tuple[int, ...]: ...

    def out_neighbors_at(self, step: int) -> Tuple[int, ...]: ...

    def in_neighbors_at(self, step: int) -> Tuple[int, ...]: ...

    def exchange(
        self, send: Dict[int, "Tensor"], recv: Dict[int, "Tensor"], step: int | None = None
    ) -> None: ...

    def exchange_directed(
        self, send: Dict[int, "Tensor"], recv: Dict[int, "Tensor"], step: int
    ) -> None: ...

    def allreduce_(self, tensor: "Tensor", op: str = "mean", metric: bool = False) -> "Tensor": ...

    def allgather_bytes(self, data: bytes) -> List[bytes]: ...

    def barrier(self) -> None: ...

    def check_agreement(self, what: str, value: str) -> None: ...


@dataclasses.dataclass
class CommStats:
    """Traffic sent by one peer. `bytes_sent`/`messages_sent` are training traffic only.

    `rounds` and `critical_bytes` describe the training traffic's critical path for a network
    model in which a peer talks to all its neighbours in parallel: every `exchange` is one round
    whose cost is its largest message; a ring all-reduce is 2(n-1) rounds of 1/n of the tensor.
    Projected communication time = rounds x latency + critical_bytes / bandwidth.
    """

    bytes_sent: int = 0
    messages_sent: int = 0
    metric_bytes_sent: int = 0
    metric_messages_sent: int = 0
    rounds: int = 0
    critical_bytes: int = 0
    #: State handed to a peer that joins a run (`comm.membership`): neither training nor metric.
    transfer_bytes_sent: int = 0
    transfer_messages_sent: int = 0

    def projected_seconds(self, latency: float, bandwidth_bytes_per_second: float) -> float:
        """Communication time of the training traffic under the model above."""
        return self.rounds * latency + self.critical_bytes / bandwidth_bytes_per_second

    def as_dict(self) -> Dict[str, int]:
        return dataclasses.asdict(self)

    def reset(self) -> None:
        self.bytes_sent = self.messages_sent = 0
        self.metric_bytes_sent = self.metric_messages_sent = 0
        self.rounds = self.critical_bytes = 0
        self.transfer_bytes_sent = self.transfer_messages_sent = 0
