"""`run(config) -> RunResult`: one training run, the library call behind every experiment.

    from gossip_powersgd import run
    result = run("experiments/configs/tiny.yaml")          # a YAML file, as gossip-train reads it
    result = run({"topology": "ring:4", "dataset": "synthetic_logreg", "model": "logreg",
                  "algorithm": "powergossip:rank=1", "epochs": 2, "backend": "local"})
    result.acc_avg, result.mb_sent_per_peer, result.evals, result.bytes_sent[0]

The config (a dict, a `TrainConfig` or a YAML path) is validated exactly as `gossip-train`
validates it (`validate_config`, deep: the dataset, partition and model are built once) and the
backend is checked against how this process was started (`launch.resolve_backend`). Backend
`local` runs every peer as a thread of this process and the result holds every peer's counters;
under a launcher (mpiexec for `mpi`, torchrun for `torch`) this process runs its own rank and the
per-peer fields hold that rank only. Each peer runs `training.trainer.train(comm, config,
hooks=...)`, the per-peer loop; `run` only builds the transport and gathers what came back.

This module imports torch only when `run` is called.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Union

if TYPE_CHECKING:
    from topologies import Topology

    from .comm import Communicator
    from .training.config import TrainConfig
    from .training.hooks import TrainingHooks

#: `hooks=`: rank -> that peer's hooks (each peer needs its own objects: they keep state).
MakeHooks = Callable[[int], Iterable["TrainingHooks"]]


@dataclasses.dataclass
class RunResult:
    """What one run gave back. `summary` is `summary.json`'s content (the same on every peer that
    ends the run as a member; under churn, the lowest such rank's), `history` that peer's
    evaluation and log records; the per-peer dicts are keyed by rank and hold every peer under
    backend local, this process's rank under a launcher."""

    config: "TrainConfig"
    summary: Dict[str, Any]
    history: List[Dict[str, Any]]
    #: each peer's transport counters (`CommStats.as_dict()`): training traffic, and metric
    #: traffic (evaluation all-reduces, consensus distance) apart in `metric_bytes_sent`
    stats: Dict[int, Dict[str, int]]
    #: each peer's own figures (`peers/rank-K.json`: shard size, label histogram, ...)
    peers: Dict[int, Dict[str, Any]]
    #: seconds of the whole call (set-up, data, training, summary), on this process's clock
    wall_seconds: float
    #: each peer's final model `state_dict()` (CPU copies) when `run(..., states=True)`, else None
    states: Optional[Dict[int, Dict[str, Any]]] = None

    @property
    def evals(self) -> List[Dict[str, Any]]:
        """The evaluation records, in order (epoch, step, MB sent, accuracies, consensus)."""
        return [r for r in self.history if r.get("kind") == "eval"]

    @property
    def acc_avg(self) -> Optional[float]:
        """The averaged model's final test accuracy (the peers' mean parameters)."""
        return self.summary["final_test_acc_avg_model"]

    @property
    def acc_local_mean(self) -> Optional[float]:
        return self.summary["final_test_acc_local_mean"]

    @property
    def acc_local_min(self) -> Optional[float]:
        return self.summary["final_test_acc_local_min"]

    @property
    def acc_local_max(self) -> Optional[float]:
        return self.summary["final_test_acc_local_max"]

    @property
    def consensus_distance(self) -> Optional[float]:
        """Mean over peers of ‖x_i − x̄‖² at the last evaluation."""
        return self.summary["final_consensus_distance"]

    @property
    def mb_sent_per_peer(self) -> float:
        """Training MB sent, mean over peers (metric traffic not included)."""
        return self.summary["mb_sent_per_peer"]

    @property
    def bytes_sent(self) -> Dict[int, int]:
        """Training bytes each peer sent."""
        return {rank: s["bytes_sent"] for rank, s in self.stats.items()}

    @property
    def metric_bytes_sent(self) -> Dict[int, int]:
        """Bytes each peer sent for metrics (evaluations, consensus distance), not training."""
        return {rank: s["metric_bytes_sent"] for rank, s in self.stats.items()}

    @property
    def steps(self) -> int:
        return int(self.summary["steps"])

    @property
    def train_seconds(self) -> float:
        """The training loop's wall time, slowest peer (evaluations included, set-up not)."""
        return self.summary["wall_time_s"]

    @property
    def compute_seconds(self) -> float:
        """Forward, backward and optimizer time per peer (mean over peers)."""
        return self.summary["time_compute_s"]

    @property
    def gossip_compute_seconds(self) -> float:
        """The algorithm's own arithmetic (compression) per peer (mean over peers)."""
        return self.summary["time_gossip_compute_s"]

    @property
    def run_dir(self) -> Optional[Path]:
        """The run directory (config.yaml, metrics/, summary.json), None when nothing was written."""
        out = self.summary.get("run_dir")
        return Path(out) if out is not None else None


