"""cluster/launch.py: one program on every host and the wait for all of them. The hosts here are
plain processes of this machine (`enter_command` replaced by the command itself), so what is
checked is the launcher's own part: each host's variables and log, the seconds, and a failing or
hanging host ending the launch with its log's tail. Launches into real namespaces are in
tests/cluster/test_network.py (as root)."""

from __future__ import annotations

import pytest

from gossip_powersgd.cluster import launch

SAY = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'], "
SAY += "os.environ['GOSSIP_CLUSTER_PREFIX'])"


@pytest.fixture(autouse=True)
def local_hosts(monkeypatch):
    """Every 'host' runs its command right here."""
    monkeypatch.setattr(launch, "enter_command", lambda prefix, host, argv: list(argv))


def test_without_torchrun_each_host_gets_torchruns_variables_and_its_own_log(tmp_path):
    seconds = launch.launch_on_hosts("gx", 3, ["-c", SAY], tmp_path, torchrun=False)
    assert seconds > 0
    for k in range(3):
        assert (tmp_path / f"host{k}.log").read_text() == f"{k} 3 host0 gx\n"


def test_a_failing_host_ends_the_others_and_its_log_is_the_error(tmp_path):
    program = "import os, sys, time\nif os.environ['RANK'] == '1':\n    print('host one broke')\n"
    program += "    sys.exit(3)\ntime.sleep(600)"
    with pytest.raises(RuntimeError, match=r"host1 exited with status 3\): host one broke"):
        launch.launch_on_hosts("gx", 3, ["-c", program], tmp_path, torchrun=False, grace=0.5)


def test_a_launch_past_its_limit_is_killed_and_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="still running after 1 s"):
        launch.launch_on_hosts(
            "gx", 2, ["-c", "import time; time.sleep(600)"], tmp_path, torchrun=False, limit=1.0
        )


def test_a_host_the_cluster_lacks_starts_no_host_at_all(tmp_path, monkeypatch):
    """A launch on more hosts than the cluster has is refused before any host starts (the hosts
    started before the missing one were left running: under torchrun, waiting for a rendezvous
    that never completes)."""
    from gossip_powersgd.cluster.network import ClusterError

    started = []

    def enter(prefix, host, argv):
        if host == "host2":
            raise ClusterError("cluster 'gx' has no host 'host2'")
        return list(argv)

    monkeypatch.setattr(launch, "enter_command", enter)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ClusterError, match="no host 'host2'"):
        launch.launch_on_hosts("gx", 3, ["-c", "pass"], tmp_path, torchrun=False)
    assert started == []


def test_a_host_that_fails_to_start_ends_those_started_before_it(tmp_path, monkeypatch):
    """A start that fails part way (here host 1's log cannot be opened) kills the hosts already
    started, with what they started, and raises its own error."""
    (tmp_path / "host1.log").mkdir()  # open(..., "w") fails on host 1 only
    popen, started = launch.subprocess.Popen, []

    def recorded(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", recorded)
    sleep = ["-c", "import time; time.sleep(600)"]
    with pytest.raises(IsADirectoryError):
        launch.launch_on_hosts("gx", 3, sleep, tmp_path, torchrun=False)
    assert len(started) == 1 and started[0].returncode == -9


def test_under_torchrun_every_host_rendezvous_at_host0():
    argv, variables = launch._host_command(2, 4, ["-m", "prog"], True, 29400)
    assert argv[0].endswith("torchrun") and variables == {}
    assert argv[1:] == [
        "--nnodes",
        "4",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "host0:29400",
        "-m",
        "prog",
    ]


def test_train_on_hosts_runs_gossip_train_under_torchrun_on_a_host_per_peer(monkeypatch, tmp_path):
    """The config goes to gossip-train as YAML with its out_dir in the launch's own folder, one
    host per peer of its topology, under torchrun; the summary and rank 0's evaluation records
    (not its other records) come back with the launch's seconds."""
    import json

    import yaml

    seen = {}

    def fake(prefix, hosts, command, logs, torchrun, cwd, env, limit):
        config = yaml.safe_load(open(command[command.index("--config") + 1]))
        seen.update(prefix=prefix, hosts=hosts, torchrun=torchrun, cwd=cwd, config=config)
        run = config["out_dir"]
        assert run.startswith(str(logs))
        (logs / "run" / "metrics").mkdir(parents=True)
        (logs / "run" / "summary.json").write_text(json.dumps({"steps": 30}))
        records = [{"kind": "log", "step": 5}, {"kind": "eval", "step": 15}]
        text = "".join(json.dumps(r) + "\n" for r in records)
        (logs / "run" / "metrics" / "rank-0.jsonl").write_text(text)
        return 2.5

    monkeypatch.setattr(launch, "launch_on_hosts", fake)
    config = {"topology": "ring:3", "backend": "torch", "epochs": 2, "out_dir": "elsewhere"}
    summary, evals, seconds = launch.train_on_hosts("gx", config, cwd=tmp_path)
    assert (summary, evals, seconds) == ({"steps": 30}, [{"kind": "eval", "step": 15}], 2.5)
    assert (seen["prefix"], seen["hosts"], seen["torchrun"], seen["cwd"]) == (
        "gx",
        3,
        True,
        tmp_path,
    )
    assert {k: v for k, v in seen["config"].items() if k != "out_dir"} == {
        "topology": "ring:3",
        "backend": "torch",
        "epochs": 2,
    }
