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


def _load_with_assign(model):
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)


def _new_bias(model):
    model[1].bias = torch.nn.Parameter(model[1].bias.detach().clone())


@pytest.mark.parametrize(
    "spec", ["powergossip:rank=1", "exact", "allreduce", "choco:compressor=sign,gamma=0.1"]
)
@pytest.mark.parametrize(
    "replace, name",
    [(_load_with_assign, "0.weight (Linear.weight)"), (_new_bias, "1.bias (Linear.bias)")],
    ids=["load_state_dict-assign", "new-parameter"],
)
def test_a_parameter_replaced_in_its_module_after_building_is_refused(spec, replace, name):
    """The algorithm holds the tensors it was built on; a module given new ones (load_state_dict
    with assign=True) trained them while the algorithm gossiped the old ones, silently: the model
    never mixed. The next step now names the parameter and the fix, on every peer."""
    from gossip_powersgd.algorithms import make_algorithm

    with torch.random.fork_rng():  # layers drawn here, not by peers at once from the global RNG
        models = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)) for _ in "ab"]

    def peer(comm):
        model = models[comm.rank]
        gossip = make_algorithm(spec, model.named_parameters(), comm)
        gossip.step()
        replace(model)
        try:
            gossip.step()
        except ValueError as error:
            return str(error)

    errors = LocalCluster(topologies.ring(2), timeout=30).run(peer)
    assert len(set(errors)) == 1, errors
    assert errors[0].endswith(
        f": the model's parameter {name} was replaced after the algorithm was built "
        "(load_state_dict(..., assign=True)?), so it would gossip the old one: build the "
        "algorithm after loading, or load without assign=True"
    )


def test_a_model_loaded_in_place_after_building_is_gossiped_as_before():
    """load_state_dict without assign copies into the same tensors: no refusal, and the loaded
    values are what the step mixes (ring:2, W = 1/2 off the diagonal, exact gossip with gamma 1:
    both end at the mean 0.5, exact in binary)."""
    with torch.random.fork_rng():
        models = [torch.nn.Linear(3, 2) for _ in range(2)]

    def peer(comm):
        model = models[comm.rank]
        gossip = ExactGossip(model.parameters(), comm, gamma=1.0)
        state = {k: torch.full_like(v, float(comm.rank)) for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        gossip.step()
        return [p.detach().clone() for p in model.parameters()]

    for params in LocalCluster(topologies.ring(2), timeout=30).run(peer):
        assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in params)


def test_an_algorithm_collected_during_a_parameter_registration_breaks_nothing():
    """The watch's hook is torch's global parameter-registration hook. It was registered per
    algorithm and removed when the algorithm was collected: a garbage collection inside a
    parameter's registration (any allocation can start one) removed a hook from the dict torch was
    looping over, and the registration failed with "OrderedDict mutated during iteration" (seen in
    a suite run, in a module construction unrelated to the algorithm). Forced here: algorithms kept
    alive by a reference cycle only, collected by a hook that runs gc during a registration while
    later hooks are still to come. Registration still works, and the live algorithms still notice
    their own replaced parameter."""
    import gc

    from torch.nn.modules.module import register_module_parameter_registration_hook

    with torch.random.fork_rng():  # layers drawn here, not by peers at once from the global RNG
        models = [torch.nn.Linear(3, 2) for _ in range(4)]
        layer = torch.nn.Linear(4, 4)

    def doomed(comm):
        algorithm = ExactGossip(models[2 + comm.rank].parameters(), comm)
        algorithm.cycle = algorithm  # freed by the collector only

    def kept(comm):
        return ExactGossip(models[comm.rank].parameters(), comm)

    def collect(*_):  # a hook's return value other than None replaces the parameter
        gc.collect()

    LocalCluster(topologies.ring(2), timeout=30).run(doomed)
    handle = register_module_parameter_registration_hook(collect)
    try:
        algorithms = LocalCluster(topologies.ring(2), timeout=30).run(kept)
        layer.weight = torch.nn.Parameter(torch.zeros(4, 4))  # unrelated: nothing to note
        models[0].weight = torch.nn.Parameter(torch.zeros(2, 3))
    finally:
        handle.remove()
    assert torch.equal(layer.weight, torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"parameter param\[0\] \(Linear.weight\) was replaced"):
        algorithms[0]._replaced.check("ExactGossip")
    algorithms[1]._replaced.check("ExactGossip")  # peer 1's model kept its tensors


@pytest.mark.parametrize(
    "spec", ["powergossip:rank=1", "exact", "pushsum", "choco:compressor=sign,gamma=0.1"]
)
def test_a_tensor_passed_twice_is_refused(spec):
    """A tied weight listed once per module that uses it (named_parameters(remove_duplicate=False))
    was gossiped as two tensors: twice its bytes, and PowerGossip stepped it as two matrices, so the
    model ended elsewhere than with the tensor passed once. It is refused in one line, naming both."""
    from gossip_powersgd.algorithms import make_algorithm

    def peer(comm):
        g = torch.Generator().manual_seed(comm.rank)
        encoder = torch.nn.Embedding(12, 9, _weight=torch.randn(12, 9, generator=g))
        decoder = torch.nn.Linear(9, 12, bias=False)
        decoder.weight = encoder.weight  # tied
        model = torch.nn.Sequential(encoder, decoder)
        try:
            make_algorithm(spec, model.named_parameters(remove_duplicate=False), comm)
        except ValueError as error:
            return str(error)

    errors = LocalCluster(topologies.ring(2), timeout=30).run(peer)
    assert (
        errors
        == [
            "1.weight is the same tensor as 0.weight (a tied weight?): pass each tensor once, e.g. "
            "model.parameters(), which lists a shared one once"
        ]
        * 2
    )
