"""`cluster.step_times`: the hosts' step-time results summed up as per-step figures (made-up
results of two hosts: medians over the periods divided by H, the slowest host's replays, the TCP
counters summed), and the link check saying, not raising, why it could not measure. The probe
itself runs on the cluster in the bandwidth page's --quick run (root)."""

from __future__ import annotations

import pytest

from gossip_powersgd.cluster.step_times import link_check, summarize


def _host(name, periods, replay, tcp, evaluation=None):
    measured = {
        "local_steps": 2,
        "periods": periods,
        "per_step": {"bytes_sent": 100, "rounds": 4, "critical_bytes": 50},
        "replay": replay,
        "calls": 7,
        "evaluations": 1,
        "tcp": {"train": {"segments": tcp}},
    }
    out = {"host": name, "algorithms": {"pg-r1": measured}}
    return dict(out, eval=evaluation) if evaluation else out


def test_per_step_figures_per_host_and_the_slowest_hosts_replays():
    """Periods [wall, arithmetic, communication, CPU] of H = 2 steps: host0's walls 2, 4, 6 have
    median 4 (2 per step), mean 4, min 2, max 6; its compute is wall - arithmetic -
    communication (1, 2, 5: median 2, 1 per step); each replay is the slower host's; TCP
    counters add up over the hosts."""
    a = _host(
        "host0", [[2.0, 0.2, 0.8, 1.0], [4.0, 0.2, 1.8, 1.0], [6.0, 0.2, 0.8, 3.0]], [1.0, 3.0], 5
    )
    b = _host(
        "host1", [[8.0, 0.4, 2.0, 2.0], [8.0, 0.4, 2.0, 2.0], [8.0, 0.4, 2.0, 2.0]], [2.0, 2.0], 6
    )
    out = summarize([a, b])
    assert out["hosts"] == ["host0", "host1"]
    entry = out["algorithms"]["pg-r1"]
    assert (entry["local_steps"], entry["periods"], entry["calls"]) == (2, 3, 7)
    assert entry["wall"] == [2.0, 4.0] and entry["wall_mean"] == [2.0, 4.0]
    assert (entry["wall_min"], entry["wall_max"]) == ([1.0, 4.0], [3.0, 4.0])
    assert entry["compute"] == pytest.approx([1.0, 2.8]) and entry["cpu"] == [0.5, 1.0]
    assert entry["replay"] == [1.0, 1.5]  # max over hosts of (1, 2) and (3, 2), per step
    assert entry["tcp"] == {"train": {"segments": 11}}
    assert entry["bytes_sent"] == [100, 100] and "eval" not in out


def test_the_evaluation_is_kept_per_host_and_its_replays_are_the_slowest():
    evaluation = dict(seconds=1.0, cpu=0.5, metric_bytes=10, replay=[0.2, 0.4])
    a = _host("host0", [[2.0, 0.0, 0.0, 1.0]], [1.0], 1, evaluation)
    b = _host("host1", [[2.0, 0.0, 0.0, 1.0]], [1.0], 1, dict(evaluation, replay=[0.3, 0.1]))
    assert summarize([a, b])["eval"] == {
        "seconds": [1.0, 1.0],
        "cpu": [0.5, 0.5],
        "metric_bytes": [10, 10],
        "replay": [0.3, 0.4],
    }


def test_a_link_check_that_cannot_run_says_why_in_its_result():
    """No cluster of that prefix: the figure is missing and the reason is kept; the bytes are a
    3 s stream at 10 Mbit/s."""
    out = link_check("nocluster", "10mbit")
    assert out["bytes"] == int(10e6 / 8 * 3.0) and "payload_bits" not in out
    assert out["error"]
