"""Resuming a run from its checkpoints: which epoch (`agree_resume_epoch`, collective: the newest
every rank holds), and whether a checkpoint belongs to this run (`check_header`: world size,
topology, config (a spec spelled otherwise but meaning the same is the same: an algorithm, a
topology, a dataset, a model, a partition, a feature's spec-valued key) and the sha256 of each
data file this peer read; `load_for_resume`: the file's epoch is the one its name says). Every
refusal is a one-line `ValueError` naming the file and the way out. The file format is
`checkpoint`'s.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np

from ..utils import format_ranks
from .checkpoint import available_epochs, checkpoint_dir, checkpoint_path, read_checkpoint

if TYPE_CHECKING:
    from topologies import Topology

    from ..comm.base import Comm

__all__ = [
    "agree_resume_epoch",
    "auto_resumes",
    "check_header",
    "describe_config_diff",
    "latest_common_epoch",
    "load_for_resume",
]

#: How a config diff shows a key one config lacks.
_ABSENT = "<absent>"
#: How many of its newest epochs each rank offers when the ranks agree on the one to resume from.
_OFFERED_EPOCHS = 8


def check_header(
    path,
    header: Dict[str, Any],
    *,
    rank: int,
    world_size: int,
    topology: Topology,
    topology_spec: str,
    config_hash: str,
    config_json: str,
    data: Optional[Dict[str, str]] = None,
) -> None:
    """Raise a ValueError naming `path` and what differs from the resuming run (`data`: the
    `data.content_digests` of this peer's data, which the header's must match)."""
    if header.get("world_size") != world_size:
        raise ValueError(
            f"checkpoint {path} was written by a run of {header.get('world_size')} peers; "
            f"this run has {world_size}"
        )
    if header.get("topology_fingerprint") != topology.fingerprint:
        raise ValueError(
            f"checkpoint {path} is for topology {header.get('topology')!r} "
            f"(another mixing matrix); this run uses {topology_spec!r}"
        )
    if header.get("rank") != rank:
        raise ValueError(f"checkpoint {path} belongs to rank {header.get('rank')}, not rank {rank}")
    if header.get("config_hash") != config_hash:
        saved_json = header.get("config", "{}")
        changed = _changed_keys(saved_json, config_json, world_size)
        if changed != []:
            raise ValueError(
                f"checkpoint {path} was written with another config: "
                f"{describe_config_diff(saved_json, config_json, changed)}"
            )
    _check_same_data(path, header.get("data") or {}, data or {})


def _spec_meanings() -> Dict[str, Callable[[str, int], Any]]:
    """{key: (spec, world size) -> what it means}: the core spec-valued keys (an algorithm, a
    topology by its mixing matrix, a dataset, a model, a partition) and each feature key that
    declares its own (`features.Key.meaning`)."""
    import topologies

    from ..algorithms.registry import parse_algorithm
    from .architectures import MODELS
    from .datasets import DATASETS
    from .features import feature_keys
    from .partition import partition_meaning

    meanings = {
        "algorithm": lambda spec, n: parse_algorithm(spec).meaning(),
        "topology": lambda spec, n: topologies.parse(spec, n=n).fingerprint,
        "dataset": lambda spec, n: DATASETS.meaning(spec),
        "model": lambda spec, n: MODELS.meaning(spec),
        "partition": lambda spec, n: partition_meaning(spec),
    }
    for name, key in feature_keys().items():
        if key.meaning is not None:
            meanings[name] = key.meaning
    return meanings


def _same(meaning, saved: Any, current: Any, world_size: int) -> bool:
    """Whether a key's two values mean the same run: equal, or two specs spelled otherwise that
    `meaning` (None: none) reads the same ("powergossip:iters=1,rank=1" and "powergossip:rank=1")."""
    if saved == current:
        return True
    if meaning is None or not (isinstance(saved, str) and isinstance(current, str)):
        return False
    try:
        return meaning(saved, world_size) == meaning(current, world_size)
    except (TypeError, ValueError):  # a spec this version does not parse
        return False


def _changed_keys(saved_json, current_json: str, world_size: int) -> Optional[List[str]]:
    """The keys whose value in the resuming run's config (`current_json`) means another run than
    in the checkpoint's (`saved_json`); None when the checkpoint's config is unreadable."""
    try:
        saved = json.loads(saved_json)
    except (TypeError, ValueError):
        return None
    current = json.loads(current_json)
    if not isinstance(saved, dict):
        return None
    meanings = _spec_meanings()
    return [
        key
        for key in sorted(set(saved) | set(current))
        if not _same(
            meanings.get(key), saved.get(key, _ABSENT), current.get(key, _ABSENT), world_size
        )
    ]


def _check_same_data(path, saved: Dict[str, str], current: Dict[str, str]) -> None:
    """The data the checkpoint was written with is the data read now (same spec, same bytes)."""
    for name, digest in sorted(_in_memory_renamed(saved, current).items()):
        now = current.get(name)
        if now != digest:
            state = "is gone" if now is None else "has changed since the checkpoint"
            raise ValueError(
                f"checkpoint {path} was written with other data: {name} {state} (sha256 "
                f"{str(digest)[:12]}... then, {str(now)[:12] + '...' if now else 'none'} now); "
                "resume with the data the run was started with, or start a new run"
            )


def _in_memory_renamed(saved: Dict[str, str], current: Dict[str, str]) -> Dict[str, str]:
    """`saved` with its in-memory data's digest under the current run's name for it: that name
    quotes the dataset spec as written, which the config check accepted as meaning the same."""
    from .datasets import IN_MEMORY_DATA

    then = [name for name in saved if name.startswith(IN_MEMORY_DATA)]
    now = [name for name in current if name.startswith(IN_MEMORY_DATA)]
    if len(then) != 1 or len(now) != 1:
        return saved
    return {now[0] if name == then[0] else name: digest for name, digest in saved.items()}


def describe_config_diff(
    saved_json: str, current_json: str, keys: Optional[List[str]] = None
) -> str:
    """ "key saved -> current" for each key that differs (of `keys` only, where given)."""
    try:
        saved = json.loads(saved_json)
    except (TypeError, ValueError):
        return "its recorded config is unreadable"
    current = json.loads(current_json)
    diffs = []
    for key in sorted(set(saved) | set(current)) if keys is None else keys:
        if saved.get(key, _ABSENT) != current.get(key, _ABSENT):
            diffs.append(f"{key} {saved.get(key, _ABSENT)!r} -> {current.get(key, _ABSENT)!r}")
    return "; ".join(diffs) if diffs else "(hash differs)"


def load_for_resume(run_dir, epoch: int, **expected) -> Dict[str, Any]:
    """Read `rank`'s checkpoint of `epoch` and check it belongs to this run (see `check_header`)."""
    path = checkpoint_path(run_dir, expected["rank"], epoch)
    loaded = read_checkpoint(path)
    check_header(path, loaded["header"], **expected)
    held = loaded["header"].get("epoch")
    if held != epoch:  # a file renamed or copied over another: its state is of another step
        raise ValueError(
            f"checkpoint {path} holds epoch {held} (step {loaded['header'].get('step')}), "
            f"not epoch {epoch} as its name says: it was renamed or copied over; restore "
            "the right file, or delete it to resume from the previous epoch"
        )
    return loaded


