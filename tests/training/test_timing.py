"""training/timing.py: a training step timed period by period (the period count that fills the
budget, one peer alone on the echo transport), and a step's recorded communication replayed with
the very bytes and rounds it sent (moved from the bandwidth page's tests)."""

from __future__ import annotations

import math

import pytest


def test_periods_to_measure_fill_the_budget_within_the_limits():
    from gossip_powersgd.training.timing import periods_to_measure

    assert periods_to_measure(0.5, 20.0, 3, 40) == 40  # capped
    assert periods_to_measure(70.0, 20.0, 3, 40) == 3  # a slow link: the fewest
    assert periods_to_measure(2.0, 20.0, 3, 40) == 12  # 10 after the first two


def test_recorded_messages_replay_the_same_training_bytes():
    """An exact-gossip and an all-reduce step's calls, recorded on the in-process transport and
    replayed: the replay sends exactly the bytes and rounds the step sent."""
    import torch

    from gossip_powersgd import LocalCluster, make_algorithm
    from gossip_powersgd.training.timing import CallRecorder, replay

    def peer(comm, spec):
        params = [torch.full((5, 7), float(comm.rank)), torch.ones(3)]
        algorithm = make_algorithm(spec, params, comm)
        recorder = CallRecorder(comm)
        recorder.start(metric=False)
        algorithm.step()
        calls = recorder.stop()
        stepped = comm.stats.as_dict()
        seconds = replay(comm, calls, 2)
        after = comm.stats.as_dict()
        return calls, stepped, after, seconds

    for spec in ("exact", "allreduce", "powergossip:rank=1"):
        for calls, stepped, after, seconds in LocalCluster("ring:4").run(peer, spec):
            assert calls and len(seconds) == 2
            for key in ("bytes_sent", "rounds", "critical_bytes"):
                assert after[key] == 3 * stepped[key], (spec, key)


def test_a_peer_alone_echoes_its_messages_and_counts_them_as_the_transports_do():
    import torch

    import topologies
    from gossip_powersgd.comm.base import ring_allreduce_bytes
    from gossip_powersgd.training.timing import EchoCommunicator

    comm = EchoCommunicator(topologies.parse("ring:8"), 0, None)
    send = {j: torch.arange(4.0) + j for j in comm.neighbors}
    recv = {j: torch.zeros(4) for j in comm.neighbors}
    comm.exchange(send, recv)
    assert all(torch.equal(recv[j], send[j]) for j in comm.neighbors)
    x = torch.arange(10.0)
    assert torch.equal(comm.allreduce_(x.clone(), op="mean"), x)
    assert torch.equal(comm.allreduce_(x.clone(), op="sum"), 8 * x)
    assert comm.stats.bytes_sent == 2 * 16 + 2 * ring_allreduce_bytes(10, 4, 8, 0)


def alone_config(log_every: int) -> dict:
    """One peer of ring:4 timed alone (MNIST-1D, an MLP, PowerGossip rank 1, 2 local steps)."""
    config = dict(dataset="mnist1d:num_samples=1200", model="mlp:64", optimizer="sgd")
    config.update(batch_size=32, epochs=1000, eval_every=1000, quiet=True, log_every=log_every)
    config.update(checkpoint_every=0, out_dir=None, topology="ring:4", lr=0.1, local_steps=2)
    return dict(config, algorithm="powergossip:rank=1", seed=0)


def test_one_peer_alone_trains_and_is_timed_period_by_period():
    from gossip_powersgd.training.timing import measure_alone

    config = alone_config(log_every=0)
    measured = measure_alone(config, {"train": 0.0, "periods": [4, 6], "replay": 0})
    assert len(measured["periods"]) == 3  # periods 1..3 of 4 (period 0 untimed)
    assert measured["steps"] == 8 and measured["local_steps"] == 2
    assert all(wall > 0 and cpu > 0 for wall, _, _, cpu in measured["periods"])
    assert measured["per_step"]["rounds"] == pytest.approx(0.5)  # one exchange per 2 steps
    assert measured["eval"]["metric_bytes"] > 0 and math.isfinite(measured["eval"]["cpu"])


def test_log_records_are_taken_out_of_the_periods_like_evaluations(monkeypatch):
    """With log_every > 0 a log record (metric all-reduces, a line written) fell inside its period
    and counted as training time. The timer's clock here is a counter that only log records
    advance (by 100 s each, one per step), so a period holds none of it exactly (no timing)."""
    from types import SimpleNamespace

    from gossip_powersgd.training import session, timing
    from gossip_powersgd.training.timing import measure_alone

    clock = [0.0]
    fake = SimpleNamespace(perf_counter=lambda: clock[0], process_time=lambda: clock[0])
    monkeypatch.setattr(timing, "time", fake)
    original = session.log_record

    def slow_log_record(*args, **kwargs):
        clock[0] += 100.0
        return original(*args, **kwargs)

    monkeypatch.setattr(session, "log_record", slow_log_record)
    config = alone_config(log_every=1)
    measured = measure_alone(config, {"train": 0.0, "periods": [4, 6], "replay": 0})
    assert clock[0] >= 800.0  # every step's log record ran (8 steps)
    assert [(wall, cpu) for wall, _, _, cpu in measured["periods"]] == [(0.0, 0.0)] * 3
