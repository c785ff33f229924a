"""cluster/enter.py: the ssh stand-in Hydra runs, and which cluster a process is in (entering a
host for real needs namespaces: tests/cluster/test_network.py)."""

import pytest

from gossip_powersgd.cluster import enter, network
from gossip_powersgd.cluster.enter import enter_command, split_ssh_arguments


@pytest.mark.parametrize(
    "args, host, command",
    [
        (["-tp", "2222", "host3", "ls", "-l"], "host3", ["ls", "-l"]),  # p's value: the next word
        (["-p2222", "host3", "ls"], "host3", ["ls"]),  # p's value: the rest of its word
        (["-x", "-o", "A=b", "me@host0", "true"], "host0", ["true"]),  # user@ is dropped
        (["--", "-host", "cmd"], "-host", ["cmd"]),  # after --, a word is the host
    ],
)
def test_ssh_options_with_and_without_values_are_skipped(args, host, command):
    assert split_ssh_arguments(args) == (host, command)


def test_no_host_or_no_command_is_refused_saying_what_to_give():
    with pytest.raises(
        network.ClusterError, match=r"^no host given: \[ssh options\] HOST COMMAND$"
    ):
        split_ssh_arguments(["-p", "22"])
    with pytest.raises(
        network.ClusterError,
        match=r"^no command for host1 \(for a shell there: python -m gossip_powersgd\.cluster "
        r"exec host1 -- bash\)$",
    ):
        split_ssh_arguments(["host1"])
    with pytest.raises(network.ClusterError, match=r"^no command given: exec HOST -- COMMAND"):
        enter_command("gp", "host0", [])


def test_the_prefix_is_the_explicit_one_then_the_callers_cluster_then_the_environment(monkeypatch):
    monkeypatch.setattr(enter, "current_prefix", lambda: None)
    monkeypatch.delenv(network.PREFIX_ENV, raising=False)
    assert enter.resolve_prefix() == network.DEFAULT_PREFIX == "gp"
    monkeypatch.setenv(network.PREFIX_ENV, "envp")
    assert enter.resolve_prefix() == "envp"
    monkeypatch.setattr(enter, "current_prefix", lambda: "inside")
    assert enter.resolve_prefix() == "inside"
    assert enter.resolve_prefix("given") == "given"
    with pytest.raises(network.ClusterError, match="prefix 'Bad-1' is not usable"):
        enter.resolve_prefix("Bad-1")


def test_ssh_main_fails_as_ssh_does_in_one_line_with_status_255(capsys):
    with pytest.raises(SystemExit) as info:
        enter.ssh_main(["-x"])
    assert info.value.code == 255
    assert capsys.readouterr().err == (
        "gossip-cluster-ssh: no host given: [ssh options] HOST COMMAND\n"
    )


def test_ssh_arguments_as_hydra_gives_them():
    # printed from mpich 5.0.2's Hydra (-launcher ssh -launcher-exec PROGRAM)
    hydra = ["-x", "host1", '"/venv/bin/hydra_pmi_proxy"', "--control-port", "host0:40763"]
    assert split_ssh_arguments(hydra) == ("host1", hydra[2:])
    assert split_ssh_arguments(["-p", "22", "-oBatchMode=yes", "u@host2", "ls"]) == (
        "host2",
        ["ls"],
    )
    with pytest.raises(network.ClusterError, match="no command"):
        split_ssh_arguments(["-x", "host1"])
