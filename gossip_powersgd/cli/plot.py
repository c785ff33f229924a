"""Plot one or several training runs.

    gossip-plot RUN_DIR [RUN_DIR ...] [--out DIR]
    python -m gossip_powersgd.cli.plot ...        # the same program, without the script

Writes, atomically, into DIR (default: the run directory for one run; for several, a folder
plots-<run>-vs-<run> beside the first run, named on stderr):

    accuracy_vs_epoch.png        averaged-model test accuracy (solid) and mean local accuracy
                                 (dashed) against epochs; a run whose peers each test on
                                 their own set shares no mean: both curves are then the read
                                 file's rank's own figures, and its legend says so
    accuracy_vs_mb.png           averaged-model test accuracy against training MB sent per peer
    consensus_vs_step.png        consensus distance (log scale) against steps

Each run is one colour, labelled with its algorithm (and its directory name when two runs share an
algorithm). The curves come from one peer's `metrics/rank-K.jsonl`: every member records the same
aggregated values, so one file is enough: rank 0's, unless another peer's holds more records (a run
with churn whose rank 0 was away for part of it: its file stops where it left), then the lowest
such rank's. A run still being written may end in half a line (no newline yet): it is skipped,
said in one line on stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from gossip_powersgd.cli import program_name
from gossip_powersgd.utils import atomic_write, check_writable_dir

#: The module `python -m` runs this program as; a checkout's `experiments.plot` passes its own.
MODULE = "gossip_powersgd.cli.plot"

FIGURES = ("accuracy_vs_epoch.png", "accuracy_vs_mb.png", "consensus_vs_step.png")


def read_run(run_dir) -> Dict[str, object]:
    """{"dir", "algorithm", "records", "rank"} of a run directory (the records of
    `_fullest_metrics`, and the rank whose file it is); ValueError if it is not one."""
    run_dir = Path(run_dir)
    metrics = _fullest_metrics(run_dir)
    try:
        text = metrics.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{metrics} is not UTF-8 text (byte {exc.start}): not gossip-train's metrics"
        ) from None
    records, lines = [], text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines) and not text.endswith("\n"):  # a record being written
                print(
                    f"{metrics}:{number}: skipped a last line not yet written whole (no newline "
                    "at its end: the run is still writing it); plot again for its record",
                    file=sys.stderr,
                )
                break
            raise ValueError(f"{metrics}:{number}: not valid JSON") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{metrics}:{number}: a {type(record).__name__}, not a record (gossip-train "
                "writes one JSON object a line): delete or fix that line"
            )
        _check_record(record, f"{metrics}:{number}")
        records.append(record)
    rank = int(metrics.name[len("rank-") : -len(".jsonl")])
    algorithm = _algorithm(run_dir) or run_dir.name
    return {"dir": run_dir, "algorithm": algorithm, "records": records, "rank": rank}


#: The numbers the figures read: every eval record's, and any record's that has a consensus distance.
_EVAL_KEYS = ("epoch", "step", "mb_sent_per_peer")
_CONSENSUS_KEYS = ("step", "consensus_distance")
#: The accuracies the figures read where a record has them (`figures`' accuracy fallbacks).
_ACCURACY_KEYS = (
    "test_acc_avg_model",
    "test_acc_mean",
    "test_acc_avg_model_local",
    "test_acc_local",
)


def _check_record(record: Dict[str, object], where: str) -> None:
    """A one-line ValueError naming `where` (file:line) when `record` lacks a number the
    figures read, or holds something else than a number there (null, text)."""
    needed = [*(_EVAL_KEYS if record.get("kind") == "eval" else ())]
    needed += [k for k in _CONSENSUS_KEYS if "consensus_distance" in record]
    needed += [k for k in _ACCURACY_KEYS if k in record and record.get("kind") == "eval"]
    for key in dict.fromkeys(needed):
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            what = "no" if key not in record else f"{json.dumps(value)} as its"
            raise ValueError(
                f"{where}: a record of kind {record.get('kind')!r} with {what} {key!r}, where "
                "gossip-train writes a number: delete or fix that line"
            )


def _fullest_metrics(run_dir: Path) -> Path:
    """The metrics file holding the most records (non-blank lines ended by a newline: blank lines
    are not records, and a last line without its newline is still being written), the lowest
    rank's among equals: rank 0's in a run without churn; another member's where rank 0 was away
    for part of the run (its file stops where it left). ValueError where the run directory has
    none."""
    found = {}
    for path in (run_dir / "metrics").glob("rank-*.jsonl"):
        rank = path.name[len("rank-") : -len(".jsonl")]
        if rank.isdigit() and path.is_file():
            found[int(rank)] = path
    if not found:
        missing = run_dir / "metrics" / "rank-0.jsonl"
        raise ValueError(f"{run_dir} is not a run directory: {missing} is missing")
    records = {rank: _records(path) for rank, path in found.items()}
    return found[min(records, key=lambda rank: (-records[rank], rank))]


def _records(path: Path) -> int:
    """The records of a metrics file: its non-blank lines ended by a newline."""
    return sum(1 for line in path.read_bytes().split(b"\n")[:-1] if line.strip())


def _algorithm(run_dir: Path) -> Optional[str]:
    """The algorithm of the run's config.yaml; None where it has none or cannot be read as one."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return config.get("algorithm") if isinstance(config, dict) else None


