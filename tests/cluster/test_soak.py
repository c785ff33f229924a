"""`cluster.soak`: faults of single hosts under a training run on the emulated cluster.

Without a cluster: each host's command (the torch launcher's variables, host 0 the store, the
run's fault handling on top of the config), the progress read from a run's output, the pauses
that spread the faults before FAULTS_AIM_AT, and the detection-to-continuation figures per way a
peer was lost.

The quick soak (4 hosts, a kill, a stop and a link cut, each host brought back with --rejoin) is
opt-in (GOSSIP_TEST_CHURN_SOAK=1): it runs three trainings (a probe for the step rate, the run
without faults, the soak) for several minutes, past the suite's budget; it needs root for the
network namespaces."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from gossip_powersgd.cluster import network
from gossip_powersgd.cluster import soak

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"

OPT_IN = pytest.mark.skipif(
    os.environ.get("GOSSIP_TEST_CHURN_SOAK") != "1",
    reason="opt-in (GOSSIP_TEST_CHURN_SOAK=1): several minutes on the emulated cluster",
)
ROOT_ONLY = pytest.mark.skipif(
    bool(network.missing_privileges()),
    reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
)


def test_a_hosts_command_is_the_torch_launchers_without_an_agent(tmp_path):
    """Host 2 of 4: its rank and the world from the variables torchrun would set, host 0's
    address as the store, a ring over the hosts with the run's fault handling set on top of the
    config, and --rejoin with its id for a restart; the package the test imports is the one the
    host imports."""
    run = soak.ClusterRun("xx", 4, tmp_path / "w", 30, TINY)
    argv, env = run.command(2)
    assert argv[1:5] == ["-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
    assert sets["backend"] == "torch" and sets["on_peer_loss"] == "continue"
    assert sets["topology"] == "ring:4" and sets["epochs"] == "30" and sets["eval_every"] == "30"
    assert float(sets["comm_timeout"]) == soak.TIMEOUT
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "4", "0")
    assert env["MASTER_ADDR"] == network.address(0)
    assert Path(env["PYTHONPATH"], "gossip_powersgd", "cluster", "soak.py").is_file()
    assert "--rejoin" not in argv
    assert run.command(2, rejoin=True)[0][-2:] == ["--rejoin", "2"]


def test_progress_is_the_last_progress_line():
    assert soak.progress("starting\n") == 0.0
    assert soak.progress("progress: step 10/40 x\nprogress: step 30/40 y\n") == 0.75


def test_a_pause_spreads_the_time_left_over_the_faults_left():
    """Half-way through a 100 s run with 5 faults left and cycles of 2 s: the time left before
    FAULTS_AIM_AT (25 s) less a cycle per fault gives a slack of 3 s, so the pause is in
    [0, 6] s; past FAULTS_AIM_AT there is none."""
    text = "progress: step 50/100\n"
    pauses = [soak.pause(random.Random(s), text, 100.0, 5, [2.0]) for s in range(200)]
    assert 0.0 <= min(pauses) and max(pauses) <= 6.0 and max(pauses) > 5.0
    late = "progress: step 80/100\n"
    assert soak.pause(random.Random(0), late, 100.0, 5, [2.0]) == 0.0


def test_detection_to_continuation_per_way_a_peer_was_lost():
    lost = [
        dict(how="killed", detection_to_continuation_s=1.0),
        dict(how="killed", detection_to_continuation_s=3.0),
        dict(how="killed", detection_to_continuation_s=2.5),
        dict(how="stopped", detection_to_continuation_s=None),  # never measured: left out
        dict(how="unreachable", detection_to_continuation_s=4.0),
    ]
    out = soak.detection_by_kind({"peers_lost": lost})
    assert out == {
        "killed": {"median_s": 2.5, "max_s": 3.0, "n": 3},
        "unreachable": {"median_s": 4.0, "max_s": 4.0, "n": 1},
    }


@pytest.fixture
def no_cluster(monkeypatch):
    """`network.up`/`down` recorded instead of run; training never starts (`_soaked` refuses)."""
    made = []
    monkeypatch.setattr(network, "up", lambda prefix, *a: made.append(("up", prefix)))
    monkeypatch.setattr(network, "down", lambda prefix: made.append(("down", prefix)))
    monkeypatch.setattr(network, "signal_host", lambda *a: [])

    def refused(*args):
        raise AssertionError("training started")

    monkeypatch.setattr(soak, "_soaked", refused)
    return made


def test_a_rows_file_that_cannot_be_opened_leaves_no_cluster_behind(no_cluster, tmp_path):
    """The rows file was opened after the cluster was made, outside the cleanup: a path in a
    missing folder left every namespace of the cluster behind. Now it fails first."""
    with pytest.raises(FileNotFoundError):
        soak.soak(TINY, 1.0, 1, 0, tmp_path / "missing" / "soak.jsonl", hosts=3, prefix="rvx")
    assert no_cluster == []  # refused before any cluster was made


@pytest.mark.parametrize(
    "changed, named",
    [
        (dict(hosts=1), "hosts=1: give at least 2"),
        (dict(kinds=["kill", "hang"]), "unknown fault kinds ['hang']"),
        (dict(config="missing.yaml"), "'missing.yaml' is not a file"),
        (dict(minutes=0), "minutes=0, faults=1: give minutes > 0"),
    ],
)
def test_a_soak_that_cannot_run_is_refused_in_one_line_before_a_cluster_is_made(
    no_cluster, changed, named
):
    """One host (none to fault: host 0 never is), an unknown kind (taken for a stop before), a
    missing config, no minutes: a one-line ValueError before any cluster is made or training
    starts (before, a cluster was made and a probe trained first)."""
    args = dict(config=TINY, minutes=1.0, faults=1, seed=0, hosts=3, kinds=None, prefix="rvx")
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        soak.soak(**dict(args, **changed))
    assert "\n" not in str(refused.value)
    assert no_cluster == []


@OPT_IN
@ROOT_ONLY
def test_the_quick_soak_brings_every_host_back_and_every_process_finishes(tmp_path):
    out = tmp_path / "soak.jsonl"
    soak.soak(TINY, 1.5, 3, 0, out, hosts=4, kinds=soak.KINDS, prefix="crq")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    soaked, final = rows[:-1], rows[-1]
    assert [r["kind"] for r in soaked] == list(soak.KINDS[: len(soaked)]) and len(soaked) >= 2
    for row in soaked:
        # the survivors removed the faulted host's peer, then admitted it back
        assert row["right_peer"], row
        assert 0 < row["to_membership_line_s"] < row["to_readmission_s"]
    assert final["members_at_end"] == [0, 1, 2, 3]
    assert final["membership_changes"] == 2 * len(soaked)
    # each host's last process (its restart after its last fault, else the first) ends with 0
    last = {str(k): str(k) for k in range(4)}
    for row in soaked:
        last[str(row["host"])] = f"{row['host']}-rejoin{row['fault']}"
    assert {k: final["exit_codes"][name] for k, name in last.items()} == {
        str(k): 0 for k in range(4)
    }
    assert final["final_test_acc_avg_model"] > 0.8  # far above chance (4 classes)
    assert not [ns for ns in network.namespaces() if ns.startswith("crq-")]
