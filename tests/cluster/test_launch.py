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
