"""Processes of the torch backend under on_peer_loss: continue, for tests/comm/test_torch_members.py.

    python tests/support/churn_torch.py OUT SPEC TOPOLOGY STEPS VICTIM SIGNAL AT [late|then|slow|hold:N[:rejoin]]

runs one peer of a gossip-only run (no training: the models only gossip, as in tests/membership/test_peer.py)
with the liveness monitor and the store agreement of `membership.detected`; peer VICTIM sends
itself SIGNAL (KILL or STOP) at the start of step AT. VICTIM may be several ids (`2+4`: each one
sends it). With `late`, the victims' neighbours start the gossip of step AT only once every
victim's process has ended (the connections to it closed before they post their messages). Each survivor saves its trace in
OUT/rank-K.pt: per step the model at the start of the step's gossip and after it, whether that
step's gossip was interrupted, and the membership epochs it agreed on. With `slow`, every
monitor finds a stopped peer only SLOW_MARGIN s after the comm timeout. With HOLD, the survivors
wait at step HOLD for the victim's join request (`hold_for_rejoin`); with `rejoin` this process is
the victim restarted (`--rejoin`'s path: admitted, handed the state, its trace from there).

`launch` starts N such processes (or N training programs) the way torchrun starts its workers
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), without torchrun's agent: one agent
over N workers ends them all when one dies, and one agent per worker (--nnodes N) makes each
survivor's agent wait in its exit barrier for the dead worker's agent (300 s, not a torchrun
option) after its worker has ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHAPES = [(10, 12), (12, 10), (7,)]
#: The comm timeout of these runs: a stopped peer is lost after half of it (10 s).
TIMEOUT = 20.0
#: With `slow`, the survivors' monitors find a stopped peer this long after the comm timeout (as
#: a monitor that a loaded machine pauses for over GAP_SECONDS, which starts its counts again).
SLOW_MARGIN = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, program: Sequence[str], log_dir: Path) -> List[subprocess.Popen]:
    """Start `program` (arguments after the interpreter) as ranks 0..n-1 of one job, each one's
    stdout and stderr in log_dir/rank-K.out and .err (the job's port: `launch.port`)."""
    launch.port = port = free_port()
    return [start(rank, n, port, program, log_dir) for rank in range(n)]


def start(
    rank: int, n: int, port: int, program: Sequence[str], log_dir: Path, tag: str = ""
) -> subprocess.Popen:
    """Start `program` as rank `rank` of the job of `n` on `port` (a restarted one too: `tag`
    tells its log files apart, log_dir/rank-K{tag}.out and .err)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL", "TORCHELASTIC_", "HYDI_"))
    }
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(n),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(map(str, (ROOT, HERE))),
        PYTHONFAULTHANDLER="1",  # a survivor that aborts prints every thread's stack
    )
    out = open(log_dir / f"rank-{rank}{tag}.out", "w")
    err = open(log_dir / f"rank-{rank}{tag}.err", "w")
    process = subprocess.Popen(
        [sys.executable, *program], env=env, cwd=ROOT, stdout=out, stderr=err
    )
    out.close()
    err.close()
    return process


def end(processes: Sequence[subprocess.Popen]) -> None:
    """SIGKILL whatever of `processes` still runs (a failed test), and reap them."""
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait()


def flat(tensors):
    import torch

    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def hold_for_rejoin(comm, victim: int) -> None:
    """Wait (a survivor, at the step HOLD) until peer `victim`'s join request is in the store:
    the test's pacing, so that the gossip-only run (milliseconds a step) does not end before the
    restarted process has started (seconds); TIMEOUT x 6 at most."""
    import time

    deadline = time.monotonic() + 6 * TIMEOUT
    while not comm._store.check([f"membership/join/{victim}"]) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_until_ended(pids) -> None:
    """Until every process of `pids` (of this machine) has ended (gone, or a zombie)."""
    from gossip_powersgd.faults import liveness

    while any(liveness.process_state(pid) not in (None, "Z") for pid in pids):
        time.sleep(0.01)
    time.sleep(0.05)  # gloo's thread reads the closed connections (ordering, not a timed check)


def main(out: str, spec: str, topology_spec: str, steps: int, victims, sig: str, at: int, mode=""):
    held = mode.startswith("hold:")  # hold:N (a survivor), hold:N:rejoin (the restarted victim)
    hold, rejoin = (int(mode.split(":")[1]), mode.endswith(":rejoin")) if held else (-1, False)
    import torch

    import topologies
    from gossip_powersgd import TorchCommunicator, faults, make_algorithm
    from gossip_powersgd.comm.membership import MemberCommunicator
    from gossip_powersgd.comm.torch_rejoin import RejoiningCommunicator
    from gossip_powersgd.membership.detected import await_admission, detected_changes
    from gossip_powersgd.membership.epochs import Membership
    from gossip_powersgd.membership.peer import ParamsState, PeerMembership

    torch.set_num_threads(1)
    topology = topologies.parse(topology_spec)
    comm = (RejoiningCommunicator if rejoin else TorchCommunicator)(topology, timeout=TIMEOUT)
    g = torch.Generator().manual_seed(42 + comm.rank + (1000 if rejoin else 0))
    params = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    member = MemberCommunicator(comm)
    peer = PeerMembership(member, Membership(topology))
    algorithm = peer.bind(spec, make_algorithm(spec, params, member))
    driver = detected_changes(peer, comm)
    driver.steps = steps
    if mode == "slow":  # a monitor that finds a stopped peer only after the waits time out
        driver.monitor.stopped_after = TIMEOUT + SLOW_MARGIN
    state = ParamsState(params)
    trace, largest, first = [], 0.0, 0
    if rejoin:  # away until its admission step (`ChurnRun._await_admission`'s placing)
        first = await_admission(driver, driver.monitor.announce())
        peer.epoch = peer.membership.at(first - 1)
        trace = [None] * first
    near = {j for v in victims for j in topology.neighbors(v)} - set(victims)
    for t in range(first, steps):
        if t == at and not rejoin and comm.rank in victims[: 1 if mode == "then" else None]:
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
        elif t == at and not rejoin and comm.rank in victims:  # "then": once the others propose
            while not driver.store.check(["membership/1"]):
                time.sleep(0.01)
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
        if t == hold and not rejoin:  # (a survivor)
            hold_for_rejoin(comm, victims[0])
        driver.before_step(t)
        peer.advance(t, state)
        if mode == "late" and t == at and comm.rank in near:
            wait_until_ended([faults.current().local[v] for v in victims])
        middle = flat(params)
        interrupted = algorithm.interrupted_steps
        algorithm.step()
        after = flat(params)
        largest = max(largest, float(after.abs().max()))
        trace.append((middle, after, algorithm.interrupted_steps > interrupted))
    member.barrier()  # the members of the last epoch
    epochs = [(e.number, e.step, list(e.live)) for e in peer.membership.epochs]
    result = {"trace": trace, "epochs": epochs, "largest": largest, "changes": driver.changes}
    path = Path(out) / f"rank-{comm.rank}.pt"
    torch.save(result, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    comm.close()


if __name__ == "__main__":
    out, spec, topology_spec, steps, victims, sig, at = sys.argv[1:8]
    victims = [int(v) for v in victims.split("+")]
    main(out, spec, topology_spec, int(steps), victims, sig, int(at), "".join(sys.argv[8:9]))
