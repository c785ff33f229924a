"""Checkpoints of a run whose membership changes: a leaving peer's away file, and resuming.

Members write their checkpoints at the end of an epoch as in any run; a peer that is away writes
none. When it leaves, it writes its state once, ``checkpoints/rank-K-away-STEP.pt`` (STEP the
step it left at; the same format and checks as a checkpoint; the newest `checkpoint.KEEP` are
kept): the data position, its hooks' state (its DP accountant) and its counters, which do not
change while it is away. K is the peer's stable id (its rank when the run started: ids never
change across a membership change).

Resuming at the end of epoch E: every peer that was a member during the last step of epoch E
loads its checkpoint of epoch E, every peer away then loads the away file of the absence that
covers that step, and the newest E for which every peer has its file is the one resumed from
(agreed by all peers, as `resume.agree_resume_epoch` does). The members then rebuild the
algorithm of the membership epoch in force (`PeerMembership.resume_at`) before its state is
loaded; a peer away at E waits for its return as it would have.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import numpy as np

from ..utils import atomic_write, remove_leftover_temporaries
from . import checkpoint as ckpt
from .resume import check_header, latest_common_epoch

if TYPE_CHECKING:
    from ..comm.base import Comm

__all__ = ["away_path", "away_steps", "save_away", "resume"]

_AWAY = re.compile(r"rank-(\d+)-away-(\d+)\.pt$")
_OFFERED = 8


def away_path(run_dir, rank: int, step: int) -> Path:
    return ckpt.checkpoint_dir(run_dir) / f"rank-{rank}-away-{step}.pt"


def away_steps(run_dir, rank: int) -> List[int]:
    folder = ckpt.checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = (_AWAY.match(entry.name) for entry in folder.iterdir())
    return sorted(int(m.group(2)) for m in found if m and int(m.group(1)) == rank)


def save_away(run_dir, header, state) -> Path:
    """Write a leaving peer's away file (module docstring); keep its newest `checkpoint.KEEP`, and
    none of the temporary away files of its own that a killed writer left (as checkpoints do)."""
    rank = header["rank"]
    path = away_path(run_dir, rank, header["step"])
    atomic_write(path, ckpt.encode_record(header, state))
    for old in away_steps(run_dir, rank)[: -ckpt.KEEP]:
        away_path(run_dir, rank, old).unlink(missing_ok=True)
    remove_leftover_temporaries(path.parent, rf"rank-{int(rank)}-away-\d+\.pt")
    return path


def _source(run_dir, rank: int, membership, epoch: int, steps_per_epoch: int) -> Optional[Path]:
    """The file `rank` resumes the end of `epoch` from, if it has it."""
    last = epoch * steps_per_epoch - 1
    if rank in membership.at(last):
        path = ckpt.checkpoint_path(run_dir, rank, epoch)
    else:
        left = next(
            a for a, b in membership.absences(rank) if a <= last and (b is None or b > last)
        )
        path = away_path(run_dir, rank, left)
    return path if path.is_file() else None


def _agree(comm: Comm, run_dir, membership, config, steps_per_epoch) -> int:
    mine = [
        e
        for e in range(1, config.epochs + 1)
        if _source(run_dir, comm.rank, membership, e, steps_per_epoch) is not None
    ][-_OFFERED:]
    data = np.asarray(mine + [-1] * (_OFFERED - len(mine)), dtype=np.int64).tobytes()
    per_peer = [
        [int(v) for v in np.frombuffer(g, dtype=np.int64) if v >= 0]
        for g in comm.allgather_bytes(data)
    ]
    epoch = latest_common_epoch(per_peer)
    if epoch is None:
        raise ValueError(
            f"cannot resume {run_dir}: no epoch for which every peer holds its checkpoint (or, "
            "for a peer away at that epoch, the away file it wrote when it left)"
        )
    return epoch


def _load(path: Path, expected) -> dict:
    loaded = ckpt.read_checkpoint(path)
    check_header(path, loaded["header"], **expected)
    return loaded


def resume(driver, comm: Comm, run_dir, run, restore):
    """Load the newest epoch every peer can resume (collective), into `run`; the `RunState`
    (`restore` is `RunState.from_checkpoint` with the run's objects bound)."""
    from .setup import collectively

    peer, config, spe = driver.peer, driver.config, run.steps_per_epoch
    epoch = _agree(comm, run_dir, peer.membership, config, spe)
    path = _source(run_dir, comm.rank, peer.membership, epoch, spe)
    loaded = collectively(comm, _load, path, run.header_args)
    peer.resume_at(epoch * spe - 1)  # members rebuild the algorithm of that membership
    driver.hooks.on_membership(peer.epoch.step, peer.epoch.live)  # (before their state loads)
    state = dict(loaded["state"])
    if not peer.live:  # its algorithm waits for its return, when it is handed a new one
        state["algorithm"] = run.algorithm.state_dict()
    resumed = restore(state)
    if not peer.live:
        resumed.step, resumed.epoch = epoch * spe, epoch
    ckpt.drop_newer(run_dir, comm.rank, epoch)  # an ended attempt's (not collective: the
    # members' comm no longer reaches the peers away at `epoch`)
    return resumed
