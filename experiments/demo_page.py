"""`python -m experiments.demo_page RUN_DIR --out experiments/results/demo.md`: the demo's page from
a finished `make demo` run directory (its own summary.md unchanged, its plots, and the command,
date, commit and machine that made it, read from the run's summary.json)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import List, Optional

from gossip_powersgd.utils import atomic_write

ROOT = Path(__file__).resolve().parents[1]
PLOTS = ("accuracy_vs_epoch.png", "accuracy_vs_mb.png", "consensus_vs_step.png")


def render(run: Path, plots: Path, page: Path) -> str:
    summary = json.loads((run / "summary.json").read_text())
    prov = summary["provenance"]
    commit = (prov.get("git_commit") or "unknown")[:7] + (
        " + uncommitted changes" if prov.get("git_dirty") else ""
    )
    finished = (run / "summary.json").stat().st_mtime
    date = datetime.datetime.fromtimestamp(finished, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
    rel = Path(os.path.relpath(plots, page.parent)).as_posix()
    return "\n".join(
        [
            f"# make demo: {summary['peers']} peers on {summary['topology']}, {summary['dataset']}, "
            f"{summary['model']}, {summary['algorithm']}",
            "",
            f"Command: `make demo` (= `mpiexec -n {prov['world_size']} python -m gossip_powersgd.cli.train --config "
            "experiments/configs/demo.yaml --set out_dir=RUN`, then `python -m gossip_powersgd.cli.plot RUN --out "
            f"RUN/plots`); this page by `python -m experiments.demo_page RUN --out {page_text(page)}`. "
            f"Run finished {date} at commit {commit}, backend {prov['backend']}, on "
            f"{os.cpu_count()} cores shared with other jobs (wall time below is that of a shared "
            "machine). The summary below is the run's own summary.md, unchanged.",
            "",
            (run / "summary.md").read_text().strip(),
            "",
            " ".join(f"![{name[:-4]}]({rel}/{name})" for name in PLOTS),
            "",
        ]
    )


def page_text(page: Path) -> str:
    try:
        return page.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(page)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.demo_page", description=__doc__)
    parser.add_argument("run", type=Path, help="a finished `make demo` run directory")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "runs" / "demo.md",
        help="the page (default runs/demo.md; the committed page: "
        "--out experiments/results/demo.md); its plots go to a folder beside "
        "it named after it (demo/)",
    )
    args = parser.parse_args(argv)
    plots = args.out.with_suffix("")
    plots.mkdir(parents=True, exist_ok=True)
    for name in PLOTS:
        atomic_write(plots / name, (args.run / "plots" / name).read_bytes())
    atomic_write(args.out, render(args.run, plots, args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