def load(config: Union[Dict[str, Any], "TrainConfig", str, os.PathLike]) -> "TrainConfig":
    """The validated `TrainConfig` of a dict, a `TrainConfig` or a YAML path, checked as
    `gossip-train` checks it (a YAML file without `out_dir` writes to runs/<its name>, as there)."""
    from .training.config import TrainConfig, config_from_dict, load_config
    from .training.validation import validate_config

    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        loaded = load_config(path)
        if loaded.out_dir is None:
            loaded = loaded.replace(out_dir=str(Path("runs") / path.stem))
        return loaded
    if isinstance(config, dict):
        config = config_from_dict(config)
    elif not isinstance(config, TrainConfig):
        raise ValueError(
            f"run(config): give a dict, a TrainConfig or a YAML path, got {type(config).__name__}"
        )
    validate_config(config, deep=True)
    return config


def _topology(config: "TrainConfig"):
    """The config's topology, after checking that this process was started as its backend needs
    and, under a launcher, that it started as many processes as the topology has peers."""
    from .launch import resolve_backend, transport
    from .training.validation import resolve_topology

    try:
        n = resolve_topology(config).size
    except ValueError:
        n = "N"
    resolve_backend(config.backend, n=n)
    entry = transport(config.backend)
    if entry.in_process:
        return resolve_topology(config)
    world = entry.world_size()
    launcher = entry.launcher_name()
    if config.peers is not None and config.peers != world:
        raise ValueError(
            f"peers is {config.peers} but {launcher} started {world} processes: start {config.peers}"
        )
    return resolve_topology(config, world_size=world)


def _peer(comm: "Communicator", config, make_hooks: Optional[MakeHooks], states: bool, resume):
    """One peer: `train` with its hooks; its summary, counters and (if asked) final state."""
    from .training.hooks import TrainingHooks
    from .training.trainer import train

    class FinalState(TrainingHooks):
        name = "run_final_state"
        optional = True  # it only watches: a run resumes with or without `states`

        def setup(self, context) -> None:
            self.context = context

        def close(self) -> None:
            model = self.context.model  # the last one a hook left (setup runs before any step)
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    hooks = list(make_hooks(comm.rank)) if make_hooks is not None else []
    final = FinalState() if states else None
    summary = train(comm, config, hooks=hooks + ([final] if final else []), resume=resume)
    return summary, comm.stats.as_dict(), final.state if final else None


def run(
    config: Union[Dict[str, Any], "TrainConfig", str, os.PathLike],
    *,
    hooks: Optional[MakeHooks] = None,
    states: bool = False,
    resume: Union[bool, str] = False,
) -> RunResult:
    """Train `config` on every peer (backend local) or on this launched rank; see the module doc.

    Args:
        config: a dict of config keys, a `TrainConfig`, or the path of a YAML config.
        hooks: `hooks(rank)` -> that peer's `TrainingHooks` (called once per peer, in its thread
            or process); keep a reference to read them after the run.
        states: also return each peer's final model `state_dict()` (`RunResult.states`).
        resume: as `train`'s (True: continue `out_dir` from its checkpoint; "auto").

    The run uses `threads` torch intra-op threads; the caller's count is restored when it returns
    (also on an error).
    """
    import torch

    from .launch import intra_op_threads
    from .training.rundir import check_resume

    check_resume(resume)
    config = load(config)
    topology = _topology(config)
    config = config.replace(peers=topology.size)
    callers = torch.get_num_threads()  # a library call leaves the caller's setting as it was
    torch.set_num_threads(intra_op_threads(config.threads))
    try:
        return _run(config, topology, hooks, states, resume)
    finally:
        torch.set_num_threads(callers)


def _run(
    config: "TrainConfig",
    topology: "Topology",
    hooks: Optional[MakeHooks],
    states: bool,
    resume: Union[bool, str],
) -> RunResult:
    """`run` once the config is loaded and torch's intra-op threads are set: the peers' figures."""
    from .launch import run_peers, transport

    device = "cpu"
    if transport(config.backend).uses_device:
        from .training.setup import resolve_device

        device = resolve_device(config.device, 0).type  # the GPU index comes from LOCAL_RANK
    started = time.perf_counter()
    values = run_peers(
        topology,
        _peer,
        config,
        hooks,
        states,
        resume,
        backend=config.backend,
        timeout=config.comm_timeout,
        device=device,
    )
    seconds = time.perf_counter() - started
    # The summary and history are the lowest rank's that ended the run as a member: under churn a
    # peer away at the end (rank 0 too) has no final figures.
    ended = [r for r in sorted(values) if values[r][0].get("final_test_acc_avg_model") is not None]
    first = values[(ended or sorted(values))[0]][0]
    summary = {k: v for k, v in first.items() if k not in ("history", "peer", "rank")}
    return RunResult(
        config=config,
        summary=summary,
        history=list(first["history"]),
        stats={rank: value[1] for rank, value in values.items()},
        peers={rank: value[0]["peer"] for rank, value in values.items()},
        wall_seconds=seconds,
        states={rank: value[2] for rank, value in values.items()} if states else None,
    )


__all__ = ["RunResult", "run", "load"]
