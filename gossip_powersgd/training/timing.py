"""Timing a training step, an evaluation and their communication, split into compute,
the algorithm's arithmetic and the transport (the bandwidth page's measurements).

`measure_algorithm(comm, recorder, config, budget)` (`Budget`: how long, within which limits) runs
the trainer's own loop (`training.trainer.train`) on a communicator with a `StepTimer` hook and
stops it once enough periods of H steps (H = local_steps, else 1) are measured. Per period it keeps
the wall time, the algorithm's own arithmetic and its time inside the transport, as the algorithm
already counts them (`GossipAlgorithm.time_total` / `time_communication`); the rest of a period
(forward, backward, optimizer, data) is compute; evaluations and log records are taken out.
Period 0 (connections made, buffers allocated) is not used. After period 1 the peers agree on how many periods to measure (the slowest peer's period
1 against the time budget). The last period's communicator calls are recorded (`CallRecorder`) and
then replayed `repeats` times with no computation at all between them, each replay after a barrier:
the communication time with compute out of the way. `measure_evaluation` times one call of the
trainer's evaluation (`evaluation.eval_record`: local and averaged-model accuracy, consensus
distance: its all-reduces are metric traffic) and replays its communication the same way.

`EchoCommunicator` is one peer alone: every neighbour sends back what this peer sends it and
every all-reduce finds every peer holding this peer's tensor, so a step does all of its compute
and arithmetic, with the same messages counted, and never waits for anyone.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from gossip_powersgd.comm.base import Communicator, ring_allreduce_bytes
from gossip_powersgd.training.hooks import TrainingHooks


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long a measurement runs. A plain dict of these fields is taken too."""

    #: seconds of timed training periods after the first two, and the periods in all (fewest, most)
    train: float = 8.0
    periods: Tuple[int, int] = (3, 40)
    #: seconds of replays of the last period's communication (0: no replay), and their limits
    replay: float = 3.0
    replays: Tuple[int, int] = (1, 10)
    #: the limits of the replays of an evaluation's communication
    eval_replays: Tuple[int, int] = (1, 5)


def _budget(budget: Union[Budget, Mapping[str, Any]]) -> Budget:
    return budget if isinstance(budget, Budget) else Budget(**budget)


class Stop(Exception):
    """Raised from `train`'s on_step once the measured periods are done (on every peer at the
    same step: the decision is collective)."""


#: The TCP counters a measurement keeps (this network namespace's: /proc/net/snmp, netstat).
TCP_COUNTERS = ("OutSegs", "RetransSegs", "TCPTimeouts")


def tcp_counters() -> Dict[str, int]:
    """This host's TCP counters (`TCP_COUNTERS`), from the kernel's tables for its namespace."""
    found: Dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for names, values in zip(lines[::2], lines[1::2]):
            if names.split()[0] in ("Tcp:", "TcpExt:"):
                found.update(zip(names.split()[1:], map(int, values.split()[1:])))
    return {k: found.get(k, 0) for k in TCP_COUNTERS}


