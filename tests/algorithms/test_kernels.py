"""The compiled tensor work of a gossip step (`algorithms.kernels`): TorchScript runs it, with the
bits of the Python bodies, and anything TorchScript cannot compile runs as Python."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import ExactGossip, LocalCluster, PowerGossip
from gossip_powersgd.algorithms import kernels, powergossip
from gossip_powersgd.algorithms.base import all_finite
from gossip_powersgd.utils import gil_free

KERNELS = ("multiply_into_messages", "form_factors_and_update", "mix_exact")


def test_the_kernels_are_compiled_by_torchscript():
    for name in KERNELS:
        assert isinstance(getattr(kernels, name).implementation(), torch.jit.ScriptFunction), name


@pytest.fixture
def python_kernels(monkeypatch):
    """Every kernel's Python body in place of its compiled form, wherever it is called from."""

    def use_python():
        for name in KERNELS:
            python = getattr(kernels, name).python
            monkeypatch.setattr(kernels, name, python)
            if hasattr(powergossip, name):
                monkeypatch.setattr(powergossip, name, python)

    return use_python


def _gossip(comm, rank, batched, dtype):
    g = torch.Generator().manual_seed(comm.rank)
    shapes = [(16, 3, 3, 3), (32, 16, 3, 3), (32, 16, 3, 3), (10, 64), (64,), (10,)]
    x = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    y = [torch.randn(40, generator=g, dtype=dtype)]
    power = PowerGossip(x, comm, rank=rank, batch_neighbors=batched)
    exact = ExactGossip(y, comm)
    for _ in range(5):
        power.step()
        exact.step()
    return [t.clone() for t in x + y]


@pytest.mark.parametrize("spec", ["ring:6", "star:5"])
def test_compiled_and_python_kernels_give_the_same_bits(spec, python_kernels):
    topology = topologies.parse(spec)
    cases = [(1, True, torch.float32), (1, False, torch.float64), (2, True, torch.float32)]
    compiled = [LocalCluster(topology).run(_gossip, *case) for case in cases]
    python_kernels()
    python = [LocalCluster(topology).run(_gossip, *case) for case in cases]
    for case, a, b in zip(cases, compiled, python):
        for peer_a, peer_b in zip(a, b):
            assert all(torch.equal(s, t) for s, t in zip(peer_a, peer_b)), case


def test_a_function_torchscript_cannot_compile_runs_as_python():
    @gil_free
    def count(*args):  # TorchScript takes no *args
        return len(args)

    assert count(1, 2, 3) == 3
    assert count.implementation() is count.python


def test_multiply_into_messages_normalises_multiplies_and_sums_what_leaves():
    factor, norm = torch.tensor([[[3.0, 4.0]]]), torch.empty(1, 1, 1)  # norm 5
    norms, epsilon = norm.view(-1), torch.tensor(1.0)
    right, product, message = torch.ones(1, 2, 3), torch.empty(1, 1, 3), torch.zeros(2, 3)
    total = kernels.multiply_into_messages(
        [factor],
        [norm],
        [norms],
        epsilon,
        [factor],
        [right],
        [product],
        [message[:1]],
        [product[0]],
        message,
    )
    assert torch.equal(factor, torch.tensor([[[0.5, 4 / 6]]]))  # divided by norm + epsilon
    assert torch.allclose(message[0], torch.full((3,), 0.5 + 4 / 6)) and total == float(
        message.sum()
    )
    nothing = ([], [], [], epsilon, [], [], [], [], [])
    half = torch.full((4,), 60000.0, dtype=torch.float16)  # overflows a float16 sum
    assert kernels.multiply_into_messages(*nothing, half) == 240000.0
    # a sum that is not finite sends the check element by element; a finite one proves finiteness
    assert all_finite(torch.ones(3), total=float("inf"))
    assert not all_finite(torch.tensor([1.0, float("nan")]), total=float("nan"))
