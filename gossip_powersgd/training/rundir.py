"""The run directory: refusing to start over an existing run, and the lock that one run holds on
its directory for its lifetime (`take_run_lock`). `checkpoint.py` re-exports these names."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..utils import one_line

#: The run directory's lock file (see `take_run_lock`); not part of a run's results.
LOCK_NAME = ".lock"


#: `train(..., resume=AUTO)` / `--resume auto`: continue the run if it has a checkpoint, else start.
AUTO = "auto"
#: Where `set_aside_failed_attempt` moves the files of attempts that ended before a checkpoint.
ATTEMPTS_NAME = "failed-attempts"


def set_aside_failed_attempt(run_dir) -> Optional[str]:
    """Move what an attempt that ended before its first complete checkpoint left in `run_dir` (its
    config.yaml, metrics, views) into RUN_DIR/failed-attempts/K/, so that a new attempt can start
    there and nothing is lost. Returns a note saying so, or None when there was nothing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    entries = [e for e in run_dir.iterdir() if e.name not in (LOCK_NAME, ATTEMPTS_NAME)]
    if not entries:
        return None
    attempts = run_dir / ATTEMPTS_NAME
    number = 1 + max((int(p.name) for p in attempts.glob("*") if p.name.isdigit()), default=0)
    target = attempts / str(number)
    try:
        target.mkdir(parents=True)
        for entry in entries:
            entry.rename(target / entry.name)
    except OSError as exc:
        reason = exc.strerror or one_line(exc)
        raise ValueError(
            f"cannot set aside the earlier attempt in {run_dir} ({reason}); move its "
            "files away by hand or choose another out_dir"
        ) from None
    return (
        f"note: {run_dir} held an attempt that ended before its first complete checkpoint; its "
        f"files are in {target} and the run starts again"
    )


def check_resume(resume) -> None:
    """Refuse, in one line, a `resume` other than True, False or "auto" (another string, say
    "yes", was taken as True: a typo of "auto" resumed a run that has no checkpoint)."""
    if not (resume is True or resume is False or resume == AUTO):
        raise ValueError(f"resume must be True, False or {AUTO!r}, got {resume!r}")


def check_run_dir(run_dir, resume: bool) -> None:
    """Refuse to start a run over an existing, non-empty directory, or to resume a missing one.

    The run's own lock file (`LOCK_NAME`) and earlier failed attempts (`ATTEMPTS_NAME`) do not
    count as content."""
    run_dir = Path(run_dir)
    if resume:
        if not run_dir.is_dir():
            raise ValueError(f"cannot resume {run_dir}: no such run directory")
        return
    if run_dir.exists() and (
        not run_dir.is_dir()
        or any(e.name not in (LOCK_NAME, ATTEMPTS_NAME) for e in run_dir.iterdir())
    ):
        raise ValueError(
            f"run directory {run_dir} already exists; choose another out_dir "
            f"(--set out_dir=...) or continue it with --resume {run_dir} (from Python: "
            "run(..., resume=True))"
        )


@dataclasses.dataclass
class RunLock:
    """An exclusive claim on a run directory, held by one process for the run's lifetime."""

    path: Path  #: the lock file, RUN_DIR/.lock
    owner: str  #: what the lock file holds: this process's host, pid and start time
    created_dir: bool  #: the run directory was made for this run (removed again if left empty)
    note: Optional[str] = None  #: set when a stale lock of a process that has ended was replaced

    def release(self) -> None:
        """Remove the lock file if it is still ours; an empty run directory made for it goes too
        (a run that failed before writing anything leaves nothing behind)."""
        try:
            if self.path.read_text() == self.owner:
                self.path.unlink()
        except OSError:
            pass  # already gone, or the directory became unreadable: nothing left to release
        if self.created_dir:
            try:
                self.path.parent.rmdir()
            except OSError:
                pass  # not empty: the run wrote something, keep it


def _proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/PID/stat from the state on (field 3), or None where there are none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None


