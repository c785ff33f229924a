"""The CLI spelling of algorithms: parsing, nesting, and errors that list what is valid."""

import inspect

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.algorithms import algorithm_kwargs
from gossip_powersgd.algorithms.registry import split_spec


def test_split_spec_handles_nested_specs():
    assert split_spec("choco:compressor=topk:0.01,gamma=0.4") == (
        "choco",
        {"compressor": "topk:0.01", "gamma": "0.4"},
    )
    assert split_spec("choco:compressor=[randomk:0.1,seed=3],gamma=0.4") == (
        "choco",
        {"compressor": "randomk:0.1,seed=3", "gamma": "0.4"},
    )
    assert split_spec("exact") == ("exact", {})


def test_specs_map_to_keyword_arguments():
    _, kwargs = algorithm_kwargs("powergossip:rank=2,iters=3,warm=false,gamma=auto,seed=4")
    assert kwargs == {"rank": 2, "num_iterations": 3, "warm_start": False, "gamma": None, "seed": 4}
    _, kwargs = algorithm_kwargs("choco:compressor=[lowrank:2,iterations=2],gamma=0.4")
    assert repr(kwargs["compressor"]) == "lowrank:2,iterations=2" and kwargs["gamma"] == 0.4


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "gossipx",
            "algorithm spec 'gossipx': unknown name 'gossipx'; valid: allreduce, choco, "
            "deepsqueeze, exact, powergossip, powersgd",
        ),
        (
            "powergossip:rnk=2",
            "algorithm spec 'powergossip:rnk=2': unknown option 'rnk'; valid: batched, gamma, iters, "
            "min_compression_rate, rank, seed, warm",
        ),
        (
            "powergossip:rank=two",
            "algorithm spec 'powergossip:rank=two': bad value 'two' for rank",
        ),
        ("powergossip:rank", "option 'rank' is not key=value"),
        ("choco:compressor=[topk:0.1,gamma=0.4", "unbalanced square brackets"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        algorithm_kwargs(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "exact",
        "powergossip:rank=2",
        "choco:compressor=sign,gamma=0.1",
        "deepsqueeze:compressor=topk:0.5,gamma=0.1",
        "allreduce",
    ],
)
def test_make_algorithm_builds_a_working_algorithm(spec):
    def peer(comm):
        x = [torch.full((6, 5), float(comm.rank)), torch.full((5,), float(comm.rank))]
        algorithm = make_algorithm(spec, x, comm)
        algorithm.step()
        return sum(t.sum().item() for t in x)

    totals = LocalCluster(topologies.ring(4)).run(peer)
    assert sum(totals) == pytest.approx(35 * (0 + 1 + 2 + 3))


# ---- algorithms describe themselves -----------------------------------------------------------------


def test_every_registered_algorithm_is_complete_and_exported():
    import gossip_powersgd
    from gossip_powersgd.algorithms import ALGORITHMS, REGISTRY
    from gossip_powersgd.algorithms.registry import constructor_defaults, declaration_problems

    assert [REGISTRY[cls.name] for cls in ALGORITHMS] == ALGORITHMS
    for cls in ALGORITHMS:
        assert declaration_problems(cls) == []
        defaults = constructor_defaults(cls)  # every option's default is its constructor's
        assert all(
            defaults[o.argument] is not inspect.Parameter.empty for o in cls.options.values()
        )
        assert (
            getattr(gossip_powersgd, cls.__name__) is cls
            and cls.__name__ in gossip_powersgd.__all__
        )
    assert constructor_defaults(REGISTRY["powergossip"])["num_iterations"] == 1


def test_a_class_missing_a_declaration_is_refused_naming_what_is_missing():
    from gossip_powersgd.algorithms import ExactGossip, GossipAlgorithm, Option, register

    class Bare(GossipAlgorithm):
        name = "bare"

    with pytest.raises(
        TypeError,
        match=r"algorithm class Bare cannot be registered: it does not "
        r"declare its own `summary`.*`options`.*`gamma_source`.*"
        r"`directed`.*`label`.*`layout`",
    ):
        register(Bare)

    class Renamed(ExactGossip):  # inherits everything but must name and describe itself
        options = {"step": Option("step_size", float)}

    with pytest.raises(
        TypeError,
        match=r"its own `name`.*its own `summary`.*option 'step': its "
        r"argument 'step_size' is not a keyword of the constructor",
    ):
        register(Renamed)

    class Taken(ExactGossip):
        name = "powergossip"
        summary = "a second powergossip"

    with pytest.raises(TypeError, match="algorithm name 'powergossip' is taken by PowerGossip"):
        register(Taken)


