"""The processes a launcher started, read from /proc: a job's ranks by pid, whether a pid is alive, a process's descendants, its state letter and whether it is already on its way out."""

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


def _stat(pid: int) -> list:
    """The fields of /proc/PID/stat after the command name (state first), [] once `pid` is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    return ps_state(pid) not in (None, "Z")


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
    fields = _stat(pid)
    return fields[0] if fields else None


#: `PF_EXITING` in the kernel's `task_struct.flags` (include/linux/sched.h): the process is in
#: `do_exit`, tearing down its memory and files before it becomes a zombie.
PF_EXITING = 0x4


def ending(pid: int) -> bool:
    """Whether `pid` is gone, a zombie, or already ending: in `do_exit` (`PF_EXITING`) or with a
    SIGKILL pending, which nothing can catch or block. A killed process with a large address space
    (torch) can spend a moment in `do_exit` before the kernel makes it a zombie."""
    fields = _stat(pid)
    try:
        with open(f"/proc/{pid}/status") as f:
            pending = [
                int(line.split()[1], 16) for line in f if line.startswith(("SigPnd", "ShdPnd"))
            ]
    except OSError:  # gone
        return True
    if not fields:  # gone between the two reads
        return True
    sigkill = 1 << (9 - 1)  # bit n-1 of the pending mask is signal n
    return (
        fields[0] == "Z" or bool(int(fields[6]) & PF_EXITING) or any(m & sigkill for m in pending)
    )
