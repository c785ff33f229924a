"""The rank supervisor: under mpiexec, a thin parent that names its rank when that rank is killed.

MPICH is fail-stop: when a rank dies by a signal (kill -9, the OOM killer, a crash in native code),
hydra kills every other rank with SIGKILL within a fraction of a second, and its banner names a PID,
often another rank's. Nothing inside the ranks can speak reliably in that window (a notice from a
peer races hydra's SIGKILL, and lines still in a rank's pipe are dropped with it). The one process
that learns *how* a process ended, for certain and in time, is its parent: `waitid` hands it the
signal. So the training program, when hydra starts it, runs itself again as its own child and stays
as that child's parent (`supervise`): a Python interpreter with nothing but the standard library
loaded (torch is never imported in it), that forwards the signals a launcher sends (Ctrl-C,
SIGTERM, ...), and when the child dies by a signal it did not forward, writes one line naming the
rank, its pid, its host and the signal, before it ends with the same signal, so that hydra's status
is unchanged. The child, marked by `SUPERVISOR_VAR`, dies with its parent (PR_SET_PDEATHSIG).

torchrun's agent is already such a parent (it names a failed rank and its signal), and a user's
own script under mpiexec is left as it is: only the project's training programs are supervised.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Optional

from .liveness import SUPERVISOR_VAR, launched_rank

#: The programs that are supervised under mpiexec, and whose liveness monitor starts at import.
PROGRAMS = ("gossip_powersgd.cli.train", "experiments.train", "gossip-train")
#: The signals a launcher sends that the supervisor passes on to its child.
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_WHY = {
    signal.SIGKILL: "kill -9, or the OOM killer: see dmesg",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGBUS: "a crash in native code",
    signal.SIGABRT: "an abort in native code",
}


def main_program() -> Optional[str]:
    """The module (`python -m M`) or the script name this interpreter runs, from its command line."""
    argv = getattr(sys, "orig_argv", None)  # Python 3.10+
    if not argv:
        return None
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return args[i + 1] if i + 1 < len(args) else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg == "-c":
            return None
        if arg in ("-X", "-W"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return os.path.basename(arg)
    return None


def under_mpi_launcher() -> bool:
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def supervise() -> None:
    """Run this program again as a child, pass signals on, name it if it dies by a signal; never
    returns (exits with the child's status)."""
    rank = (launched_rank() or (0, 1))[0]
    env = dict(os.environ, **{SUPERVISOR_VAR: str(os.getpid())})
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env, close_fds=False)
    forwarded = set()

    def forward(signum, _frame):
        forwarded.add(signum)
        try:
            os.kill(child.pid, signum)
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    stopped = False
    while True:
        info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WSTOPPED | os.WCONTINUED)
        if info is None or info.si_code in (os.CLD_STOPPED, os.CLD_CONTINUED, os.CLD_TRAPPED):
            stopped = info is not None and info.si_code == os.CLD_STOPPED
            continue
        break
    if info.si_code == os.CLD_EXITED:
        os._exit(info.si_status)
    signum = info.si_status
    if signum not in forwarded:
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else ""
        why = (
            "while stopped: its peers ended it, since a stopped rank never answers"
            if stopped and signum == signal.SIGKILL
            else _WHY.get(signum, "sent by someone")
        )
        line = (
            f"error (rank {rank}): this rank's process (pid {child.pid}, under supervisor pid "
            f"{os.getpid()}, host {socket.gethostname()}) was killed by signal {signum} {name} "
            f"({why}); MPI ends every other rank with it"
        )
        os.write(2, (line + "\n").encode())
    _die_like(signum)


def _die_like(signum: int) -> None:
    """End with the status of a process killed by `signum`, without a core file of this one."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, OSError, ValueError):
        pass
    try:
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # the only ones with no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    os._exit(128 + signum)


def bind_to_supervisor() -> None:
    """In a supervised rank: die with the supervisor (hydra may kill it alone), at once if it has."""
    supervisor = os.environ.get(SUPERVISOR_VAR, "")
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if supervisor.isdigit() and os.getppid() != int(supervisor):
        os._exit(1)


__all__ = ["PROGRAMS", "main_program", "supervise", "bind_to_supervisor", "under_mpi_launcher"]
