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
With ``dp_secret: run_dir`` the resumed run draws the same noise for the same steps, so a step
it takes again sends what was sent before only where its gradient is computed bit for bit the
same, which nothing guarantees (another device, thread count or torch build, CUDA's
non-deterministic kernels): a neighbour holding g1 + z and g2 + z subtracts them and reads
g1 - g2 free of noise. So each peer also appends, after its record, the digest of what each step
releases (`release_digest` of the noisy gradients, with its noise label and its key's
fingerprint) to `digests_path`, ``RUN_DIR/checkpoints/rank-K-dp-digests.txt`` (mode 0600; a line
torn by a kill is never read; pruned at each checkpoint to the steps since the oldest checkpoint
kept). A run resumed under ``run_dir`` checks each step it takes again before anything of it is
sent: the same digest, nothing is added (it sent those bytes before); another one, or none (the
step is recorded as released, its digest is not), and the peer says so on its rank, composes
every step the record holds from there on (`count_earlier`, as ``dp_secret: os`` does on resume),
draws a new key from OS entropy (`Randomness.rekey`; its checkpoints keep it from then on) and
sends that step as pure noise: its Poisson mask is the first attempt's, and two releases of one
mask are not two independent subsampled steps; the steps after it get new masks and new noise.
Public noise (``dp_public_randomness``) neither writes nor reads a record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from gossip_powersgd.training.checkpoint import KEEP, checkpoint_dir
from gossip_powersgd.training.rundir import ATTEMPTS_NAME
from gossip_powersgd.utils import atomic_write, remove_leftover_temporaries

__all__ = ["ReleaseRecord", "count_earlier", "digests_path", "record_path", "release_digest"]

History = List[Tuple[float, float, int]]


def record_path(run_dir, rank: int) -> Path:
    """Peer `rank`'s record of its releases: ``RUN_DIR/checkpoints/rank-K-dp-releases.json``."""
    return checkpoint_dir(run_dir) / f"rank-{int(rank)}-dp-releases.json"


def digests_path(run_dir, rank: int) -> Path:
    """Peer `rank`'s digests of its releases since its checkpoints: beside its record."""
    return checkpoint_dir(run_dir) / f"rank-{int(rank)}-dp-digests.txt"


