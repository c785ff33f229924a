"""The contract every registered algorithm keeps (the invariants of the PowerGossip reference page,
section 7, that hold for any gossip algorithm), checked over the algorithm registry: a new
`register(MyAlgorithm)` is covered without a line here.

- the average over peers of every parameter is unchanged by a step (algorithms that act on the
  parameters; float64, 60 steps);
- identical models are a fixed point: all-ones models on a ring do not change, no NaN (random ones
  on other graphs move by rounding only: test_powergossip.py);
- `state_dict` / `load_state_dict` resume a run bit for bit;
- the in-process, MPI and torch.distributed transports give the same models, the same algorithm
  state and the same byte counts (equal to `bytes_per_step` summed over the steps), bit for bit
  with one torch thread per peer (one mpiexec and one torchrun launch run every case).

Each algorithm runs with its spec's defaults (and a γ where it takes a tuned one, which has no
default), or with the spellings below that reach its other code paths (keyed compressors, a
PowerSGD past its warm-up, PowerGossip without warm start). PowerGossip's own, richer variants of
these checks (schedules, ranks, iterations, batching) are in test_powergossip.py.
"""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, consensus_distance
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.algorithms.registry import REGISTRY, algorithm_class
import shared_launches
from tests.comm.test_torch import assert_bit_equal

#: Spellings that reach an algorithm's other code paths; an algorithm not named here runs with
#: `default_spec`.
SPELLINGS = {
    "powergossip": ["powergossip:rank=2,iters=2", "powergossip:rank=2,warm=false"],
    "choco": [
        "choco:compressor=[topk:0.05],gamma=0.2",
        "choco:compressor=sign,gamma=0.2",
        "choco:compressor=[randomk:0.1],gamma=0.05",
        "choco:compressor=[qsgd:2],gamma=0.2",
        "choco:compressor=[randomk:0.25],gamma=0.3,seed=5",
        "choco:compressor=[qsgd:4],gamma=0.2",
    ],
    "deepsqueeze": [
        "deepsqueeze:compressor=[randomk:0.25],gamma=0.3,seed=5",
        "deepsqueeze:compressor=sign,gamma=0.2",
    ],
    "powersgd": ["powersgd", "powersgd:rank=2,start_iter=1,warm=false"],
}


def default_spec(name: str) -> str:
    """The algorithm with every option at its default, and γ = 0.5 where γ is tuned (no default):
    stable for exact gossip on the graphs here (ring:4, torus:2x3)."""
    return f"{name}:gamma=0.5" if algorithm_class(name).gamma_source == "tuned" else name


def contract_specs() -> list:
    return [spec for name in REGISTRY for spec in SPELLINGS.get(name, [default_spec(name)])]


SPECS = contract_specs()


def acts_on(spec: str) -> str:
    return algorithm_class(spec.split(":")[0]).acts_on


PARAMETER_SPECS = [s for s in SPECS if acts_on(s) == "parameters"]


def peer_tensors(comm, dtype=torch.float64):
    """A matrix, a conv-like 4-D tensor and a vector per peer, seeded by rank."""
    g = torch.Generator().manual_seed(1000 + comm.rank)
    return [
        torch.randn(12, 9, generator=g, dtype=dtype),
        torch.randn(4, 3, 2, 2, generator=g, dtype=dtype),
        torch.randn(7, generator=g, dtype=dtype),
    ]


class Run:
    """One algorithm on this peer's tensors; an algorithm that acts on gradients gets new ones,
    seeded by rank and step, before each step (its tensors are then the gradients)."""

    def __init__(self, spec, comm, tensors):
        self.comm, self.tensors = comm, tensors
        self.gradients = acts_on(spec) == "gradients"
        if self.gradients:
            self.params = [torch.zeros_like(t, requires_grad=True) for t in tensors]
            self.algorithm = make_algorithm(spec, self.params, comm)
        else:
            self.algorithm = make_algorithm(spec, tensors, comm)
        self.steps = 0

    def step(self):
        if self.gradients:
            g = torch.Generator().manual_seed(7919 * self.steps + self.comm.rank)
            for p, t in zip(self.params, self.tensors):
                p.grad = torch.randn(t.shape, generator=g, dtype=t.dtype)
        self.algorithm.step()
        self.steps += 1
        if self.gradients:
            for p, t in zip(self.params, self.tensors):
                t.copy_(p.grad)

    def state(self):
        return clone(self.algorithm.state_dict())


def clone(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clone(v) for v in value]
    return value


