"""What every algorithm shares (algorithms/base.py): the finiteness guard - a NaN parameter is named
and never reaches a neighbour."""

import pytest
import torch

import topologies
from gossip_powersgd import (
    ExactGossip,
    LocalCluster,
    NonFiniteError,
    PowerGossip,
)


def watch_received(comm, log):
    """Wrap comm.exchange to record whether any received message held a NaN or an infinity."""
    real = comm.exchange

    def exchange(send, recv):
        real(send, recv)
        if any(not bool(torch.isfinite(t).all()) for t in recv.values() if t.is_floating_point()):
            log[comm.rank] = "received a non-finite value"

    comm.exchange = exchange


@pytest.mark.parametrize(
    "make",
    [lambda x, comm: PowerGossip(x, comm, rank=1), lambda x, comm: ExactGossip(x, comm)],
    ids=["powergossip", "exact"],
)
def test_a_nan_parameter_is_named_and_never_reaches_a_neighbour(make):
    log = {}

    def peer(comm):
        watch_received(comm, log)
        g = torch.Generator().manual_seed(comm.rank)
        weight, bias = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
        gossip = make([("layer.weight", weight), ("layer.bias", bias)], comm)
        for step in range(4):
            if comm.rank == 2 and step == 2:
                weight[1, 1] = float("nan")
            gossip.step()

    with pytest.raises(NonFiniteError) as info:
        LocalCluster(topologies.ring(4), timeout=30).run(peer)
    assert str(info.value).startswith(
        "rank 2: non-finite values in parameter(s) layer.weight at gossip step 2; nothing was sent"
    )
    assert log == {}  # no peer ever received a NaN