def _labels(runs: List[Dict[str, object]]) -> List[str]:
    names = [str(r["algorithm"]) for r in runs]
    return [
        f"{name} ({Path(r['dir']).name})" if names.count(name) > 1 else name
        for name, r in zip(names, runs)
    ]


def _accuracy_labels(run: Dict[str, object], label: str) -> Tuple[str, str]:
    """The legends of a run's two accuracy-vs-epoch curves (averaged model, local models). Where
    its eval records lack the peers' figures (private statistics with each peer's own test set:
    the figures' fallbacks), both curves are the read file's rank's own: the legend says so."""
    evals = [r for r in run["records"] if r.get("kind") == "eval"]
    rank = run.get("rank")
    whose = f"rank {rank}'s" if rank is not None else "one peer's"
    averaged, local = f"{label}, averaged model", f"{label}, local mean"
    if any("test_acc_avg_model" not in r for r in evals):
        averaged += f" ({whose} test set)"
    if any("test_acc_mean" not in r for r in evals):
        local = f"{label}, {whose} own model ({whose} test set)"
    return averaged, local


def _png(fig) -> bytes:
    """The figure as PNG bytes (written atomically by the caller: a crash leaves the old or none)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    return buffer.getvalue()


def default_out(run_dirs) -> Path:
    """Where the figures go without --out: the run directory for one run; for several, a folder
    beside the first run (runs/ is git-ignored, so a checkout stays clean), named after the runs,
    e.g. runs/plots-a-vs-b."""
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) == 1:
        return dirs[0]
    name = "plots-" + "-vs-".join(d.resolve().name for d in dirs)
    if len(name) > 100:  # a file name stays short; the runs are named in the legends anyway
        name = name[:80] + f"-and-{len(dirs)}-runs"
    return dirs[0].resolve().parent / name


def plot_runs(run_dirs, out_dir=None) -> List[Path]:
    """Write the three figures for `run_dirs`; returns their paths."""
    runs = [read_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    out = Path(out_dir) if out_dir is not None else default_out([run["dir"] for run in runs])
    check_writable_dir(out, "give another --out")
    written = []
    for name, data in figures(runs).items():
        atomic_write(out / name, data)
        written.append(out / name)
    return written


def figures(runs: List[Dict[str, object]]) -> Dict[str, bytes]:
    """{file name: PNG bytes} of the three figures (`FIGURES`) of `runs`: dicts with "dir",
    "algorithm" and "records" (the eval and log records), as `read_run` returns them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _labels(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = {}

    def evals(run):
        return [r for r in run["records"] if r.get("kind") == "eval"]

    def accuracy(r, key):
        # private statistics with each peer's own test set: the read file's rank's own figure
        return 100 * r.get(key, r.get(f"{key}_local", r.get("test_acc_local", float("nan"))))

    # accuracy vs epoch
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (run, label) in enumerate(zip(runs, labels)):
        rs, color = evals(run), colors[k % len(colors)]
        averaged, local = _accuracy_labels(run, label)
        ax.plot(
            [r["epoch"] for r in rs],
            [accuracy(r, "test_acc_avg_model") for r in rs],
            "-o",
            color=color,
            ms=3,
            label=averaged,
        )
        ax.plot(
            [r["epoch"] for r in rs],
            [accuracy(r, "test_acc_mean") for r in rs],
            "--",
            color=color,
            label=local,
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    written[FIGURES[0]] = _finish(plt, fig, ax)

    # accuracy vs MB sent per peer
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (run, label) in enumerate(zip(runs, labels)):
        rs = evals(run)
        ax.plot(
            [r["mb_sent_per_peer"] for r in rs],
            [accuracy(r, "test_acc_avg_model") for r in rs],
            "-o",
            ms=3,
            color=colors[k % len(colors)],
            label=label,
        )
    ax.set_xlabel("training MB sent per peer")
    ax.set_ylabel("averaged-model test accuracy (%)")
    finals = [max((r["mb_sent_per_peer"] for r in evals(run)), default=0) for run in runs]
    finals = [f for f in finals if f > 0]
    if finals and max(finals) > 10 * min(finals):  # e.g. exact gossip next to PowerGossip
        ax.set_xscale("log")
    written[FIGURES[1]] = _finish(plt, fig, ax)

    # consensus distance vs step (eval and log records)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (run, label) in enumerate(zip(runs, labels)):
        rs = sorted(
            (r for r in run["records"] if "consensus_distance" in r), key=lambda r: r["step"]
        )
        steps = [r["step"] for r in rs]
        values = [max(r["consensus_distance"], 1e-30) for r in rs]
        ax.plot(steps, values, "-", color=colors[k % len(colors)], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("consensus distance  mean ||x_i - x̄||²")
    ax.set_yscale("log")
    written[FIGURES[2]] = _finish(plt, fig, ax)
    return written


def _finish(plt, fig, ax) -> bytes:
    """Grid, legend, PNG bytes, close: the same for every figure."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    try:
        return _png(fig)
    finally:
        plt.close(fig)


def build_parser(module: str = MODULE) -> argparse.ArgumentParser:
    """The command line of `gossip-plot`, its usage line spelled as `python -m <module>`."""
    parser = argparse.ArgumentParser(
        prog=program_name(module, "gossip-plot"), description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories to draw")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default: the run directory "
        "for one run; for several, plots-<run>-vs-<run> beside the first run)",
    )
    return parser


def run(argv: Optional[List[str]] = None, *, module: str = MODULE) -> List[Path]:
    """Parse `argv`, write the figures, print and return their paths (`python -m <module>` in the help)."""
    args = build_parser(module).parse_args(argv)
    if args.out is None and len(args.runs) > 1:
        print(
            f"writing the figures to {default_out(args.runs)} (--out DIR to choose)",
            file=sys.stderr,
        )
    written = plot_runs(args.runs, args.out)
    for path in written:
        print(path)
    return written


def main(argv: Optional[List[str]] = None, *, module: str = MODULE) -> None:
    """Console-script entry point (`gossip-plot`): one-line errors, exit status."""
    from gossip_powersgd.launch import main_guard

    main_guard(lambda: (run(argv, module=module), 0)[1])


if __name__ == "__main__":
    main()
