"""What rank 0 tells the user while a run sets up and trains (nothing on other ranks, nothing with
`quiet`).

Set-up lines go to stdout as each phase ends, with its time, so that a job under mpiexec or
torchrun is not silent while it loads data and agrees with its peers. During training, a terminal
gets tqdm's bar; anything else (a launcher's pipe, a log file, a batch job) gets a plain progress
line on stdout after the first step, every `PROGRESS_FRACTION` of the run's steps and at least
every `PROGRESS_SECONDS`, beside the evaluation lines. stderr stays for errors: a failing run's stderr is
its one-line error.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

#: Without a terminal: a progress line each time this fraction of the steps is done ...
PROGRESS_FRACTION = 0.1
#: ... and whenever this many seconds passed since the last line.
PROGRESS_SECONDS = 60.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class SetupLog:
    """Rank 0's set-up lines: ``set-up: <what> (<seconds> s)`` when each phase ends."""

    def __init__(self, rank: int, quiet: bool):
        self.enabled = rank == 0 and not quiet
        self.last = time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        if self.enabled:
            print(f"set-up: {what} ({now - self.last:.1f} s)", flush=True)
        self.last = now


class Printer:
    """Rank 0's progress (tqdm bar on a terminal, plain lines otherwise) and evaluation lines."""

    def __init__(self, rank: int, config, total: int, initial: int):
        self.enabled = rank == 0 and not config.quiet
        self.total, self.done, self.bar = total, initial, None
        self.start_step, self.start = initial, time.perf_counter()
        self.every = max(1, int(total * PROGRESS_FRACTION + 0.999999))
        self.last_line = self.start
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                unit="step",
                dynamic_ncols=True,
                desc=f"{config.algorithm} on {config.topology}",
                file=sys.stderr,
            )

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled:
            now = time.perf_counter()
            if (
                self.done % self.every == 0
                or self.done == self.start_step + 1  # the first step: training has started
                or self.done == self.total
                or now - self.last_line >= PROGRESS_SECONDS
            ):
                self.last_line = now
                print(self.progress_line(now), flush=True)

    def progress_line(self, now: Optional[float] = None) -> str:
        now = time.perf_counter() if now is None else now
        ran, elapsed = self.done - self.start_step, now - self.start
        text = f"progress: step {self.done}/{self.total} ({100 * self.done / self.total:.0f} %)"
        if ran > 0 and elapsed > 0:
            rate = ran / elapsed
            text += f", {rate:.1f} steps/s"
            if self.done < self.total:
                text += f", about {_duration((self.total - self.done) / rate)} left"
        return text

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


__all__ = ["SetupLog", "Printer", "PROGRESS_FRACTION", "PROGRESS_SECONDS"]
