"""One file per algorithm, each written once for every transport."""

from .base import GossipAlgorithm, NonFiniteError
from .exact import ExactGossip
from .registry import REGISTRY, algorithm_kwargs, describe_algorithms, make_algorithm, register
from .registry import parse_bool, parse_optional_float

register("exact", ExactGossip, {"gamma": ("gamma", parse_optional_float)},
         "uncompressed gossip, x += gamma * sum_j W_ij (x_j - x)")

__all__ = [
    "GossipAlgorithm", "NonFiniteError", "ExactGossip", "REGISTRY", "algorithm_kwargs",
    "describe_algorithms", "make_algorithm", "register",
]
