"""`python -m experiments long_run`: many PowerGossip steps on 100x100 N(0,1) matrices (seeded
42 + rank): the relative drift of the average (gossip must keep it at float rounding) and resident
memory, checked against limits, and the consensus distance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import header, machine, resident_bytes
from experiments.pages._markdown import fill, template

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Communicator

DRIFT_LIMIT = 1e-6
MEMORY_GROWTH_LIMIT = 0.05
#: The page's run, and --quick's (memory is compared from step 100 on: at least 100 steps).
SETTING = {
    False: {"topology": "ring:8", "rank": 1, "steps": 10_000, "log_every": 500},
    True: {"topology": "ring:4", "rank": 1, "steps": 100, "log_every": 50},
}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    s = SETTING[quick]
    return [Run(key=f"{s['topology']}/rank{s['rank']}/{s['steps']}steps", config=s)]


def peer(comm: Communicator, steps: int, log_every: int, rank: int) -> List[Dict[str, Any]]:
    """One peer's long run: PowerGossip steps, a record every `log_every` steps (and at 1, 100)."""
    import time

    import torch

    from gossip_powersgd import PowerGossip, consensus_distance
    from gossip_powersgd.metrics import parameter_average

    torch.set_num_threads(1)
    x = [torch.randn(100, 100, generator=torch.Generator().manual_seed(42 + comm.rank))]
    start_mean = parameter_average(x, comm)
    gossip = PowerGossip(x, comm, rank=rank)
    records, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        gossip.step()
        if step % log_every == 0 or step in (1, 100):
            mean = parameter_average(x, comm)
            drift = float((mean - start_mean).norm() / start_mean.norm())
            record = dict(step=step, consensus_distance=consensus_distance(x, comm))
            record.update(average_drift=drift, rss_bytes=resident_bytes())
            records.append(dict(record, seconds=time.perf_counter() - started))
    return records


def row(run: Run) -> Dict[str, Any]:
    """Rank 0's records, every peer a thread of this process (backend local)."""
    import topologies
    from gossip_powersgd.launch import run_peers

    c, start = run.config, machine()
    args = (c["steps"], c["log_every"], c["rank"])
    records = run_peers(topologies.parse(c["topology"]), peer, *args, backend="local")[0]
    return {"records": records, "machine_start": start, "machine_end": machine()}


def summarize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The checks: the largest drift of the average, and memory growth from step 100 to the end."""
    base = next((r for r in records if r["step"] == 100), records[0])["rss_bytes"]
    last = records[-1]["rss_bytes"]
    growth = (last - base) / base
    drift = max(r["average_drift"] for r in records)
    out = dict(drift=drift, drift_ok=drift <= DRIFT_LIMIT, rss_100=base / 1e6, rss_last=last / 1e6)
    return dict(out, growth=growth, memory_ok=growth < MEMORY_GROWTH_LIMIT)


def render(rows: Rows) -> Outputs:
    """long_run.md (its text: long_run.md beside this file) from the one run's records."""
    (record,) = rows.records
    records, s = record.row["records"], summarize(record.row["records"])
    line = "| {step} | {consensus_distance:.3e} | {average_drift:.2e} | {mb:.1f} |"
    yes = {k: "yes" if s[k] else "NO" for k in ("drift_ok", "memory_ok")}
    text = fill(
        template(__file__, "long_run.md"),
        **{**record.config, **s, **yes},
        quick=" (--quick)" if rows.quick else "",
        header=header(rows),
        seconds=records[-1]["seconds"],
        drift_limit=DRIFT_LIMIT,
        growth_pct=100 * s["growth"],
        final=records[-1]["consensus_distance"],
        records=[line.format(**r, mb=r["rss_bytes"] / 1e6) for r in records],
    )
    return {"long_run.md": text}


TITLE = "10,000 PowerGossip steps on ring:8: drift of the average and resident memory"
PAGE = register(Page("long_run", TITLE, plan=plan, row=row, render=render, serial=True))
