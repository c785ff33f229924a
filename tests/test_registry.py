"""The CLI spelling of algorithms: parsing, nesting, and errors that list what is valid."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.algorithms import algorithm_kwargs
from gossip_powersgd.algorithms.registry import split_spec


def test_split_spec_handles_nested_specs():
    assert split_spec("choco:compressor=topk:0.01,gamma=0.4") == (
        "choco", {"compressor": "topk:0.01", "gamma": "0.4"})
    assert split_spec("choco:compressor=[randomk:0.1,seed=3],gamma=0.4") == (
        "choco", {"compressor": "randomk:0.1,seed=3", "gamma": "0.4"})
    assert split_spec("exact") == ("exact", {})


def test_specs_map_to_keyword_arguments():
    _, kwargs = algorithm_kwargs("powergossip:rank=2,iters=3,warm=false,gamma=auto,seed=4")
    assert kwargs == {"rank": 2, "num_iterations": 3, "warm_start": False, "gamma": None, "seed": 4}
    _, kwargs = algorithm_kwargs("choco:compressor=[lowrank:2,iterations=2],gamma=0.4")
    assert repr(kwargs["compressor"]) == "lowrank:2,iterations=2" and kwargs["gamma"] == 0.4


@pytest.mark.parametrize("spec, message", [
    ("gossipx", "unknown algorithm 'gossipx'; valid: allreduce, choco, deepsqueeze, exact, powergossip, powersgd"),
    ("powergossip:rnk=2", "algorithm 'powergossip' has no option 'rnk'; valid: batched, gamma, iters, "
                          "min_compression_rate, rank, seed, warm"),
    ("powergossip:rank=two", "algorithm 'powergossip': bad value 'two' for rank"),
    ("powergossip:rank", "option 'rank' is not key=value"),
    ("choco:compressor=[topk:0.1,gamma=0.4", "unbalanced square brackets"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        algorithm_kwargs(spec)


@pytest.mark.parametrize("spec", ["exact", "powergossip:rank=2", "choco:compressor=sign,gamma=0.1",
                                  "deepsqueeze:compressor=topk:0.5,gamma=0.1", "allreduce"])
def test_make_algorithm_builds_a_working_algorithm(spec):
    def peer(comm):
        x = [torch.full((6, 5), float(comm.rank)), torch.full((5,), float(comm.rank))]
        algorithm = make_algorithm(spec, x, comm)
        algorithm.step()
        return sum(t.sum().item() for t in x)

    totals = LocalCluster(topologies.ring(4)).run(peer)
    assert sum(totals) == pytest.approx(35 * (0 + 1 + 2 + 3))
