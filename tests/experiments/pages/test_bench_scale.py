"""experiments/pages/bench_scale: what each kind charges (tiny sizes), the all-gather reduction, the
growth exponents, and the --quick page."""

import os

import pytest
import torch

import topologies
from experiments.engine import RowFile
from experiments.pages.bench_scale import KINDS, slope, summarize
from experiments.pages.bench_scale.measure import gather_reduce_, peer_point
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm import ring_allreduce_bytes


def test_every_kind_charges_what_it_moves():
    n = 4
    records = LocalCluster(topologies.ring(n)).run(peer_point, KINDS, "100", 2)
    numel = records[0]["numel"]
    assert numel == 100
    for record in records:
        r = record["rank"]
        got = {row["kind"]: row for row in record["results"]}
        assert got["exact"]["bytes_sent"] == got["exact"]["bytes_received"] == 2 * numel * 4
        assert got["ring"]["bytes_sent"] == ring_allreduce_bytes(numel, 4, n, r)
        assert got["ring"]["bytes_received"] == ring_allreduce_bytes(numel, 4, n, (r - 1) % n)
        # The all-gather reduction receives every other peer's whole tensor.
        assert got["gather"]["bytes_received"] == got["gather"]["bytes_sent"] == (n - 1) * numel * 4
        assert got["powergossip"]["bytes_sent"] < got["exact"]["bytes_sent"] / 4
        assert all(row["seconds_per_step"] > 0 for row in record["results"])


def test_gather_reduction_equals_ring_average():
    def both(comm):
        x = torch.randn(37, generator=torch.Generator().manual_seed(comm.rank))
        return gather_reduce_(comm, x.clone()), comm.allreduce_(x.clone(), "mean")

    for gathered, ring in LocalCluster(topologies.ring(5)).run(both):
        torch.testing.assert_close(gathered, ring)


def test_slope_recovers_exponents():
    assert slope([(1, 3.0), (10, 300.0), (100, 30000.0)]) == pytest.approx(2.0)
    assert slope([(8, 5.0), (256, 5.0)]) == pytest.approx(0.0)
    assert slope([(8, 5.0)]) is None


def test_quick_page_has_every_section_and_marks_points_that_took_turns(quick_sweep):
    sweep = quick_sweep("bench_scale")
    tmp_path = sweep.out
    assert sweep.code == 0
    page = (tmp_path / "bench_scale.md").read_text()
    records = [r.row for r in RowFile(tmp_path / "bench_scale.jsonl").read().values()]
    assert not [r for r in records if "error" in r]
    for heading in (
        "## Cost vs number of peers",
        "## Ring all-reduce vs the all-gather reduction",
        "## Cost vs model size",
        "## Growth rates",
    ):
        assert heading in page
    # each in-process point records whether its threads took turns, and the page marks those
    turns = [r["point"]["peers"] > os.cpu_count() for r in records]
    assert [r["ranks"][0]["takes_turns"] for r in records] == turns
    assert ("‡ the peer threads took turns" in page) == any(turns)
    assert set(summarize(records[0])) == set(KINDS)