def latest_common_epoch(per_rank: List[List[int]]) -> Optional[int]:
    """The newest epoch every rank has a file for (None if there is none)."""
    common = set(per_rank[0]) if per_rank else set()
    for epochs in per_rank[1:]:
        common &= set(epochs)
    return max(common) if common else None


def _offered_epochs(comm: Comm, run_dir, mine: Optional[List[int]] = None):
    """This rank's newest checkpoint epochs (`mine`, else read) and every rank's (collective)."""
    if mine is None:
        mine = available_epochs(run_dir, comm.rank)
    mine = mine[-_OFFERED_EPOCHS:]
    data = np.asarray(mine + [-1] * (_OFFERED_EPOCHS - len(mine)), dtype=np.int64).tobytes()
    per_rank = [
        [int(v) for v in np.frombuffer(g, dtype=np.int64) if v >= 0]
        for g in comm.allgather_bytes(data)
    ]
    return mine, per_rank


def _refuse_another_world_size(comm: Comm, run_dir, mine: List[int]) -> None:
    """Refuse files written by a run of another number of peers (collective: every rank is here,
    as the epochs are the same everywhere; one more all-gather of each rank's header's size)."""
    sizes = [
        int(np.frombuffer(g, dtype=np.int64)[0])
        for g in comm.allgather_bytes(
            np.int64(_written_world_size(run_dir, comm.rank, mine)).tobytes()
        )
    ]
    other = sorted({n for n in sizes if n > 0 and n != comm.size})
    if other:
        raise ValueError(
            f"cannot resume {run_dir}: its checkpoints were written by a run of "
            f"{other[0]} peers; this run has {comm.size}: resume with "
            f"{other[0]} peers"
        )


