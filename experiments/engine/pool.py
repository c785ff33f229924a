"""The one process pool of the experiments: `fn(*task)` for every task, `jobs` at a time.

jobs == 1 runs the tasks here, in order; jobs > 1 in spawned workers, costliest first, with
`done(index, result)` called here as each finishes. The results come back in the tasks' order.
A task that raises stops the pool: the tasks not started are dropped, and the exception is raised
here once the running ones have finished and been handed to `done`. Anything else that stops it
here (Ctrl-C, `done` raising) kills the workers at once: nobody would store what they are running.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
from typing import Any, Callable, List, Optional, Sequence

#: The most worker processes --jobs may ask for.
MAX_JOBS = 256


class WorkerDied(RuntimeError):
    """A worker process ended without returning (killed, out of memory): one line for the CLI."""


class _Workers:
    """The pool's own record of its worker processes: each worker sends its pid first thing, so
    that the pool can kill the ones running tasks (`kill`) without reading the executor's private
    state. Passed to the workers (spawned: the pipe and the flag travel with them). Nothing here
    takes a lock: a worker killed while holding one (a queue's, an event's) would stop every
    later worker, or `kill` itself, for good."""

    def __init__(self, context) -> None:
        self.pids, self.sender = context.Pipe(duplex=False)
        self.closing = context.RawValue("b", 0)  # shared memory, set once by `kill`

    def join(self) -> None:
        """In a worker, before its first task: send its pid (8 bytes, one write with their
        header: atomic on a pipe), then end if the pool is closing. A worker whose pid `kill`
        did not read sent it after `kill` had set `closing`, so it sees the flag."""
        self.sender.send_bytes(os.getpid().to_bytes(8, "little"))
        if self.closing.value:
            os._exit(1)

    def kill(self) -> None:
        """End every worker now (SIGKILL). Without it, Ctrl-C (or a row that cannot be stored)
        waited in `shutdown` for every running run, and the one queued behind each, to finish,
        then dropped their rows: with hour-long runs, an interrupted sweep ran on for hours for
        nothing. Only live children of this process are killed (the pid of a worker that ended
        may be another process's by now); a worker still starting ends by itself (`join`)."""
        self.closing.value = 1
        pids = set()
        while self.pids.poll():
            pids.add(int.from_bytes(self.pids.recv_bytes(), "little"))
        for process in multiprocessing.active_children():
            if process.pid in pids:
                try:
                    process.kill()
                except (OSError, ValueError):  # ended meanwhile, or closed
                    pass


def _start_worker(parent: int, workers: _Workers) -> None:
    """In each worker, first: end with the sweep's process (Linux), which may be killed (kill -9,
    the out-of-memory killer) without ending its pool: a worker left alone would finish its run
    for nobody (only the sweep stores rows), then wait for work forever. Then join the pool's
    record of its workers."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep ended before the call above
            os._exit(1)
    workers.join()


def run_pool(
    fn: Callable[..., Any],
    tasks: Sequence[tuple],
    jobs: int = 1,
    costs: Optional[Sequence[float]] = None,
    done: Optional[Callable[[int, Any], None]] = None,
) -> List[Any]:
    """[fn(*task) for task in tasks], `jobs` processes at a time (see the module docstring).
    `fn` must be a module-level function (workers import it by name)."""
    if not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs must be a whole number from 1 to {MAX_JOBS}, got {jobs!r}")
    results: List[Any] = [None] * len(tasks)
    done = done or (lambda index, result: None)
    if jobs == 1 or len(tasks) <= 1:
        for index, task in enumerate(tasks):
            results[index] = fn(*task)
            done(index, results[index])
        return results
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    costs = list(costs) if costs is not None else [1.0] * len(tasks)
    order = sorted(range(len(tasks)), key=lambda i: -costs[i])  # stable: plan order among equals
    context = multiprocessing.get_context("spawn")
    workers = _Workers(context)
    start = functools.partial(_start_worker, os.getpid(), workers)
    pool = ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=context, initializer=start)

    def keep(finished) -> None:
        for future in sorted(finished, key=lambda f: futures[f]):
            if future.exception() is None:
                results[futures[future]] = future.result()
                done(futures[future], results[futures[future]])

    try:
        futures = {pool.submit(fn, *tasks[i]): i for i in order}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            keep(finished)
            failed = [f for f in finished if f.exception() is not None]
            if failed:  # drop what has not started; keep what was running when it finishes
                for future in pending:
                    future.cancel()
                keep([f for f in wait(pending)[0] if not f.cancelled()])
                error = failed[0].exception()
                if isinstance(error, BrokenProcessPool):
                    raise WorkerDied(
                        "a worker process died before its run finished (killed, or out of "
                        "memory?): the rows already finished are kept; run the same command "
                        "again to make the others"
                    ) from error
                raise error
    except BaseException:
        workers.kill()  # idle ones after a task's error; else runs nobody would store
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results