def test_direction_and_config_checks_come_from_the_classes():
    from gossip_powersgd.algorithms import check_config, check_directed

    directed = topologies.parse("directed_exponential:4")
    for spec in ("pushsum", "allreduce", "powersgd"):
        check_directed(spec, directed, "directed_exponential:4")
    for spec in ("exact", "powergossip", "choco:compressor=sign,gamma=0.1"):
        with pytest.raises(
            ValueError,
            match=f"'{spec.split(':')[0]}' needs symmetric edges, but "
            "topology 'directed_exponential:4' is directed",
        ):
            check_directed(spec, directed, "directed_exponential:4")
    ring = topologies.ring(8)
    check_config("exact:gamma=1.0", ring)
    check_config("powergossip:gamma=5", ring)  # a warning when built, not a config error
    with pytest.raises(ValueError, match="gamma"):
        check_config("exact:gamma=5", ring)  # outside exact gossip's stable range: diverges


def test_the_earlier_register_form_still_registers_a_class_observers_cannot_decode():
    from gossip_powersgd.algorithms import REGISTRY, ExactGossip, algorithm_label, register
    from gossip_powersgd.privacy.views import ObservedView

    cls = register(
        "plain",
        ExactGossip,
        {"gamma": ("gamma", float)},
        "exact, by another name",
        gamma="topology",
        label=lambda options: "plain gossip",
    )
    try:
        assert issubclass(cls, ExactGossip) and REGISTRY["plain"] is cls
        assert algorithm_label("plain:gamma=0.5") == "plain gossip"
        # the layout is inherited from ExactGossip: its messages decode as the model
        assert cls.layout is ExactGossip.layout
    finally:
        REGISTRY.pop("plain")

    class NoLayout(ExactGossip):
        layout = None

    cls = register("opaque", NoLayout, {}, "no layout declared")
    try:
        meta = {
            "algorithm": "opaque",
            "shapes": [[2]],
            "dtype": "float32",
            "neighbors": [1],
            "observer": 0,
        }
        view = ObservedView(meta, [])
        with pytest.raises(ValueError, match="algorithm 'opaque' declares no message layout"):
            view.decode({"tensor": torch.zeros(2), "sender": 1, "step": 0, "exchange": 0})
    finally:
        REGISTRY.pop("opaque")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("powergossip:rank=0", "rank must be an integer >= 1, got 0"),
        ("powergossip:iters=0", "num_iterations must be an integer >= 1"),
        ("powergossip:min_compression_rate=-1", "min_compression_rate must be >= 0"),
    ],
)
def test_powergossip_checks_its_options_from_the_spec_alone(spec, message):
    from gossip_powersgd.algorithms import check_config

    with pytest.raises(ValueError, match=message):
        check_config(spec, topologies.ring(4))
    check_config("powergossip:rank=2,iters=3,min_compression_rate=0", topologies.ring(4))


@pytest.mark.parametrize("name", ["powergossip", "powersgd"])
@pytest.mark.parametrize("rate", ["inf", "1e400"])
def test_an_infinite_compression_rate_is_refused_as_nan_is(name, rate):
    # (rows + cols) * r * inf < rows * cols is False for every matrix: the run gossiped every
    # tensor exactly while labelled "PowerGossip r1" (or "PowerSGD all-reduce r1")
    from gossip_powersgd.algorithms import check_config

    with pytest.raises(ValueError) as raised:
        check_config(f"{name}:min_compression_rate={rate}", topologies.ring(4))
    assert "min_compression_rate must be >= 0 and finite, got inf (0 compresses" in str(
        raised.value
    )
    assert "\n" not in str(raised.value)


def _float_option_specs():
    """A spec per float option of every registered algorithm and of every compressor (inside
    choco), with that option set to nan and any other required option valid."""
    from gossip_powersgd.algorithms.registry import REGISTRY, with_option
    from gossip_powersgd.compressors.spec import _SPECS
    from gossip_powersgd.specs import parse_optional_float

    specs = []
    for name, cls in sorted(REGISTRY.items()):
        base = f"{name}:compressor=sign,gamma=0.1" if cls.gamma_source == "tuned" else name
        for key, option in cls.options.items():
            if option.parse in (float, parse_optional_float):
                specs.append(pytest.param(with_option(base, key, "nan"), key, id=f"{name}:{key}"))
    for name, (_, params) in sorted(_SPECS.items()):
        for key, kind in params:
            if kind is float:
                spec = f"choco:compressor=[{name}:{key}=nan],gamma=0.1"
                specs.append(pytest.param(spec, key, id=f"compressor {name}:{key}"))
    return specs


@pytest.mark.parametrize("spec, option", _float_option_specs())
def test_nan_is_refused_for_every_float_option_naming_it(spec, option):
    # a comparison with nan is False: a check written `x < 0` lets it through (PowerGossip's
    # min_compression_rate=nan compressed nothing while labelled "PowerGossip r1")
    from gossip_powersgd.algorithms import check_config

    with pytest.raises(ValueError, match=rf"{option}.*nan"):
        check_config(spec, topologies.ring(4))