# ---- the average is preserved ------------------------------------------------------------------
@pytest.mark.parametrize("spec", PARAMETER_SPECS)
def test_the_average_is_preserved(spec):
    """Σ_i x_i never moves: float64, 60 steps on torus:2x3, relative drift of the sum <= 1e-12
    (each step adds rounding of order n·2^-53 ≈ 7e-16 relative to the sum; 60 steps stay well
    under 1e-12). The models do move towards each other (the check is not vacuous): their
    consensus distance falls."""
    topology = topologies.torus(2, 3)
    before = LocalCluster(topology).run(peer_tensors)
    initial = LocalCluster(topology).run(lambda c: consensus_distance(peer_tensors(c), c))[0]

    def peer(comm):
        run = Run(spec, comm, peer_tensors(comm))
        for _ in range(60):
            run.step()
        return run.tensors, consensus_distance(run.tensors, comm)

    after = LocalCluster(topology).run(peer)
    for k in range(3):
        total_before = torch.stack([p[k] for p in before]).sum(0)
        total_after = torch.stack([r[0][k] for r in after]).sum(0)
        assert (total_after - total_before).norm() <= 1e-12 * total_before.norm()
    assert after[0][1] < initial


# ---- identical models are a fixed point -----------------------------------------------------------
#: Not with the keyed random compressors: random-k and QSGD make the peers' public copies differ
#: (per-sender keys), so Choco moves identical models apart (its average stays: the check above).
FIXED_POINT_SPECS = [s for s in PARAMETER_SPECS if "randomk" not in s and "qsgd" not in s]


@pytest.mark.parametrize("spec", FIXED_POINT_SPECS)
def test_identical_models_are_a_fixed_point_without_nan(spec):
    def peer(comm):
        x = [torch.ones(8, 5), torch.ones(5)]
        run = Run(spec, comm, x)
        for _ in range(4):
            run.step()
        return x

    for x in LocalCluster(topologies.ring(4)).run(peer):
        assert torch.equal(x[0], torch.ones(8, 5)) and torch.equal(x[1], torch.ones(5))


# ---- a run resumes from its state bit for bit -------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_state_dict_resumes_bit_exactly(spec):
    def peer(comm):
        run = Run(spec, comm, peer_tensors(comm))
        for _ in range(3):
            run.step()
        saved_x, state = [t.clone() for t in run.tensors], run.state()
        for _ in range(3):
            run.step()
        resumed = Run(spec, comm, saved_x)
        resumed.algorithm.load_state_dict(state)
        resumed.steps = run.steps - 3
        for _ in range(3):
            resumed.step()
        return run.tensors, resumed.tensors

    for straight, resumed in LocalCluster(topologies.ring(4)).run(peer):
        assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


# ---- every transport gives the same bits ----------------------------------------------------------
def every_algorithm(comm, steps="4"):
    """Every spec's run on this peer, float32 (launched with the other ring:4 comparisons, once
    per transport: tests/support/shared_launches.py)."""
    out = {}
    for spec in SPECS:
        comm.stats.reset()
        run = Run(spec, comm, peer_tensors(comm, torch.float32))
        expected = 0
        for _ in range(int(steps)):
            expected += run.algorithm.bytes_per_step()
            run.step()
        out[spec] = {
            "x": run.tensors,
            "state": run.state(),
            "bytes": comm.stats.bytes_sent,
            "messages": comm.stats.messages_sent,
            "expected_bytes": expected,
        }
    return out


TRANSPORTS = [
    pytest.param("mpi", marks=pytest.mark.mpi),
    pytest.param("torch", marks=pytest.mark.torchrun),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("spec", SPECS)
def test_every_transport_gives_the_same_bits(spec, transport, tmp_path_factory):
    """The same models, algorithm state and byte counts as in-process, bit for bit; the bytes are
    the algorithm's own `bytes_per_step` summed; an all-reduce leaves every rank the same."""
    remote = [r["contract"][spec] for r in shared_launches.ring4(transport, tmp_path_factory)]
    local = [r["contract"][spec] for r in shared_launches.ring4_local()]
    for rank, (a, b) in enumerate(zip(remote, local)):
        assert_bit_equal(a, b, f"{transport} vs local, {spec}, rank {rank}")
        assert a["bytes"] == a["expected_bytes"]
    if acts_on(spec) == "gradients":
        for a in remote:
            assert all(torch.equal(u, v) for u, v in zip(a["x"], remote[0]["x"]))
