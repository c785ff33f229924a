"""The CLI: `python -m experiments.privacy_attacks [--quick] [--out DIR] [--epochs N]` runs every
attacked run of the plan, then writes the page, its CSV and JSON and the plots;
`--network-only` recomputes only the network-DP section (seconds) and re-renders the page from
the rows already in the folder's privacy_attacks.json."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from gossip_powersgd.utils import atomic_write, check_writable_dir, git_commit, one_line

from . import report
from .measure import ALGORITHMS, QUICK_SETTING, SETTING, attacked_run, network_dp

ROOT = Path(__file__).resolve().parents[2]
#: The default output folder: under runs/ (git-ignored); the committed page is written only by an
#: explicit `--out experiments/results`.
DEFAULT_OUT = ROOT / "runs" / "privacy-attacks"
#: (topology, private) of the runs, every algorithm each. DP-SGD (Opacus' per-example gradients)
#: makes a run ~4x slower, so the second topology runs without DP only, to fit ~20 min on 2 cores.
PLAN = (("ring:8", False), ("ring:8", True), ("exponential:8", False))
QUICK_PLAN = (("ring:4", False), ("ring:4", True))
PRIVATE_NOTE = "on ring:8 only (DP-SGD makes a run ~4x slower; exponential:8 runs without DP)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.privacy_attacks",
                                     description="Measure what an honest-but-curious neighbour "
                                                 "learns, and write the results page.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny problem (synthetic data, ring:4, 2 epochs), seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default runs/privacy-attacks, or runs/privacy-attacks-quick "
                             "with --quick; the committed page: --out experiments/results)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 25)")
    parser.add_argument("--network-only", action="store_true",
                        help="recompute only the network-DP section and its heat maps; the runs' "
                             "rows come from the folder's privacy_attacks.json, unchanged")
    return parser


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_all(plan, epochs: int, quick: bool) -> List[Dict[str, Any]]:
    """Every (topology, private, algorithm) run; a failing run becomes a row saying so."""
    rows = []
    sigmas: Dict[str, float] = {}  # per topology: the σ of the target ε, found by its first private run
    for topology, private in plan:
        for name, spec in ALGORITHMS:
            _log(f"{topology} {name} DP {'on' if private else 'off'}")
            try:
                row = attacked_run(topology, spec, private, epochs, quick,
                                   sigma=sigmas.get(topology) if private else None)
                if private:
                    sigmas.setdefault(topology, row["sigma"])
            except Exception as exc:  # one failed run is a row of the page, not a lost page
                row = dict(topology=topology, spec=spec, private=private, failure=one_line(exc, 160))
                _log(f"  FAILED: {row['failure']}")
            else:
                _log(f"  AUC v/r/o/a {row['auc_victim']:.3f}/{row['auc_reconstruction']:.3f}/"
                     f"{row['auc_observer']:.3f}/{row['auc_average']:.3f}  "
                     f"{row['run_seconds']:.0f} s")
            rows.append(row)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    """Run the plan and write privacy_attacks.{md,csv,json} and the PNGs; returns the exit code."""
    from gossip_powersgd.privacy import DEFAULT_WINDOW

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        raise SystemExit("error: --epochs must be >= 1")
    out = args.out or (ROOT / "runs" / "privacy-attacks-quick" if args.quick else DEFAULT_OUT)
    try:  # now, not after the runs (minutes of them) when the page is written
        check_writable_dir(out, "choose a writable --out")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    epochs = args.epochs or (2 if args.quick else 25)
    command = " ".join(["python -m experiments.privacy_attacks", *map(shlex.quote, argv)])
    if args.network_only:
        return network_only(out, args.quick, command)
    started = time.perf_counter()
    rows = measure_all(QUICK_PLAN if args.quick else PLAN, epochs, args.quick)
    network = network_dp()
    report.plot_errors(rows, out / report.ERROR_PNG)
    report.plot_auc(rows, out / report.AUC_PNG)
    report.plot_network(network, out / report.HEATMAP_PNG)
    seconds = time.perf_counter() - started
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    generated = f"Generated by `{command}` on {date} in {seconds:.0f} s (commit {git_commit()})."
    plan = {"setting": QUICK_SETTING if args.quick else SETTING, "epochs": epochs,
            "window": DEFAULT_WINDOW,
            "private_note": "on ring:4." if args.quick else PRIVATE_NOTE}
    atomic_write(out / "privacy_attacks.md", report.page(rows, network, plan, generated))
    atomic_write(out / "privacy_attacks.csv", report.rows_csv(rows))
    atomic_write(out / "privacy_attacks.json", json.dumps(
        {"generated": generated, "plan": plan, "rows": rows, "network_dp": network},
        indent=1) + "\n")
    _log(f"wrote {out / 'privacy_attacks.md'} ({seconds:.0f} s)")
    return 0 if all("failure" not in r for r in rows) else 1


def _stamp(command: str, seconds: float) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"`{command}` on {date} in {seconds:.0f} s (commit {git_commit()})"


def network_only(out: Path, quick: bool, command: str) -> int:
    """Recompute the network-DP section and its heat maps; the runs, their CSV and their plots stay
    as the JSON's run made them (its plan, or for a JSON written before plans were stored, today's
    setting with the rows' epochs)."""
    from gossip_powersgd.privacy import DEFAULT_WINDOW

    source = out / "privacy_attacks.json"
    if not source.exists():
        raise SystemExit(f"error: --network-only needs the rows of a previous run in {source}; "
                         "run without --network-only first")
    saved = json.loads(source.read_text())
    rows = saved["rows"]
    plan = saved.get("plan") or {
        "setting": QUICK_SETTING if quick else SETTING, "window": DEFAULT_WINDOW,
        "epochs": next((r["epochs"] for r in rows if "epochs" in r), None),
        "private_note": "on ring:4." if quick else PRIVATE_NOTE}
    started = time.perf_counter()
    network = network_dp()
    report.plot_network(network, out / report.HEATMAP_PNG)
    network["generated"] = f"Section made by {_stamp(command, time.perf_counter() - started)}."
    atomic_write(out / "privacy_attacks.md", report.page(rows, network, plan, saved["generated"]))
    atomic_write(out / "privacy_attacks.json", json.dumps(
        {"generated": saved["generated"], "plan": plan, "rows": rows, "network_dp": network},
        indent=1) + "\n")
    _log(f"wrote the network-DP section of {out / 'privacy_attacks.md'}")
    return 0