def _grown(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def clamp(value: float, low: int, high: int) -> int:
    return int(min(high, max(low, math.ceil(value))))


class StepTimer(TrainingHooks):
    """Per period of `local_steps` steps: (wall, arithmetic, communication, CPU) seconds, the
    time of any evaluation (kept in `evaluations`) or log record that fell inside it taken out. CPU is this
    process's CPU time (all its threads): what the period costs a core, whatever else shares it."""

    name = "step_timer"
    optional = True

    def __init__(self, local_steps: int, budget: float, periods: Tuple[int, int], recorder=None):
        self.h = int(local_steps)
        self.budget = float(budget)
        self.min_periods, self.max_periods = periods
        self.recorder = recorder
        self.periods: List[Tuple[float, float, float]] = []
        self.evaluations: List[float] = []
        self.wanted: Optional[int] = None
        self.calls: Optional[list] = None
        self.last = None
        self.step_end = 0.0
        self.excluded = 0.0
        self.excluded_cpu = 0.0
        self.cpu_end = 0.0

    def setup(self, context) -> None:
        self.context = context
        self.algorithm = context.algorithm
        self.comm = context.comm

    def _mark(self):
        a = self.algorithm
        return time.perf_counter(), a.time_total, a.time_communication, time.process_time()

    def after_step(self, step: int, loss) -> None:
        self.step_end, self.cpu_end = time.perf_counter(), time.process_time()
        if (step + 1) % self.h:
            return
        now = self._mark()
        if self.last is not None:  # period 0 has no start mark: it is not timed
            wall = now[0] - self.last[0] - self.excluded
            total, comm = now[1] - self.last[1], now[2] - self.last[2]
            cpu = now[3] - self.last[3] - self.excluded_cpu
            self.periods.append((wall, total - comm, comm, cpu))
        self.excluded = self.excluded_cpu = 0.0
        done = (step + 1) // self.h  # periods completed, period 0 included
        if done == 2 and self.wanted is None:
            slowest = self.comm.allreduce_(
                torch.tensor([self.periods[-1][0]], dtype=torch.float64), op="max", metric=True
            )
            self.wanted = periods_to_measure(
                float(slowest[0]), self.budget, self.min_periods, self.max_periods
            )
        if self.recorder is not None and self.wanted is not None:
            if done == self.wanted - 1:
                self.recorder.start(metric=False)
            elif done == self.wanted:
                self.calls = self.recorder.stop()
        self.last = self._mark()

    def on_evaluation(self, record):
        self.evaluations.append(self._exclude())
        return None

    def on_record(self, record) -> None:
        """A log record (log_every: its metric all-reduces, its line in the metrics file) is no
        part of a training step either: taken out of its period like an evaluation."""
        if record.get("kind") == "log":
            self._exclude()

    def _exclude(self) -> float:
        """Take the time since the last step ended out of the period (wall and CPU): returns it."""
        took = time.perf_counter() - self.step_end
        self.excluded += took
        self.excluded_cpu += time.process_time() - self.cpu_end
        return took

    def finished(self, step: int) -> None:
        """`train`'s on_step: stop once the wanted periods are done."""
        if self.wanted is not None and step >= self.wanted * self.h:
            raise Stop()


def periods_to_measure(period_seconds: float, budget: float, low: int, high: int) -> int:
    """Periods to run in all (period 0 included): enough for `budget` seconds after the first
    two, at least `low`, at most `high`."""
    return 2 + clamp(budget / max(period_seconds, 1e-6), low - 2, high - 2)


# ---- recording and replaying the communication ---------------------------------------------------
class CallRecorder:
    """Records the exchanges and all-reduces made through `comm` while started (training calls,
    or metric all-reduces with `metric=True`): their buffers' sizes and dtypes, not their data."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.calls: Optional[list] = None
        self.metric = False
        exchange, allreduce = comm.exchange, comm.allreduce_

        def recorded_exchange(send, recv, step=None):
            if self.calls is not None and not self.metric:
                self.calls.append(["exchange", _shapes(send), _shapes(recv)])
            return exchange(send, recv) if step is None else exchange(send, recv, step)

        def recorded_allreduce(tensor, op="mean", metric=False):
            if self.calls is not None and metric == self.metric:
                self.calls.append(["allreduce", tensor.numel(), str(tensor.dtype), op, metric])
            return allreduce(tensor, op=op, metric=metric)

        comm.exchange, comm.allreduce_ = recorded_exchange, recorded_allreduce

    def start(self, metric: bool) -> None:
        self.calls, self.metric = [], metric

    def stop(self) -> list:
        calls, self.calls = self.calls, None
        return calls


def _shapes(buffers: Dict[int, torch.Tensor]) -> Dict[str, List]:
    return {str(j): [t.numel(), str(t.dtype)] for j, t in buffers.items()}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.split(".")[-1])


def replay(comm: Communicator, calls: list, repeats: int) -> List[float]:
    """Seconds of each of `repeats` replays of `calls` (zero-filled buffers of the recorded sizes,
    the same peers and order; nothing computed between them), each started after a barrier."""
    plan: List[Callable[[], None]] = []
    for call in calls:
        if call[0] == "exchange":
            send = {int(j): torch.zeros(n, dtype=_dtype(d)) for j, (n, d) in call[1].items()}
            recv = {int(j): torch.zeros(n, dtype=_dtype(d)) for j, (n, d) in call[2].items()}
            plan.append(lambda s=send, r=recv: comm.exchange(s, r))
        else:
            _, numel, dtype, op, metric = call
            buffer = torch.zeros(numel, dtype=_dtype(dtype))
            plan.append(lambda b=buffer, o=op, m=metric: comm.allreduce_(b, op=o, metric=m))
    seconds = []
    for _ in range(repeats):
        comm.barrier()
        start = time.perf_counter()
        for action in plan:
            action()
        seconds.append(time.perf_counter() - start)
    return seconds


def agreed_repeats(comm: Communicator, seconds: float, budget: float, low: int, high: int) -> int:
    """Replays to run: `budget` over the slowest peer's `seconds`, within [low, high]."""
    slowest = comm.allreduce_(torch.tensor([seconds], dtype=torch.float64), op="max", metric=True)
    return clamp(budget / max(float(slowest[0]), 1e-6), low, high)


# ---- one algorithm, one evaluation ----------------------------------------------------------------
def measure_algorithm(comm: Communicator, recorder, config: Dict[str, Any], budget):
    """The trainer's loop on `comm` until the periods are measured, then the last period's
    communication replayed (unless `budget.replay` is 0). Returns the periods, the traffic
    counters' growth per step, the replays, and the timer (for its model)."""
    from gossip_powersgd.training.trainer import train

    budget = _budget(budget)
    timer = StepTimer(config["local_steps"], budget.train, tuple(budget.periods), recorder)
    before, tcp = comm.stats.as_dict(), tcp_counters()
    try:
        train(comm, config, hooks=[timer], on_step=timer.finished)
    except Stop:
        pass
    else:
        raise ValueError(
            f"{config['algorithm']}: the run ended after {len(timer.periods) + 1} periods, before "
            f"the {timer.wanted} to measure: give it more epochs"
        )
    steps = (len(timer.periods) + 1) * timer.h  # period 0 ran too, untimed
    after = comm.stats.as_dict()
    grown = {k: (after[k] - before[k]) / steps for k in ("bytes_sent", "rounds", "critical_bytes")}
    out = {
        "periods": [list(p) for p in timer.periods],
        "local_steps": timer.h,
        "steps": steps,
        "per_step": grown,
        "evaluations": timer.evaluations,
    }
    trained = tcp_counters()
    out["tcp"] = {"training": _grown(tcp, trained)}
    if budget.replay:
        comm_median = statistics.median(p[2] for p in timer.periods)
        repeats = agreed_repeats(comm, comm_median, budget.replay, *budget.replays)
        out["replay"] = replay(comm, timer.calls or [], repeats)
        out["calls"] = len(timer.calls or [])
        out["tcp"]["replay"] = _grown(trained, tcp_counters())
    return out, timer


def measure_evaluation(comm: Communicator, recorder, timer: StepTimer, budget):
    """One evaluation as the trainer makes it (on the model `timer` trained), timed, its
    traffic counted, and (with `budget.replay`) its communication replayed."""
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.evaluation import eval_record

    config = timer.context.config
    dataset = load_dataset(config.dataset, config.seed)
    model = timer.context.model
    averaged = copy.deepcopy(model)
    comm.barrier()
    before = comm.stats.metric_bytes_sent
    recorder.start(metric=True)
    start, cpu = time.perf_counter(), time.process_time()
    eval_record(
        comm,
        model,
        averaged,
        dataset.x_test,
        dataset.y_test,
        epoch=0,
        step=0,
        lr=0.0,
        train_loss_local=0.0,
        timers=dict,
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    calls = recorder.stop()
    out = {"seconds": seconds, "cpu": cpu, "metric_bytes": comm.stats.metric_bytes_sent - before}
    budget = _budget(budget)
    if budget.replay:
        repeats = agreed_repeats(comm, seconds, budget.replay, *budget.eval_replays)
        out["replay"] = replay(comm, calls, repeats)
    return out


# ---- a peer alone ----------------------------------------------------------------------------------
class EchoCommunicator(Communicator):
    """Peer `rank` of `topology` by itself: its neighbours echo its messages back and every
    all-reduce meets copies of its own tensor (a mean or max is the tensor itself, a sum is n times
    it). Traffic is counted as the real transports count it."""

    def _exchange(self, send, recv) -> None:
        for j, buffer in recv.items():
            buffer.copy_(send[j])

    def _ring_allreduce(self, tensor, op: str):
        if op == "sum":
            tensor.mul_(self.size)
        messages = 2 * (self.size - 1) if tensor.numel() >= self.size else 2 * tensor.numel()
        sent = ring_allreduce_bytes(tensor.numel(), tensor.element_size(), self.size, self.rank)
        return sent, messages

    def _allgather_tensor(self, tensor):
        return [tensor.clone() for _ in range(self.size)]


def measure_alone(config: Dict[str, Any], budget) -> Dict[str, Any]:
    """One peer (rank 0 of the config's topology) alone on this process, one thread: its steps
    and one evaluation, nothing waited for (`EchoCommunicator`)."""
    import topologies

    torch.set_num_threads(int(config.get("threads", 1)))
    comm = EchoCommunicator(topologies.parse(config["topology"]), 0, None)
    recorder = CallRecorder(comm)
    measured, timer = measure_algorithm(comm, recorder, dict(config, backend="local"), budget)
    measured["eval"] = measure_evaluation(comm, recorder, timer, budget)
    return measured
