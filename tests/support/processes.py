"""The processes a launcher started, read from /proc: a job's ranks by pid, whether a pid is alive, a process's descendants and its state letter."""

import os


def _children() -> dict:
    kids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def rank_pids(root_pid: int) -> dict:
    """{MPI rank: pid} of the processes below `root_pid` (mpiexec), read from /proc."""
    kids, stack, ranks = _children(), [root_pid], {}
    while stack:
        for child in kids.get(stack.pop(), []):
            stack.append(child)
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    variables = f.read().split(b"\0")
            except OSError:
                continue
            for v in variables:
                if v.startswith(b"PMI_RANK="):
                    ranks[int(v[len("PMI_RANK=") :])] = child
    return ranks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(root_pid: int) -> list:
    """Every process below `root_pid` now."""
    kids, stack, found = _children(), [root_pid], []
    while stack:
        for child in kids.get(stack.pop(), []):
            stack.append(child)
            found.append(child)
    return found


def ps_state(pid: int):
    """Process `pid`'s state, as `ps` shows it ("R", "S", "Z", ...), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
