"""Inputs an algorithm must refuse or flag: a consensus step outside the topology's stable range,
repeated spec options and seeds the generators cannot take."""

import dataclasses
import re
import warnings

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.algorithms import (
    ChocoGossip,
    DeepSqueeze,
    PowerGossip,
    algorithm_kwargs,
    check_config,
)
from gossip_powersgd.specs import SEED_MAX
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train

from tests.conftest import ROOT

TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def unchecked(spec, *sets):
    """tiny.yaml with `algorithm=spec` set after validation (as a TrainConfig built in code may
    hold it): what train() itself must refuse."""
    return dataclasses.replace(load_config(TINY, ["quiet=true", *sets], deep=False), algorithm=spec)


def refused_line(spec, message):
    """The one line naming the key and the spec that `message` (a regex from ^) follows."""
    return "^" + re.escape(f"bad value for 'algorithm': algorithm spec {spec!r}: ") + message[1:]


def tensors(comm):
    g = torch.Generator().manual_seed(comm.rank)
    return [
        torch.randn(6, 5, generator=g, dtype=torch.float64),
        torch.randn(4, generator=g, dtype=torch.float64),
    ]


# ---- 4a. gamma outside the stable range ------------------------------------------------------------
def test_ring4_stable_range_is_what_the_tests_assume():
    assert topologies.ring(4).gamma_stable_max == pytest.approx(1.5)


COMPRESSED = {
    "PowerGossip": lambda x, comm, gamma: PowerGossip(x, comm, gamma=gamma),
    "ChocoGossip": lambda x, comm, gamma: ChocoGossip(x, comm, "sign", gamma=gamma),
    "DeepSqueeze": lambda x, comm, gamma: DeepSqueeze(x, comm, "sign", gamma=gamma),
}


@pytest.mark.parametrize("who", sorted(COMPRESSED))
def test_compressed_gossip_warns_once_per_construction_about_an_unstable_gamma(who):
    def peer(comm, gamma):
        COMPRESSED[who](tensors(comm), comm, gamma)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LocalCluster(topologies.ring(4)).run(peer, 3.0)
        unstable = [str(w.message) for w in caught]
        LocalCluster(topologies.ring(4)).run(peer, 0.5)
        stable = [str(w.message) for w in caught][len(unstable) :]
    assert len(unstable) == 4, unstable  # one per peer's construction
    assert set(unstable) == {
        f"{who}: gamma=3 is outside the stable range (0, 1.5) of {unstable[0].split(' of ', 1)[1]}"
    }
    assert "\n" not in unstable[0]
    assert stable == []


@pytest.mark.parametrize(
    "topology, gamma, message",
    [
        ("ring:4", 3, r"^gamma=3 is outside the stable range \(0, 1\.5\)"),
        ("matchings:8", 5, r"^gamma=5 is outside the stable range \(0, 2\) of matchings:8 "),
    ],
)
def test_training_with_an_unstable_exact_gamma_fails_with_the_same_line_on_every_rank(
    topology, gamma, message
):
    """The trainer checks exact gossip's γ against the communicator's topology (on a schedule: the
    range of every one of its graphs) before any collective, so every rank raises the line itself
    (none is merely released as an aborted peer); a config of a sized topology is refused as it
    loads already."""
    spec = f"exact:gamma={gamma}"
    message = refused_line(spec, message)
    with pytest.raises(ValueError, match=message):
        load_config(TINY, [f"algorithm={spec}", f"topology={topology}"], deep=False)
    config = unchecked(spec, f"topology={topology}")
    messages = {}

    def peer(comm):
        try:
            train(comm, config)
        except ValueError as exc:
            messages[comm.rank] = str(exc)
            raise

    schedule = topologies.parse(topology)
    with pytest.raises(ValueError, match=message):
        LocalCluster(schedule, timeout=60).run(peer)
    assert sorted(messages) == list(range(schedule.size))
    assert len(set(messages.values())) == 1 and "\n" not in messages[0]


# ---- gamma on a schedule: the stable range of every one of its graphs ------------------------------
SCHEDULES = [
    "one_peer_exponential:8",
    "matchings:8",
    "edge_sampling:ring:8:0.5",
    "cyclic:ring:8,star:8",
]


