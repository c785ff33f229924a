"""experiments/pages/bench_sim: one tiny run of its measurements and its page, with earlier commits'
PowerGossip beside this tree's (their own helper modules, or this tree's)."""

import pytest


def _readable(commit: str, helpers: bool) -> bool:
    from experiments.pages._commit_code import previous_powergossip

    return previous_powergossip(commit, helpers=helpers) is not None


def _bench_sim_page(**config):
    """The page of one run of the plan's --quick config with `config` over it (2 repetitions)."""
    from experiments.engine import Record, Rows, Run
    from experiments.pages import bench_sim

    (quick,) = bench_sim.plan(True, {})
    config = dict(quick.config, reps=2, big_peers=6, big_steps=2, divergence_peers=3, **config)
    run = Run(quick.key, config)
    row = bench_sim.row(run)
    record = Record(
        run.key, **run.identity(), quick=True, row=row, commit="c", finished="d", seconds=1.0
    )
    return bench_sim.render(Rows("bench_sim", True, [record], 1))["bench_sim.md"]


def test_bench_sim_writes_its_page_with_before_and_after():
    page = _bench_sim_page()
    assert "## 4 peers: gossip steps per second" in page
    assert "## 6 peers (this tree, two lanes)" in page
    assert "this tree, free threads" in page and "this tree, taking turns, one lane" in page
    assert (
        "this tree, two lanes** (`lanes=2`)" in page and "two lanes, tensor work as Python" in page
    )
    assert "bound for one lane: one thread, no messages" in page
    assert "| context switches of the process per step (median) |" in page
    assert "| resnet20 |" in page and "| vgg16 |" in page
    assert "two lanes / one lane: **" in page and "compiled / as Python:" in page
    assert "272,474 parameters" in page  # the zoo's ResNet-20 (1x1-convolution shortcuts)
    if _readable("6df8d52", helpers=True):  # a clone with its history
        # 6df8d52 (main before Architecture II) with its own kernels, lowrank, exact and base ends
        # with the same bits as this tree on every peer.
        assert "two lanes, compiled or not and with `6df8d52`: **yes**" in page
        assert "`6df8d52`'s PowerGossip, taking turns, one lane" in page
        assert "one lane, this tree / `6df8d52`: " in page and "repetition by repetition" in page
        assert "| `6df8d52`: ms, % of copy |" in page and "`6df8d52` / this tree" in page
        assert "Earlier commits' PowerGossip runs with that commit's own helper modules" in page
        assert (
            "`6df8d52`: `base.py`, `exact.py`, `kernels.py`, `lowrank.py`, `powergossip.py`" in page
        )
        assert "| 100 | " in page and "rounded differently" in page
    else:
        assert "two lanes, compiled or not: **yes**" in page


@pytest.mark.skipif(not _readable("610f530", helpers=False), reason="needs commit 610f530")
def test_bench_sim_runs_an_older_commit_with_this_trees_helpers():
    # How the pages up to 886c08c ran 610f530: its powergossip.py on this tree's base, exact and
    # lowrank, bit-identical with this tree; before "" leaves the free-thread column out.
    page = _bench_sim_page(previous="610f530", helpers="tree", before="")
    assert "two lanes, compiled or not and with `610f530`: **yes**" in page
    assert (
        "modules (`610f530`: `powergossip.py`; read with git) run with this tree's helper" in page
    )
    assert "rounded differently" not in page and "PowerGossip, free threads" not in page
