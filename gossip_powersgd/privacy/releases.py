"""What a peer has released under DP, kept on disk so that a run started again still counts it.

A private step leaves its peer with the messages of that step. A run killed after its last
checkpoint and resumed takes the steps since that checkpoint again; with ``dp_secret: os`` its
key is new, so it privatizes them again with fresh noise and sends them again: the neighbours
hold two independent noisy releases of those steps, and both must be in the peer's epsilon. The
same goes for the steps of an attempt that ``resume: auto`` sets aside (it ended before its first
checkpoint; the next attempt starts at step 0 with a new key whatever ``dp_secret``, the run
directory's key having gone with the attempt's files).

So each peer keeps `record_path`, ``RUN_DIR/checkpoints/rank-K-dp-releases.json`` (its own, like
its checkpoints: the history holds its sampling rate): the accountant history of every private
step it has released in the run directory over all its attempts, rewritten (atomically, mode
0600) after each step's noise is added and before anything of that step is sent. A run that
resumes a checkpoint with ``dp_secret: os``, and an attempt that starts after attempts set aside
(``dp_secret: os`` or ``run_dir``; the record moved with their files), compose the steps the
record holds beyond their own history (`count_earlier`) and say so on the peer's rank; those steps
are in its epsilon and its ``steps``, not in its noise's step labels (`DPSGD.earlier_releases`).
Nothing is added for ``dp_secret: run_dir`` on resume (the resumed run draws the same noise for
the same steps and sends what was sent before, bit for bit), and public noise
(``dp_public_randomness``) neither writes nor reads a record.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from gossip_powersgd.training.checkpoint import checkpoint_dir
from gossip_powersgd.training.rundir import ATTEMPTS_NAME
from gossip_powersgd.utils import atomic_write, remove_leftover_temporaries

__all__ = ["ReleaseRecord", "count_earlier", "record_path"]

History = List[Tuple[float, float, int]]


def record_path(run_dir, rank: int) -> Path:
    """Peer `rank`'s record of its releases: ``RUN_DIR/checkpoints/rank-K-dp-releases.json``."""
    return checkpoint_dir(run_dir) / f"rank-{int(rank)}-dp-releases.json"


def _steps(history: History) -> int:
    return sum(int(n) for _, _, n in history)


class ReleaseRecord:
    """Peer `rank`'s record in `run_dir` (module docstring); written by that peer only."""

    def __init__(self, run_dir, rank: int):
        self.run_dir, self.rank = Path(run_dir), int(rank)
        self.path = record_path(run_dir, rank)
        self._swept = False  # an earlier process's temporary record files removed

    def write(self, history) -> None:
        """Record `history` (the accountant's, this step's release included): whole or not at
        all when the process is killed (no fsync: the process dies, not the machine). A process
        killed while writing leaves a temporary file (`.rank-K-dp-releases.json.XXXXXXXX.tmp`,
        never read); the first write of the next one removes them."""
        data = {"history": [[float(s), float(q), int(n)] for s, q, n in history]}
        try:
            atomic_write(self.path, json.dumps(data) + "\n", mode=0o600, sync=False)
        except OSError as exc:
            raise OSError(
                f"rank {self.rank}: cannot write the DP release record {self.path}: "
                f"{exc.strerror or exc}; nothing of this step was sent (free space, then --resume)"
            ) from None
        if not self._swept:
            remove_leftover_temporaries(self.path.parent, re.escape(self.path.name))
            self._swept = True

    def read(self, path: Optional[Path] = None) -> Optional[History]:
        """The history a record holds (this peer's, or `path`), None where there is no record."""
        path = self.path if path is None else path
        if not path.is_file():
            return None
        try:
            return [
                (float(s), float(q), int(n)) for s, q, n in json.loads(path.read_text())["history"]
            ]
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(
                f"the DP release record {path} is damaged: it counts the private steps this peer "
                "has released; restore it, or start a new run"
            ) from None

    def earlier(self) -> History:
        """For an attempt that does not resume a checkpoint: the releases of this peer's attempts
        set aside in the run directory (``resume: auto``), the record of the newest that holds
        one (each attempt's record starts with the one before, so the newest holds them all);
        [] where there is none."""
        attempts = self.run_dir / ATTEMPTS_NAME
        numbers = sorted(
            (int(p.name) for p in attempts.glob("*") if p.name.isdigit()), reverse=True
        )
        for number in numbers:
            held = self.read(record_path(attempts / str(number), self.rank))
            if held is not None:
                return held
        return []


def count_earlier(dp, released: History, rank: int, where: str) -> int:
    """Compose the private steps of `released` beyond `dp`'s history (the accountant's history
    becomes `released`; `dp.earlier_releases` grows by their number) and say so on this rank.
    `where`: when they were released, for the note. Returns their number (0: nothing to add)."""
    extra = _steps(released) - dp.steps
    if extra <= 0:
        return 0
    dp.accountant.history = list(released)
    dp.earlier_releases += extra
    print(
        f"dp (rank {rank}): {extra} private steps released {where} are counted in its epsilon "
        "(their noise was secret and is drawn anew)",
        file=sys.stderr,
        flush=True,
    )
    return extra
