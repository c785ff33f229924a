"""One file per algorithm, each written once for every transport."""

from .allreduce import AllReduce, PowerSGDAllReduce
from .base import GossipAlgorithm, NonFiniteError
from ..compressors import parse_compressor
from .choco import ChocoGossip
from .deepsqueeze import DeepSqueeze
from .exact import ExactGossip
from .powergossip import PowerGossip
from .pushsum import PushSum
from .registry import (
    REGISTRY,
    algorithm_kwargs,
    algorithm_label,
    describe_algorithms,
    gamma_kind,
    make_algorithm,
    register,
    spec_gamma,
    with_option,
)
from ..specs import FALSE_WORDS, parse_bool, parse_optional_float, parse_seed


def _is_false(text: str) -> bool:
    return text.lower() in FALSE_WORDS


def _powergossip_label(options) -> str:
    text = f"PowerGossip r{options.get('rank', '1')}"
    if options.get("iters", "1") != "1":
        text += f" K{options['iters']}"
    if _is_false(options.get("warm", "true")):
        text += " restart"
    return text


def _compressed_label(pretty: str):
    def label(options) -> str:
        compressor = options.get("compressor", "?")
        return f"{pretty} {compressor.replace(':', ' ')}"
    return label


def _powersgd_label(options) -> str:
    return f"PowerSGD all-reduce r{options.get('rank', '1')}"


register("exact", ExactGossip, {"gamma": ("gamma", parse_optional_float)},
         "uncompressed gossip, x += gamma * sum_j W_ij (x_j - x)",
         gamma="topology", label=lambda options: "exact gossip")
register("powergossip", PowerGossip, {
    "rank": ("rank", int), "iters": ("num_iterations", int), "gamma": ("gamma", parse_optional_float),
    "warm": ("warm_start", parse_bool), "seed": ("seed", parse_seed),
    "min_compression_rate": ("min_compression_rate", float), "batched": ("batch_neighbors", parse_bool),
}, "low-rank compressed gossip (PowerGossip), gamma defaults to the topology's",
   gamma="topology", label=_powergossip_label)
register("choco", ChocoGossip, {
    "compressor": ("compressor", parse_compressor), "gamma": ("gamma", parse_optional_float),
    "seed": ("seed", parse_seed),
}, "Choco-Gossip: compressed gossip of x - x_hat (gamma must be tuned), e.g. compressor=topk:0.01",
   gamma="tuned", label=_compressed_label("Choco"))
register("deepsqueeze", DeepSqueeze, {
    "compressor": ("compressor", parse_compressor), "gamma": ("gamma", parse_optional_float),
    "seed": ("seed", parse_seed),
}, "DeepSqueeze: error-compensated compressed gossip (gamma must be tuned), e.g. compressor=sign",
   gamma="tuned", label=_compressed_label("DeepSqueeze"))
register("pushsum", PushSum, {},
         "push-sum gossip for directed graphs (column-stochastic P, de-biased model x/w)",
         label=lambda options: "push-sum")
register("allreduce", AllReduce, {}, "exact all-reduce average of the parameters (centralized)",
         label=lambda options: "all-reduce")
register("powersgd", PowerSGDAllReduce, {
    "rank": ("rank", int), "warm": ("warm_start", parse_bool), "start_iter": ("start_iter", int),
    "min_compression_rate": ("min_compression_rate", float), "seed": ("seed", parse_seed),
}, "centralized PowerSGD all-reduce of the gradients with error feedback (DDP hook)",
   label=_powersgd_label)

__all__ = [
    "GossipAlgorithm", "NonFiniteError", "ExactGossip", "PowerGossip", "PushSum", "ChocoGossip", "DeepSqueeze",
    "AllReduce", "PowerSGDAllReduce", "REGISTRY", "algorithm_kwargs", "algorithm_label",
    "describe_algorithms", "gamma_kind", "make_algorithm", "register", "spec_gamma", "with_option",
]
