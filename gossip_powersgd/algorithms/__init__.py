"""One file per algorithm, each written once for every transport, each describing itself (spec
name, options, γ source, direction, label, message layout, config checks); `registry.ALGORITHMS`
lists them."""

from .allreduce import AllReduce, PowerSGDAllReduce
from .base import GossipAlgorithm, NonFiniteError, Option
from .choco import ChocoGossip
from .deepsqueeze import DeepSqueeze
from .exact import ExactGossip
from .layout import MessageLayout, Part
from .powergossip import PowerGossip
from .pushsum import PushSum
from .registry import (
    ALGORITHMS,
    REGISTRY,
    AlgorithmSpec,
    algorithm_class,
    algorithm_kwargs,
    algorithm_label,
    check_config,
    check_directed,
    describe_algorithms,
    gamma_kind,
    make_algorithm,
    parse_algorithm,
    register,
    spec_gamma,
    with_option,
)

__all__ = [
    "GossipAlgorithm",
    "NonFiniteError",
    "Option",
    "MessageLayout",
    "Part",
    "ExactGossip",
    "PowerGossip",
    "PushSum",
    "ChocoGossip",
    "DeepSqueeze",
    "AllReduce",
    "PowerSGDAllReduce",
    "ALGORITHMS",
    "REGISTRY",
    "AlgorithmSpec",
    "algorithm_class",
    "algorithm_kwargs",
    "algorithm_label",
    "check_config",
    "check_directed",
    "describe_algorithms",
    "gamma_kind",
    "make_algorithm",
    "parse_algorithm",
    "register",
    "spec_gamma",
    "with_option",
]
