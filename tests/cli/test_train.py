"""The training command line (gossip-train, experiments/train.py) on bad input: a bad edge-list
file, a bad name or value, each one line and a non-zero exit."""

import pytest
import torch

from gossip_powersgd.utils import RunWarning
from tests.conftest import (
    TINY,
    cli,
)
from tests.training.test_validation import train_cli

EDGE_LISTS = {
    "disconnected": ("0 1\n2 3\n", "graph is not connected: 2 components"),
    # weights summing to more than 1 at a node cannot make a doubly stochastic W without a negative
    # diagonal, and this one would diverge
    "heavy": ("0 1 0.7\n1 2 0.7\n", "eigenvalue -1.1 < -1"),
    # the only way to write an asymmetric W in an undirected edge list is to give an edge twice
    "asymmetric": (
        "0 1 0.3\n1 2 0.3\n1 0 0.5\n",
        "reliability_asymmetric.txt:3: edge (0, 1) repeats line 1",
    ),
    "unparsable": ("0 1\n1 2\nfoo bar\n", "reliability_unparsable.txt:3: cannot parse 'foo bar'"),
}


@pytest.mark.parametrize("name", sorted(EDGE_LISTS))
def test_cli_bad_edge_list_files(tmp_path, capsys, name):
    text, expected = EDGE_LISTS[name]
    path = tmp_path / f"reliability_{name}.txt"
    path.write_text(text)
    code, lines = cli(
        [
            "--config",
            TINY,
            "--set",
            f"topology=file:{path}",
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        capsys,
    )
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: bad value for 'topology'"), lines
    assert expected in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "algorithm=gossipx",
            "algorithm spec 'gossipx': unknown name 'gossipx'; valid: allreduce, choco, "
            "deepsqueeze, exact, powergossip, powersgd",
        ),
        (
            "algorithm=choco:compressor=foo",
            "compressor spec 'foo': unknown name 'foo'; valid: identity, topk",
        ),
        (
            "topology=moebius:4",
            "topology spec 'moebius:4': unknown name 'moebius'; valid: ring, torus",
        ),
        (
            "optimiser=sgd",
            "unknown config key 'optimiser' in --set; valid keys: topology, algorithm",
        ),
        ("algorithm=powergossip:rank=0", "rank must be an integer >= 1, got 0"),
        # beyond float32: torch's optimizer would fail with a traceback at the first step
        ("lr=1e39", "bad value for 'lr': 1e+39 (must be > 0 and at most 3.403e+38 (float32))"),
    ],
)
def test_cli_bad_names_and_values_are_one_line(tmp_path, capsys, override, expected):
    code, lines = cli(
        ["--config", TINY, "--set", override, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_an_internal_key_error_names_its_type_and_key(tmp_path, capsys, monkeypatch):
    from gossip_powersgd.training import trainer as trainer_module

    def broken(*args, **kwargs):
        raise KeyError(0)

    monkeypatch.setattr(trainer_module, "_train", broken)
    code, lines = cli(["--config", TINY, "--set", f"out_dir={tmp_path / 'run'}"], capsys)
    assert code == 1
    assert lines[-1] == (
        "error: internal error: KeyError 0 (a lookup of a missing key; please "
        "report it with the command that caused it)"
    )
    assert lines[0].startswith("Traceback")  # a bug is not hidden behind one line


def test_threads_beyond_the_cpus_are_clamped_with_one_warning(tmp_path):
    import os

    cpus = len(os.sched_getaffinity(0))
    try:
        with pytest.warns(RunWarning) as caught:
            train_cli(tmp_path, "threads=100000", "epochs=1")
        assert torch.get_num_threads() == cpus
    finally:
        torch.set_num_threads(1)
    (message,) = [str(w.message) for w in caught if w.category is RunWarning]
    assert message == (
        f"threads 100000 exceeds the {cpus} CPUs this process may use: using {cpus} (torch "
        "intra-op threads)"
    )
