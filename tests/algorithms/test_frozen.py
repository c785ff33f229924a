"""Frozen parameters (an `nn.Parameter` with requires_grad=False) are left out of every registered
algorithm, as the optimizer and DDP leave them out (`algorithms/frozen.py`): a run with a frozen
layer is, bit for bit and byte for byte, the run without it, and the frozen layer does not move."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.errors import AgreementError
from tests.algorithms.test_contract import SPECS, acts_on, peer_tensors


def frozen_layer(seed: int = 5) -> torch.nn.Parameter:
    """A frozen matrix, equal on every peer (one seed, as `build_model` draws every peer's)."""
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(6, 5, generator=g, dtype=torch.float64), False)


def run(comm, spec, with_frozen, steps=4):
    """`steps` steps of `spec` on this peer's trainable tensors, with a frozen layer among them or
    not: (the trainable tensors or gradients after, bytes_per_step summed, bytes the transport
    counted, whether the frozen layer is bit for bit what it was)."""
    trainable = [torch.nn.Parameter(t) for t in peer_tensors(comm)]
    frozen = frozen_layer()
    before = frozen.detach().clone()
    params = [trainable[0], frozen, *trainable[1:]] if with_frozen else trainable
    algorithm = make_algorithm(spec, params, comm)
    gradients = acts_on(spec) == "gradients"
    comm.stats.reset()
    counted = 0
    for step in range(steps):
        if gradients:
            g = torch.Generator().manual_seed(7919 * step + comm.rank)
            for p in trainable:
                p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        counted += algorithm.bytes_per_step()
        algorithm.step()
    values = [(p.grad if gradients else p).detach().clone() for p in trainable]
    return values, counted, comm.stats.bytes_sent, torch.equal(frozen, before)


@pytest.mark.parametrize("spec", SPECS)
def test_a_frozen_layer_is_left_out_bit_for_bit_and_byte_for_byte(spec):
    topology = topologies.ring(4)
    with_frozen = LocalCluster(topology).run(run, spec, True)
    without = LocalCluster(topology).run(run, spec, False)
    for (values, counted, sent, unchanged), (alone, counted_alone, sent_alone, _) in zip(
        with_frozen, without
    ):
        assert unchanged
        assert counted == counted_alone == sent == sent_alone > 0
        assert all(torch.equal(a, b) for a, b in zip(values, alone))


@pytest.mark.parametrize("spec", SPECS)
def test_a_model_with_every_parameter_frozen_is_refused(spec):
    def peer(comm):
        make_algorithm(spec, [frozen_layer(), frozen_layer(6)], comm)

    with pytest.raises(ValueError, match=r"all 2 parameters are frozen|none of the 2 parameters"):
        LocalCluster(topologies.ring(3)).run(peer)


def test_frozen_layers_that_differ_between_peers_are_refused():
    """Left out of the gossip, they would never agree: refused on every rank at construction."""

    def peer(comm):
        make_algorithm("powergossip", [torch.randn(4, 3), frozen_layer(comm.rank)], comm)

    with pytest.raises(AgreementError, match="frozen parameters' values differs across ranks"):
        LocalCluster(topologies.ring(3)).run(peer)


def test_a_layer_unfrozen_after_the_algorithm_was_built_is_refused_at_the_step():
    def peer(comm):
        frozen = frozen_layer()
        algorithm = make_algorithm("exact", [torch.randn(4, 3), frozen], comm)
        algorithm.step()
        frozen.requires_grad_(True)
        algorithm.step()

    with pytest.raises(ValueError, match=r"param\[1\] was frozen when the algorithm was built"):
        LocalCluster(topologies.ring(3)).run(peer)
