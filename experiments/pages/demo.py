"""`python -m experiments demo`: one run of experiments/configs/demo.yaml, every peer a thread of
this process; the page is the run's own summary.md with who made it, and its three plots in demo/.
A row made by `make demo` under mpiexec is the same run (MPI ≡ local is tested): the row says how."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping

from experiments.engine import ROOT, Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._markdown import fill, template

CONFIG = ROOT / "experiments" / "configs" / "demo.yaml"
#: The keys that say how and where a run is launched, not what it computes: not part of a row's
#: identity (the engine runs it in-process, writing nothing but its row).
LAUNCH_KEYS = ("backend", "out_dir", "checkpoint_every", "quiet")
#: --quick: the demo's shape on a problem of seconds.
QUICK = dict(topology="ring:4", dataset="synthetic_logreg:d=20,classes=4,n=2000", model="logreg")
QUICK.update(lr=0.5, momentum=0.0, weight_decay=0.0, warmup_epochs=0, epochs=2, eval_every=1)
QUICK.update(log_every=5)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """One run: demo.yaml (--quick: on a tiny problem), without its launch keys."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    if quick:
        config.update(QUICK)
    seed = config.pop("seed")
    for key in LAUNCH_KEYS:
        config.pop(key, None)
    return [Run(key="demo", config=config, seed=seed, cost=1.0)]


def row(run: Run) -> Dict[str, Any]:
    """The run's summary, its summary.md, its records (the plots' data) and how it was launched."""
    from gossip_powersgd import run as train
    from gossip_powersgd.training.report import format_summary

    config = dict(run.config, seed=run.seed, backend="local", out_dir=None, quiet=True)
    result = train(config)
    summary = dict(result.summary, provenance=dict(result.summary["provenance"]))
    return {
        "summary": summary,
        "summary_md": format_summary(summary, markdown=True),
        "records": result.history,
        "cores": os.cpu_count(),
        "launch": "`python -m experiments demo` (experiments/configs/demo.yaml, every peer a "
        "thread of one process: `gossip_powersgd.run`, backend local)",
    }


def render(rows: Rows) -> Outputs:
    """demo.md (its text: demo.md beside this file) and, from the row's records, demo/'s plots."""
    (record,) = rows.records
    data, summary = record.row, record.row["summary"]
    fields = {**summary, **data, "summary_md": data["summary_md"].strip(), "page": rows.page}
    fields.update(finished=record.finished, commit=record.commit, command=rows.command)
    fields.update(quick=" (--quick)" * rows.quick, backend=summary["provenance"]["backend"])
    outputs: Outputs = {"demo.md": fill(template(__file__, "demo.md"), **fields)}
    if data.get("records"):  # a row converted from the committed page has no records
        from gossip_powersgd.cli.plot import figures

        run = {"dir": "demo", "algorithm": summary["algorithm"], "records": data["records"]}
        outputs.update({f"demo/{name}": png for name, png in figures([run]).items()})
    return outputs


TITLE = "the demo run (demo.yaml: ring:8, MNIST-1D, CNN, PowerGossip r1, 100 epochs)"
PAGE = register(Page(name="demo", title=TITLE, plan=plan, row=row, render=render))