def test_schedule_stable_ranges_are_the_intersection_of_their_graphs_ranges():
    # each step of one_peer_exponential and matchings is a perfect matching with weights 1/2: I - W
    # has eigenvalues 0 and 1, so 2 / mu_max = 2 exactly
    assert topologies.parse("one_peer_exponential:8").gamma_stable_max == 2.0
    assert topologies.parse("matchings:8").gamma_stable_max == 2.0
    # cyclic: the smaller member's range; ring:8 (Metropolis 1/3): mu_max = 1 - (1/3 - 2/3) = 4/3
    cyclic = topologies.parse("cyclic:ring:8,star:8")
    assert cyclic.gamma_stable_max == pytest.approx(1.5, rel=1e-12)
    assert cyclic.gamma_stable_max == min(m.gamma_stable_max for m in cyclic.members)
    # edge sampling on a ring: the Gershgorin bound (1 + D) / D with D = 2; it must hold at every
    # step drawn, and the full ring (every edge active) attains it
    sampled = topologies.parse("edge_sampling:ring:8:0.5")
    assert sampled.gamma_stable_max == 1.5
    assert min(sampled.at(t).gamma_stable_max for t in range(300)) >= 1.5
    assert topologies.ring(8).gamma_stable_max == pytest.approx(1.5, rel=1e-12)
    matchings = topologies.parse("matchings:8")
    assert all(matchings.at(t).gamma_stable_max == pytest.approx(2.0, rel=1e-12) for t in range(50))


@pytest.mark.parametrize("who", sorted(COMPRESSED))
def test_compressed_gossip_warns_about_an_unstable_gamma_on_a_schedule(who):
    def peer(comm, gamma):
        COMPRESSED[who](tensors(comm), comm, gamma)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LocalCluster(topologies.parse("one_peer_exponential:8")).run(peer, 5.0)
        unstable = [str(w.message) for w in caught]
        LocalCluster(topologies.parse("one_peer_exponential:8")).run(peer, 1.0)
        stable = [str(w.message) for w in caught][len(unstable) :]
    assert len(unstable) == 8 and set(unstable) == {
        f"{who}: gamma=5 is outside the stable range (0, 2) of one_peer_exponential:8 (the "
        "smallest of 2 / largest eigenvalue of I - W(t) over one period, 3 graphs): gossip would "
        "diverge; on a schedule the default gamma is 1 (plain mixing with each step's W)"
    }
    assert stable == []


# ---- 10. repeated options and seeds ---------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, key",
    [
        ("powergossip:rank=1,rank=2", "rank"),
        ("choco:compressor=sign,gamma=0.1,gamma=0.2", "gamma"),
        ("choco:compressor=[topk:0.1,ratio=0.2],gamma=0.1", "ratio"),
    ],
)
def test_a_repeated_option_is_an_error_naming_the_key(spec, key):
    with pytest.raises(ValueError, match=f"'{key}'.* given twice") as info:
        algorithm_kwargs(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        "powergossip:seed=99999999999999999999999",
        "powersgd:seed=-1",
        "choco:compressor=sign,gamma=0.1,seed=9223372036854775808",
        "deepsqueeze:compressor=[randomk:0.1,seed=99999999999999999999999],gamma=0.1",
    ],
)
def test_a_seed_the_generators_cannot_take_is_blamed_on_the_seed(spec):
    with pytest.raises(ValueError, match=rf"seed must be an integer in \[0, {SEED_MAX}\], got "):
        algorithm_kwargs(spec)


def test_the_largest_seed_works():
    def peer(comm):
        algorithm = make_algorithm(f"powergossip:seed={SEED_MAX}", tensors(comm), comm)
        algorithm.step()
        return algorithm.seed

    assert LocalCluster(topologies.ring(3)).run(peer) == [SEED_MAX] * 3


@pytest.mark.parametrize(
    "make",
    [
        lambda x, comm: PowerGossip(x, comm, seed=2**64),
        lambda x, comm: ChocoGossip(x, comm, "sign", gamma=0.1, seed=-3),
    ],
)
def test_constructors_check_the_seed_too(make):
    def peer(comm):
        make(tensors(comm), comm)

    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, "):
        LocalCluster(topologies.ring(3)).run(peer)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("choco:compressor=sign", r"^ChocoGossip needs a tuned consensus step gamma"),
        ("deepsqueeze:gamma=0.1", r"^DeepSqueeze needs a compressor, e\.g\. compressor='sign'"),
    ],
)
def test_compressed_gossip_without_its_required_options_fails_on_every_rank_at_set_up(
    spec, message
):
    """The class's config-time check (`check_config`) runs before any collective, so every rank
    raises the constructor's line itself, after the key and the spec; from the spec alone (nothing
    built) the constructor's line as it is; and a config of a sized topology as it loads."""
    with pytest.raises(ValueError, match=message):  # from the spec alone, nothing built
        check_config(spec, topologies.parse("ring:4"))
    message = refused_line(spec, message)
    with pytest.raises(ValueError, match=message):
        load_config(TINY, [f"algorithm={spec}"], deep=False)
    config = unchecked(spec)
    messages = {}

    def peer(comm):
        try:
            train(comm, config)
        except ValueError as exc:
            messages[comm.rank] = str(exc)
            raise

    with pytest.raises(ValueError, match=message):
        LocalCluster(topologies.parse(config.topology), timeout=60).run(peer)
    assert sorted(messages) == [0, 1, 2, 3] and len(set(messages.values())) == 1