def _start_time(pid: int) -> Optional[int]:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat): with
    the pid, it names one process, never a later one given the same pid. None where unknown."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _process_alive(pid: int, start: Optional[int] = None) -> bool:
    """Whether the process `pid` (started at `start`, if known) still runs on this host. A zombie
    has ended (a rank whose supervisor was killed with it stays one until init reaps it, after its
    launcher has returned), and a process started at another time is another process."""
    if pid <= 0:
        return False
    fields = _proc_stat(pid)
    if fields is not None:  # /proc tells (signal 0 below would count a zombie as alive)
        if fields[0] in ("Z", "X"):
            return False
        return start is None or _start_time(pid) in (None, start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except (OverflowError, OSError):
        return False  # not a pid this system can have
    return True


def _lock_holder(path: Path) -> Optional[Dict[str, Any]]:
    """The {"host", "pid"} a lock file names, or None when it cannot be read or parsed."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
        return None
    if not isinstance(holder.get("start"), int):
        holder["start"] = None  # a lock written before start times were recorded
    return holder


def take_run_lock(run_dir, create: bool = True) -> RunLock:
    """Claim `run_dir` for this process: create RUN_DIR/.lock exclusively (O_CREAT|O_EXCL), holding
    this host, pid and start time. A lock left by a process of this host that has ended (gone, a
    zombie, or its pid now another process's) is replaced (the returned lock's `note` says so); a
    lock of a live process, or of another host, is a one-line ValueError naming its holder. `create`: make the directory if missing (a new run), else a
    missing directory is refused (resuming)."""
    run_dir = Path(run_dir)
    created = False
    if not run_dir.is_dir():
        if not create:
            raise ValueError(f"cannot resume {run_dir}: no such run directory")
        if run_dir.exists():
            raise ValueError(
                f"run directory {run_dir} already exists and is not a directory; "
                "choose another out_dir (--set out_dir=...)"
            )
        try:
            run_dir.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass  # another run made it meanwhile; the lock below decides who owns it
        except OSError as exc:
            where = "" if exc.filename in (None, str(run_dir)) else f" ({exc.filename})"
            raise ValueError(
                f"cannot create run directory {run_dir}: "
                f"{exc.strerror or one_line(exc)}{where}; choose a writable out_dir "
                "(--set out_dir=...)"
            ) from None
    path = run_dir / LOCK_NAME
    host = socket.gethostname()
    owner = json.dumps({"host": host, "pid": os.getpid(), "start": _start_time(os.getpid())}) + "\n"
    note = None
    for _ in range(2):  # a second try after replacing a stale lock
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _lock_holder(path)
            if (
                note is None
                and holder is not None
                and holder.get("host") == host
                and not _process_alive(holder["pid"], holder["start"])
            ):
                note = (
                    f"note: replaced the stale lock {path} of pid {holder['pid']} on {host} "
                    "(that process has ended)"
                )
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                continue
            who = (
                "an unknown process (the lock file is unreadable)"
                if holder is None
                else f"pid {holder['pid']} on host {holder.get('host')}"
            )
            raise ValueError(
                f"run directory {run_dir} is in use by another run ({who} holds "
                f"{path}); wait for it to end or choose another out_dir (delete the "
                "lock file only if that run is gone)"
            ) from None
        except OSError as exc:
            raise ValueError(
                f"cannot write the lock file {path}: {exc.strerror or one_line(exc)}; "
                "choose a writable out_dir (--set out_dir=...)"
            ) from None
        try:
            os.write(fd, owner.encode())
        finally:
            os.close(fd)
        return RunLock(path=path, owner=owner, created_dir=created, note=note)
    raise ValueError(
        f"run directory {run_dir}: another run claimed it while a stale lock was "
        "being replaced; choose another out_dir"
    )


def set_aside_on_rank_0(rank: int, run_dir) -> None:
    """`set_aside_failed_attempt` on rank 0 (the trainer runs it on every rank, collectively)."""
    if rank == 0:
        note = set_aside_failed_attempt(run_dir)
        if note:
            print(note, file=sys.stderr, flush=True)


def claim_on_rank_0(rank: int, run_dir, resume: bool) -> Optional[RunLock]:
    """Rank 0 locks the run directory for the run (`take_run_lock`); others hold none."""
    if rank != 0:
        return None
    lock = take_run_lock(run_dir, create=not resume)
    if lock.note:
        print(lock.note, file=sys.stderr, flush=True)
    return lock


__all__ = [
    "AUTO",
    "check_resume",
    "ATTEMPTS_NAME",
    "LOCK_NAME",
    "RunLock",
    "check_run_dir",
    "claim_on_rank_0",
    "set_aside_failed_attempt",
    "set_aside_on_rank_0",
    "take_run_lock",
]