def release_digest(tensors) -> str:
    """What a step releases, in 32 hex digits: SHA-256 of its noisy gradients' bytes, in order."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().reshape(-1).contiguous()
        digest.update(flat.view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


_DIGEST_LINE = re.compile(r"(\d+) ([0-9a-f]{16}) ([0-9a-f]{32})")


def _steps(history: History) -> int:
    return sum(int(n) for _, _, n in history)


class ReleaseRecord:
    """Peer `rank`'s record and digests in `run_dir` (module docstring); written by that peer
    only."""

    def __init__(self, run_dir, rank: int):
        self.run_dir, self.rank = Path(run_dir), int(rank)
        self.path = record_path(run_dir, rank)
        self._swept = False  # an earlier process's temporary record files removed
        self.digests = digests_path(run_dir, rank)
        self._held: Optional[int] = None  # the steps the record holds, once read
        self._expected: Dict[Tuple[int, str], str] = {}  # (label, key) -> digest, on resume
        self._checkpoints: List[int] = []  # noise labels of this process's checkpoints
        self._matched = False  # this step sends again what was sent before
        self._pending = ""  # the digest of this step's release

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

    def resume(self, dp) -> None:
        """After the checkpoint is loaded: ``os``: the steps released after it are counted;
        ``run_dir``: what the record holds, and the digests of what was sent, to check."""
        if dp.randomness.kind == "os":
            count_earlier(dp, self.read() or [], self.rank, "after the checkpoint resumed from")
        self._held = _steps(self.read() or [])
        self._checkpoints = [dp.own_steps]
        self._expected = {}
        if dp.randomness.kind != "run_dir" or not self.digests.is_file():
            return
        for line in self.digests.read_text(errors="replace").split("\n"):
            match = _DIGEST_LINE.fullmatch(line)
            if match:  # a line a kill tore is not one
                label, key, digest = int(match[1]), match[2], match[3]
                self._expected.setdefault((label, key), digest)

    def watch(self, dp) -> None:
        """Under ``run_dir``, check every release of `dp` (`DPSGD.release_check`)."""
        if dp.randomness.kind == "run_dir":
            dp.release_check = lambda released: self._check(dp, released)

    def _check(self, dp, released) -> bool:
        """True: `released` may be sent (a new step, or one sent before, bit for bit); False:
        it may not (the peer switched to a new key: `dp` calls again with pure noise)."""
        self._pending = release_digest(released)
        if self._held is None:
            self._held = _steps(self.read() or [])
        if dp.steps >= self._held:  # a step the record does not hold
            return True
        label, key = dp.own_steps, dp.randomness.fingerprint()
        recorded = self._expected.get((label, key))
        if recorded == self._pending:
            self._matched = True
            return True
        why = "has no digest" if recorded is None else "differs from what was sent before"
        extra = count_earlier(dp, self.read() or [], self.rank, "", say=False)
        dp.randomness.rekey()
        print(
            f"dp (rank {self.rank}): step {label}, taken again after the resume, {why} (its "
            "gradient is not computed bit for bit as before: another device, thread count or "
            "torch build?); it is sent as pure noise under a new key, and the "
            f"{extra} private steps released from it on before are counted in its epsilon",
            file=sys.stderr,
            flush=True,
        )
        return False

    def released(self, dp) -> None:
        """After a step's noise, before anything of it is sent: the record, the digest."""
        if self._matched:  # sent before, recorded before
            self._matched = False
            return
        if self._held is None:
            self._held = _steps(self.read() or [])
        if dp.steps > self._held:
            self.write(dp.accountant.history)
            self._held = dp.steps
        if dp.release_check is not None:
            label, key = dp.own_steps - 1, dp.randomness.fingerprint()
            self._append(f"\n{label} {key} {self._pending}")

    def _append(self, line: str) -> None:
        try:
            fd = os.open(self.digests, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(
                f"rank {self.rank}: cannot write the DP release digests {self.digests}: "
                f"{exc.strerror or exc}; nothing of this step was sent (free space, then --resume)"
            ) from None

    def checkpoint(self, dp) -> None:
        """A checkpoint at `dp`'s noise label: keep the digests since the oldest one kept."""
        label = dp.own_steps
        if not self._checkpoints or self._checkpoints[-1] != label:
            self._checkpoints.append(label)
        if len(self._checkpoints) < KEEP or not self.digests.is_file():
            return
        oldest = self._checkpoints[-KEEP]
        kept = [
            line
            for line in self.digests.read_text(errors="replace").split("\n")
            if (match := _DIGEST_LINE.fullmatch(line)) and int(match[1]) >= oldest
        ]
        atomic_write(self.digests, "".join("\n" + line for line in kept), mode=0o600, sync=False)
        remove_leftover_temporaries(self.digests.parent, re.escape(self.digests.name))


def count_earlier(dp, released: History, rank: int, where: str, say: bool = True) -> int:
    """Compose the private steps of `released` beyond `dp`'s history (the accountant's history
    becomes `released`; `dp.earlier_releases` grows by their number) and say so on this rank
    (unless `say` is False). `where`: when they were released, for the note. Returns their number
    (0: nothing to add)."""
    extra = _steps(released) - dp.steps
    if extra <= 0:
        return 0
    dp.accountant.history = list(released)
    dp.earlier_releases += extra
    if not say:
        return extra
    print(
        f"dp (rank {rank}): {extra} private steps released {where} are counted in its epsilon "
        "(their noise was secret and is drawn anew)",
        file=sys.stderr,
        flush=True,
    )
    return extra
