"""experiments/pages/bench_gossip/measure.py: a commit git cannot read is a one-line error; the block
order puts the batched kernels and the earlier commits first equally often."""

from __future__ import annotations

import pytest

from experiments.pages.bench_gossip.measure import (
    before_powergossip,
    block_order,
)


def test_a_commit_git_cannot_read_is_a_one_line_error():
    with pytest.raises(ValueError, match="cannot read gossip_powersgd/algorithms/powergossip.py"):
        before_powergossip("no-such-commit")


def test_block_order_puts_batched_and_before_first_equally_often():
    names = ["batched", "before", "naive"]
    orders = [block_order(names, rep) for rep in range(4)]
    assert [o[0] for o in orders].count("batched") == [o[0] for o in orders].count("before") == 1
    positions = {n: sum(o.index(n) for o in orders) for n in names}
    assert positions["batched"] == positions["before"]
    # Without "before", the A B, B A alternation of the earlier pages.
    assert [block_order(["batched", "naive"], rep) for rep in range(3)] == [
        ["batched", "naive"],
        ["naive", "batched"],
        ["batched", "naive"],
    ]
