"""One file per algorithm, each written once for every transport."""

from .allreduce import AllReduce, PowerSGDAllReduce
from .base import GossipAlgorithm, NonFiniteError
from ..compressors import parse_compressor
from .choco import ChocoGossip
from .deepsqueeze import DeepSqueeze
from .exact import ExactGossip
from .powergossip import PowerGossip
from .registry import REGISTRY, algorithm_kwargs, describe_algorithms, make_algorithm, register
from .registry import parse_bool, parse_optional_float

register("exact", ExactGossip, {"gamma": ("gamma", parse_optional_float)},
         "uncompressed gossip, x += gamma * sum_j W_ij (x_j - x)")
register("powergossip", PowerGossip, {
    "rank": ("rank", int), "iters": ("num_iterations", int), "gamma": ("gamma", parse_optional_float),
    "warm": ("warm_start", parse_bool), "seed": ("seed", int),
    "min_compression_rate": ("min_compression_rate", float), "batched": ("batch_neighbors", parse_bool),
}, "low-rank compressed gossip (PowerGossip), gamma defaults to the topology's")
register("choco", ChocoGossip, {
    "compressor": ("compressor", parse_compressor), "gamma": ("gamma", parse_optional_float),
    "seed": ("seed", int),
}, "Choco-Gossip: compressed gossip of x - x_hat (gamma must be tuned), e.g. compressor=topk:0.01")
register("deepsqueeze", DeepSqueeze, {
    "compressor": ("compressor", parse_compressor), "gamma": ("gamma", parse_optional_float),
    "seed": ("seed", int),
}, "DeepSqueeze: error-compensated compressed gossip (gamma must be tuned), e.g. compressor=sign")
register("allreduce", AllReduce, {}, "exact all-reduce average of the parameters (centralized)")
register("powersgd", PowerSGDAllReduce, {
    "rank": ("rank", int), "warm": ("warm_start", parse_bool), "start_iter": ("start_iter", int),
    "min_compression_rate": ("min_compression_rate", float), "seed": ("seed", int),
}, "centralized PowerSGD all-reduce of the gradients with error feedback (DDP hook)")

__all__ = [
    "GossipAlgorithm", "NonFiniteError", "ExactGossip", "PowerGossip", "ChocoGossip", "DeepSqueeze",
    "AllReduce", "PowerSGDAllReduce", "REGISTRY", "algorithm_kwargs",
    "describe_algorithms", "make_algorithm", "register",
]
