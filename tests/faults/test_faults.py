"""gossip_powersgd/faults/__init__.py: a run's stop threshold (GOSSIP_STOPPED_SECONDS, or the
default; a value outside its range refused in one line), the monitor started only for a launched
run of several processes, and a rank that fails before its transport counting itself in torchrun's
store and waiting for the others (at most its grace), and a rank whose main thread finishes as its
monitor records a loss that ends the job exiting non-zero. The monitor itself: test_monitor.py."""

from __future__ import annotations

import sys
import time

import pytest

from gossip_powersgd import faults


@pytest.mark.parametrize("text, expected", [(None, 15.0), ("5", 5.0), ("3", 3.0), ("3600", 3600.0)])
def test_the_stop_threshold_is_the_runs_setting_or_the_default(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv(faults.STOPPED_VAR, raising=False)
    else:
        monkeypatch.setenv(faults.STOPPED_VAR, text)
    assert faults.STOPPED_SECONDS == 15.0  # the documented default (docs/concepts/failures.md)
    assert faults.stopped_seconds() == expected


@pytest.mark.parametrize("text", ["abc", "", "2.9", "0", "-5", "nan", "inf", "3601"])
def test_a_stop_threshold_outside_its_range_is_refused_in_one_line(monkeypatch, text):
    """Below GAP_SECONDS a rank's own pause could not be told from a stopped peer's."""
    monkeypatch.setenv(faults.STOPPED_VAR, text)
    with pytest.raises(ValueError) as raised:
        faults.stopped_seconds()
    line = str(raised.value)
    assert "\n" not in line and line.startswith(f"GOSSIP_STOPPED_SECONDS={text!r} is not a number")
    assert "from 3 to 3600: set it to one (e.g. 15, the default) or unset it" in line


def test_no_monitor_starts_outside_a_launcher_or_for_one_process(monkeypatch):
    monkeypatch.setattr(faults, "_monitor", None)
    monkeypatch.setattr(faults.liveness, "launched_rank", lambda: None)
    assert faults.start() is None and faults.current() is None and not faults.handled()
    assert faults.start(rank=0, size=1) is None and faults.current() is None


class _Store:
    """torchrun's store as `wait_for_failed_peers` uses it: `add(key, n)` returns the new count;
    `others` ranks count themselves after `after` calls."""

    def __init__(self, others=0, after=0):
        self.count, self.calls, self.others, self.after = 0, 0, others, after

    def add(self, key, amount):
        assert key == "failed"
        self.calls += 1
        if self.calls == self.after:
            self.count += self.others
        self.count += amount
        return self.count


def test_a_failing_rank_waits_until_every_rank_has_counted_itself():
    store = _Store(others=3, after=5)
    faults.wait_for_failed_peers(store, 4, seconds=30)
    assert store.count == 4 and store.calls == 5  # it stopped asking once all four had counted


@pytest.mark.timing  # a deadline checked on the clock: run one at a time, at the usual priority
def test_a_failing_rank_waits_no_longer_than_its_grace_nor_for_a_store_that_is_gone():
    began = time.monotonic()
    faults.wait_for_failed_peers(_Store(), 4, seconds=0.2)  # nobody else ever counts
    # at least the grace (a monotonic deadline); at most it plus its 20 ms polls, with 1.8 s to
    # spare for the scheduler: the bound tells a wait that ends at its deadline from one that does not
    assert 0.2 <= time.monotonic() - began < 2

    class Gone:
        def add(self, key, amount):
            raise ConnectionResetError("the store's host is gone")

    faults.wait_for_failed_peers(Gone(), 4, seconds=30)  # returns at once, raises nothing


@pytest.fixture
def quiet_monitor(monkeypatch):
    """A `Monitor` of rank 0 of 2 whose thread never looks (the test drives its recorded state),
    installed as this process's, with `finish` recording its status instead of waiting."""
    from gossip_powersgd.faults import monitor

    monkeypatch.setattr(monitor.Monitor, "_run", lambda self: None)
    m = monitor.Monitor(0, 2)
    monkeypatch.setattr(faults, "_monitor", m)

    def finish(code):
        raise SystemExit(f"finish {code}")

    monkeypatch.setattr(faults, "finish", finish)
    yield m
    m.closed = True
    m.endpoint.close()


def test_a_rank_whose_main_thread_ends_after_a_loss_that_ends_the_job_does_not_exit_0(
    quiet_monitor, capfd
):
    """Before: the monitor recorded a peer loss ("ending the job") while the main thread finished
    its run; main_guard exited 0 before the monitor ended the process with 1."""
    from gossip_powersgd.launch import main_guard

    quiet_monitor.lost(faults.PeerLost(1, "killed", "h"))  # the policy: abort
    assert "ending the job" in capfd.readouterr().err and faults.handled()
    with pytest.raises(SystemExit, match="^finish 1$"):  # the monitor's end, non-zero
        main_guard(lambda: 0)
    assert not quiet_monitor.closed  # it did not leave cleanly: it ends the job


def test_a_loss_found_after_the_main_thread_ended_is_not_recorded(quiet_monitor, capfd):
    """The other order: main_guard's check makes the monitor leave, under its lock, so a loss it
    finds a moment later is not recorded (nor announced as ending the job) and the exit is 0."""
    from gossip_powersgd.launch import main_guard

    with pytest.raises(SystemExit) as ended:
        main_guard(lambda: 0)
    assert ended.value.code == 0 and quiet_monitor.closed
    quiet_monitor.lost(faults.PeerLost(1, "killed", "h"))
    assert quiet_monitor.event is None and "ending the job" not in capfd.readouterr().err


def _failing_and_survivor(monkeypatch, policy: str):
    """Monitors of rank 2 (about to fail) and rank 0 of a 3-rank job under `policy`, with no
    thread of their own; the failing one's heartbeats collected in `sent` (for the survivor to
    hear), and no store to wait in: (failing, survivor, sent)."""
    import os

    from gossip_powersgd.comm import torch as torch_comm
    from gossip_powersgd.faults import monitor

    failing, survivor = monitor.Monitor(2, 3), monitor.Monitor(0, 3)
    sent = []
    for m in (failing, survivor):
        m.joined, m.policy = True, policy
    failing.local = {0: os.getpid()}
    monkeypatch.setattr(failing.endpoint, "send_local", lambda peer, data: sent.append(data))
    monkeypatch.setattr(faults, "_monitor", failing)
    monkeypatch.setattr(faults, "agent_store", lambda seconds: None)
    monkeypatch.setattr(torch_comm, "_store_for_exit", None)
    monkeypatch.setattr(torch_comm, "_failing", False)
    return failing, survivor, sent


@pytest.mark.parametrize("policy", ["continue", "abort", "continue-resting"])
def test_a_rank_that_fails_under_continue_tells_the_others_it_is_lost(monkeypatch, policy):
    """A rank ending with an error (`comm.torch.exit_after_peers`, the others still training)
    used to say in its exit's heartbeat that it left cleanly, so under continue the survivors
    watched it no more and waited out comm_timeout, then failed too. Now it names itself lost
    ("failed") and says no goodbye: a survivor's monitor hands the loss to the membership. Under
    abort nothing changes (the others end through their own failed waits). A resting monitor (a
    `--rejoin` process not admitted: refused, e.g. its peer is still a member) is no member: it
    names nobody lost, least of all the live member of its id (the members removed it)."""
    resting = policy.endswith("-resting")
    policy = policy.removesuffix("-resting")

    from gossip_powersgd.comm import torch as torch_comm
    from gossip_powersgd.faults import liveness

    failing, survivor, sent = _failing_and_survivor(monkeypatch, policy)
    try:
        failing.resting = resting
        with pytest.raises(SystemExit):
            torch_comm.exit_after_peers(1)
        failing.leave()  # the interpreter's exit functions
        leaving = [bool(liveness.unpack_heartbeat(d)[3] & liveness.LEAVING) for d in sent]
        assert any(leaving) == (policy == "abort" or resting)
        for data in sent:
            survivor._heard(data, None)
        lost = [(e.peer, e.how) for e, _ in survivor.losses]
        assert lost == ([(2, "failed")] if policy == "continue" and not resting else [])
        assert survivor.event is None  # a loss to go on without, not the end of the job
    finally:
        for m in (failing, survivor):
            m.closed = True
            m.endpoint.close()


def _interrupted():
    raise KeyboardInterrupt


def _exit(code):
    def main():
        raise SystemExit(code)

    return main


@pytest.mark.parametrize(
    "main, policy, status, line",
    [
        (_exit(1), "continue", 1, "error (rank 2): exited with status 1 (SystemExit raised by"),
        (_exit(3), "continue", 3, "error (rank 2): exited with status 3 (SystemExit"),
        (_exit("bye"), "continue", 1, "error (rank 2): bye (SystemExit"),
        (_interrupted, "continue", 130, "rank 2: interrupted (Ctrl-C)"),
        (_exit(0), "continue", 0, None),
        (_exit(None), "continue", None, None),
        (_exit(1), "abort", 1, None),  # as before: the others name it (its store record)
    ],
    ids=["exit-1", "exit-3", "exit-text", "interrupt", "exit-0", "exit-none", "exit-1-abort"],
)
def test_a_rank_that_exits_non_zero_under_continue_tells_the_others_it_is_lost(
    monkeypatch, capfd, main, policy, status, line
):
    """`sys.exit(N)` with N not 0 (or KeyboardInterrupt) out of the run's own code on one process
    of a torch job used to leave with a clean goodbye, so under continue the survivors watched it
    no more, waited out comm_timeout and failed too (4 ranks, tiny.yaml, sys.exit(1) in a hook of
    rank 2: every rank exits 1, after 30 to 65 s). Now it is a failure as an exception is
    (test_a_rank_that_fails_under_continue_tells_the_others_it_is_lost): one line, the same
    status, and a survivor's monitor hands the loss ("failed") to the membership. Status 0 (or
    None) is still a goodbye: no loss; under abort nothing changes."""

    from gossip_powersgd import launch
    from gossip_powersgd.faults import liveness

    failing, survivor, sent = _failing_and_survivor(monkeypatch, policy)
    try:
        monkeypatch.setattr(launch, "torch_world", lambda: (2, 3))
        monkeypatch.setattr(launch.os, "_exit", lambda code: sys.exit(code))  # (Ctrl-C's end)
        with pytest.raises(SystemExit) as ended:
            launch.main_guard(main)
        assert ended.value.code == status
        failing.leave()  # the interpreter's exit functions
        lost = line is not None
        err = capfd.readouterr().err
        assert err.count("\n") == int(lost) and err.startswith(line or "")
        leaving = [bool(liveness.unpack_heartbeat(d)[3] & liveness.LEAVING) for d in sent]
        assert any(leaving) == (not lost)
        for data in sent:
            survivor._heard(data, None)
        assert [(e.peer, e.how) for e, _ in survivor.losses] == ([(2, "failed")] if lost else [])
        assert survivor.event is None  # a loss to go on without, not the end of the job
    finally:
        for m in (failing, survivor):
            m.closed = True
            m.endpoint.close()