def auto_resumes(comm: Comm, run_dir, mine: List[int]) -> bool:
    """`resume=AUTO`: whether an epoch has a checkpoint file on every rank (`mine`: this rank's
    epochs; collective, the same answer on every rank). Files on some ranks only are an attempt
    that ended while writing its first checkpoint, to be set aside and started again (False),
    unless they were written by a run of another number of peers (the ValueError of
    `agree_resume_epoch`)."""
    mine, per_rank = _offered_epochs(comm, run_dir, mine)
    if latest_common_epoch(per_rank) is not None:
        return True
    if any(per_rank):
        _refuse_another_world_size(comm, run_dir, mine)
    return False


def agree_resume_epoch(comm: Comm, run_dir) -> int:
    """The newest epoch every rank has a checkpoint file for (same answer on every rank).

    Collective: each rank offers the epochs of its newest files; a ValueError names the ranks that
    hold checkpoints when no epoch is common to all.
    """
    mine, per_rank = _offered_epochs(comm, run_dir)
    epoch = latest_common_epoch(per_rank)
    if epoch is None:
        holders = [k for k, e in enumerate(per_rank) if e]
        folder = checkpoint_dir(run_dir)
        if not holders:
            raise ValueError(
                f"cannot resume {run_dir}: no checkpoint in {folder} (the run ended before "
                "its first checkpoint, or checkpoint_every is 0); start it again with --resume "
                f"auto {run_dir} (from Python: run(..., resume='auto')), which sets its files "
                "aside first"
            )
        _refuse_another_world_size(comm, run_dir, mine)
        missing = [k for k, e in enumerate(per_rank) if not e]
        what = (
            f"rank(s) {format_ranks(missing)} have none"
            if missing
            else "no epoch is held by every rank"
        )
        raise ValueError(
            f"cannot resume {run_dir}: {folder} has checkpoint files for rank(s) "
            f"{format_ranks(holders)} but {what}, so some files are missing or "
            "incomplete, most likely from an interrupted write (a full disk or a job "
            "killed while writing its first checkpoint); no epoch can be resumed on every "
            "rank: restore the missing files, or start the run again"
        )
    return epoch


def _written_world_size(run_dir, rank: int, epochs: List[int]) -> int:
    """The world size the header of `rank`'s newest checkpoint names; 0 when none can be read."""
    if not epochs:
        return 0
    try:
        header = read_checkpoint(checkpoint_path(run_dir, rank, epochs[-1]))["header"]
    except ValueError:
        return 0
    size = header.get("world_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else 0
