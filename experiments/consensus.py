"""The PowerGossip paper's consensus experiment (§5 of shared/reference/powergossip.md).

Every peer of a topology holds random tensors (N(0,1), float32, seeded 42 + rank) and the peers only
gossip — no training — so the error, the mean over peers of ||x_i - x_bar||^2_F
(`consensus_distance`), measures how fast an algorithm averages per step and per bit sent.

    python -m experiments.consensus                                   # ring:8, 100x100, exact + PowerGossip
    python -m experiments.consensus --sweep                           # + Choco / DeepSqueeze, gamma swept
    python -m experiments.consensus --topology torus:4x4 --problem cnn --sweep
    python -m experiments.consensus --algorithms exact "choco:compressor=sign,gamma=0.1"
    mpiexec -n 8 python -m experiments.consensus --backend mpi        # one peer per rank, same numbers
    python -m experiments.consensus --report                          # experiments/results/consensus.md

Problems: `matrix` (one 100x100 matrix per peer; `matrix:20` or `matrix:20x30` for other sizes) and
`cnn` (tensors shaped like the parameters of the MNIST-1D `cnn1d` model, channels 32, input length
40: conv (32,1,5), (32,32,5), (32,32,5), their biases, linear (10,128) and its bias).

Bits per peer are 8 x the transport's count of training bytes (`comm.stats.bytes_sent`), never a
formula. Exact gossip and PowerGossip use the topology's gamma (no tuning); Choco and DeepSqueeze
need a tuned gamma: give it in the spec or pass `--sweep` to run every value of `--gammas`, and the
budget table then reports, for every bit budget, the best gamma's error. `topk:matched` is top-k with
k matched to PowerGossip rank 1's floats per message on this problem (measured, e.g. 0.01 for a
100x100 matrix); top-k also sends int32 indices, which the transport counts.

Outputs, written atomically into --out (default runs/consensus/<topology>_<problem>; the report's
go to experiments/results/consensus/<topology>_<problem>):
`runs/<run>.jsonl` (one row per recorded step: step, bits_per_peer, error), `table.csv` (every
run's error at every budget, best gamma marked), `summary.json`, `error_vs_bits.png` and
`error_vs_steps.png` (one line per algorithm, at its best gamma). The error is recorded at all early
steps, on a geometric grid after, and at the last step within each budget, which is what the table
reports: the error of the last step whose cumulative bits per peer are <= the budget, "—" if the
algorithm's first step already exceeds it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
DEFAULT_OUT = RESULTS / "consensus"
#: Plain runs write here (git-ignored), so that they never overwrite the report's committed data.
SCRATCH_OUT = ROOT / "runs" / "consensus"
REPORT_PATH = RESULTS / "consensus.md"

BUDGETS = (1e5, 1e6, 1e7)
#: 8 values, log-uniform from 1e-3 to 1 (rounded to 3 significant digits).
DEFAULT_GAMMAS = tuple(float(f"{10 ** (-3 + 3 * k / 7):.3g}") for k in range(8))
SEED_BASE = 42
#: A run stops as diverged once its error exceeds this multiple of the initial error.
DIVERGE_FACTOR = 1e4
#: Without --steps, a run goes until it has sent more than the largest budget, at most this long.
STEP_CAP = 100_000

UNTUNED = (
    "exact",
    "powergossip:rank=1,iters=1,warm=true",
    "powergossip:rank=2,iters=1,warm=true",
    "powergossip:rank=4,iters=1,warm=true",
    "powergossip:rank=1,iters=1,warm=false",
)
BASELINES = (
    "choco:compressor=sign",
    "choco:compressor=topk:matched",
    "choco:compressor=lowrank:1",
    "deepsqueeze:compressor=sign",
    "deepsqueeze:compressor=topk:matched",
    "deepsqueeze:compressor=lowrank:1",
)
TUNED_NAMES = ("choco", "deepsqueeze")

# (topology, problem) pairs of the report, in order.
REPORT_CONFIGS = (("ring:8", "matrix"), ("ring:8", "cnn"), ("torus:4x4", "matrix"), ("torus:4x4", "cnn"))


# --------------------------------------------------------------------------------------------------
# problems


def cnn1d_shapes(channels: int = 32, length: int = 40, classes: int = 10, kernel: int = 5) -> List[Tuple[int, ...]]:
    """Parameter shapes of MNIST-1D's cnn1d: 3 x Conv1d(k=5, stride 2, padding 1), then Linear."""
    shapes: List[Tuple[int, ...]] = []
    c_in = 1
    for _ in range(3):
        shapes += [(channels, c_in, kernel), (channels,)]
        length = (length + 2 - kernel) // 2 + 1
        c_in = channels
    shapes += [(classes, channels * length), (classes,)]
    return shapes


def problem_shapes(problem: str) -> List[Tuple[int, ...]]:
    """`matrix` (100x100), `matrix:N`, `matrix:RxC`, or `cnn` -> the list of tensor shapes."""
    name, _, arg = problem.strip().lower().partition(":")
    if name == "matrix":
        if not arg:
            return [(100, 100)]
        match = re.fullmatch(r"(\d+)(?:x(\d+))?", arg)
        if not match:
            raise ValueError(f"problem {problem!r}: expected matrix, matrix:N or matrix:RxC")
        rows = int(match.group(1))
        cols = int(match.group(2) or rows)
        if rows < 1 or cols < 1:
            raise ValueError(f"problem {problem!r}: sizes must be >= 1")
        return [(rows, cols)]
    if name == "cnn" and not arg:
        return cnn1d_shapes()
    raise ValueError(f"unknown problem {problem!r}; valid: matrix, matrix:N, matrix:RxC, cnn")


def make_problem(problem: str, rank: int, dtype=torch.float32) -> List[torch.Tensor]:
    """Peer `rank`'s tensors: N(0,1) entries from a CPU generator seeded SEED_BASE + rank."""
    generator = torch.Generator(device="cpu").manual_seed(SEED_BASE + rank)
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
            for shape in problem_shapes(problem)]


# --------------------------------------------------------------------------------------------------
# one run


def eval_steps(max_steps: int, dense: int = 20, ratio: float = 1.06, max_gap: int = 20) -> set:
    """Steps at which the error is recorded (besides budget boundaries and the last step):
    every step up to `dense`, then a geometric grid with gaps of at most `max_gap` steps."""
    steps = set(range(0, min(dense, max_steps) + 1))
    value = float(dense)
    while value < max_steps:
        value = min(value * ratio, value + max_gap)
        steps.add(min(int(round(value)), max_steps))
    return steps


def _regular(topology) -> bool:
    return len({len(topology.neighbors(i)) for i in range(topology.size)}) == 1


def consensus_curve(comm, problem: str, spec: str, max_steps: int, max_bits: float,
                    budgets: Sequence[float] = BUDGETS, diverge_factor: float = DIVERGE_FACTOR) -> Dict:
    """Run one algorithm on one peer of the consensus problem (collective: every peer calls it).

    Returns {"history": [{"step", "bits_per_peer", "error"}, ...], "stop": why it stopped,
    "seconds": wall time}. Every peer returns the same history. The run stops after the first
    step whose cumulative bits per peer exceed `max_bits`, after `max_steps` steps, or once the
    error is not finite or above `diverge_factor` x the initial error ("diverged").
    """
    from gossip_powersgd import consensus_distance, make_algorithm

    start = time.perf_counter()
    tensors = make_problem(problem, comm.rank)
    algorithm = make_algorithm(spec, tensors, comm)
    regular = _regular(comm.topology)
    bytes0 = comm.stats.bytes_sent

    def bits_now() -> float:
        own = float(8 * (comm.stats.bytes_sent - bytes0))
        if regular:  # every peer sends as much (same algorithm, same degree): no collective needed
            return own
        return float(comm.allreduce_(torch.tensor([own], dtype=torch.float64), op="mean", metric=True))

    schedule = eval_steps(max_steps)
    ordered = sorted(float(b) for b in budgets)
    error0 = consensus_distance(tensors, comm)
    history = [{"step": 0, "bits_per_peer": 0.0, "error": error0}]
    previous = [t.detach().clone() for t in tensors]
    previous_bits, stop = 0.0, "max_steps"
    for step in range(1, max_steps + 1):
        for saved, t in zip(previous, tensors):
            saved.copy_(t)
        algorithm.step()
        bits = bits_now()
        # The previous step was the last one within a budget: record it (from the saved copy).
        crossed = any(previous_bits <= b < bits for b in ordered)
        if crossed and step > 1 and history[-1]["step"] != step - 1:
            history.append({"step": step - 1, "bits_per_peer": previous_bits,
                            "error": consensus_distance(previous, comm)})
        last = step == max_steps or bits > max_bits
        if step in schedule or last:
            error = consensus_distance(tensors, comm)
            history.append({"step": step, "bits_per_peer": bits, "error": error})
            if not math.isfinite(error) or error > diverge_factor * error0:
                stop = "diverged"
                break
        if bits > max_bits:
            stop = "max_bits"
            break
        previous_bits = bits
    if regular and comm.size > 1:  # check the no-collective shortcut: all peers counted the same
        own = torch.tensor([float(comm.stats.bytes_sent - bytes0)], dtype=torch.float64)
        low = comm.allreduce_(own.clone(), op="min", metric=True)
        high = comm.allreduce_(own.clone(), op="max", metric=True)
        if float(low) != float(high):
            raise RuntimeError(f"{spec}: peers of a regular topology sent different byte counts "
                               f"({float(low):.0f} .. {float(high):.0f})")
    return {"history": history, "stop": stop, "seconds": time.perf_counter() - start,
            "bytes_sent": comm.stats.bytes_sent - bytes0}


def _check_same(results: List[Dict], spec: str) -> Dict:
    first = results[0]["history"]
    for rank, other in enumerate(results[1:], 1):
        if other["history"] != first:
            raise RuntimeError(f"{spec}: peer {rank} recorded a different history than peer 0")
    return results[0]


class Runner:
    """Runs one spec on every peer, through a LocalCluster or this MPI job's communicator."""

    def __init__(self, topology, backend: str):
        self.topology = topology
        self.backend = backend
        self.comm = None
        if backend == "mpi":
            from gossip_powersgd import MPICommunicator

            self.comm = MPICommunicator(topology)

    @property
    def is_root(self) -> bool:
        return self.comm is None or self.comm.rank == 0

    def __call__(self, fn, *args):
        if self.comm is not None:
            return fn(self.comm, *args)
        from gossip_powersgd import LocalCluster

        results = LocalCluster(self.topology).run(fn, *args)
        return _check_same(results, str(args[1])) if fn is consensus_curve else results[0]


def _matched_ratio(comm, problem: str) -> float:
    """Top-k ratio matching PowerGossip rank 1's floats per message: measured over 2 steps."""
    from gossip_powersgd import make_algorithm

    tensors = make_problem(problem, comm.rank)
    algorithm = make_algorithm("powergossip:rank=1,iters=1,warm=true", tensors, comm)
    bytes0, messages0 = comm.stats.bytes_sent, comm.stats.messages_sent
    for _ in range(2):
        algorithm.step()
    messages = comm.stats.messages_sent - messages0
    if messages == 0:
        return 1.0
    floats = (comm.stats.bytes_sent - bytes0) / messages / tensors[0].element_size()
    return float(f"{floats / sum(t.numel() for t in tensors):.4g}")


# --------------------------------------------------------------------------------------------------
# specs, labels, budgets


def split(spec: str) -> Tuple[str, Dict[str, str]]:
    from gossip_powersgd.algorithms.registry import split_spec

    return split_spec(spec)


def label_of(spec: str) -> str:
    """A short legend label: "exact gossip", "PowerGossip r1", "Choco sign", ... (gamma left out)."""
    name, options = split(spec)
    if name == "exact":
        return "exact gossip"
    if name == "powergossip":
        text = f"PowerGossip r{options.get('rank', '1')}"
        if options.get("iters", "1") != "1":
            text += f" K{options['iters']}"
        if options.get("warm", "true").lower() in ("0", "false", "no", "off"):
            text += " restart"
        return text
    if name in TUNED_NAMES:
        pretty = {"choco": "Choco", "deepsqueeze": "DeepSqueeze"}[name]
        compressor = options.get("compressor", "?")
        compressor = {"sign": "sign"}.get(compressor, compressor.replace(":", " "))
        return f"{pretty} {compressor}"
    rest = ",".join(f"{k}={v}" for k, v in options.items() if k != "gamma")
    return f"{name} {rest}".strip()


def gamma_of(spec: str, topology) -> Optional[float]:
    name, options = split(spec)
    value = options.get("gamma")
    if value is None or value.lower() in ("none", "auto", "default"):
        return None if name in TUNED_NAMES else float(topology.gamma)
    return float(value)


def with_option(spec: str, key: str, value: str) -> str:
    name, options = split(spec)
    options[key] = value
    return name + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def expand(specs: Sequence[str], sweep: bool, gammas: Sequence[float], ratio: Optional[float]) -> List[Dict]:
    """The runs to make: [{"label", "spec", "swept"}]; `topk:matched` resolved to `ratio`."""
    runs = []
    for spec in specs:
        if "topk:matched" in spec:
            spec = spec.replace("topk:matched", f"topk:{ratio:g}")
        name, options = split(spec)
        label = label_of(spec)
        if name in TUNED_NAMES and "gamma" not in options:
            if not sweep:
                raise ValueError(f"{spec!r} needs a tuned gamma: add gamma=... to the spec or pass "
                                 "--sweep to try every value of --gammas")
            runs += [{"label": label, "spec": with_option(spec, "gamma", f"{g:g}"), "swept": True}
                     for g in gammas]
        else:
            runs.append({"label": label, "spec": spec, "swept": False})
    labels = [r["spec"] for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError("the same algorithm spec is given twice")
    return runs


def budget_rows(history: Sequence[Dict], budgets: Sequence[float] = BUDGETS) -> Dict[float, Dict]:
    """For each budget: {"status": "ok", "row": the last row with bits_per_peer <= budget} when
    the run went past the budget; {"status": "—"} when its first step already exceeds it;
    {"status": "not reached"} when the history ends within the budget (stopped early)."""
    out = {}
    steps = [r for r in history if r["step"] >= 1]
    for budget in budgets:
        if not steps or steps[0]["step"] != 1:
            raise ValueError("history must record step 1")
        if steps[0]["bits_per_peer"] > budget:
            out[budget] = {"status": "—"}
        elif steps[-1]["bits_per_peer"] <= budget:
            out[budget] = {"status": "not reached"}
        else:
            row = max((r for r in steps if r["bits_per_peer"] <= budget), key=lambda r: r["step"])
            out[budget] = {"status": "ok", "row": row}
    return out


def cells_for(history: Sequence[Dict], budgets: Sequence[float], stop: str, stage: str) -> Dict[float, Dict]:
    """`budget_rows`, with "not reached" refined: "diverged" (stopped as diverged) or "screened out"
    (a sweep's screening run that was not picked for the full length)."""
    cells = budget_rows(history, budgets)
    for budget, cell in cells.items():
        if cell["status"] == "not reached" and stop == "diverged":
            cells[budget] = {"status": "diverged"}
        elif cell["status"] == "not reached" and stage == "screen" and stop == "max_bits":
            cells[budget] = {"status": "screened out"}
    return cells


def summarize(results: Sequence[Dict], budgets: Sequence[float]) -> Dict[str, Dict]:
    """Per label: for each budget the best run (lowest error among the runs that reached it and
    had not diverged by then), and the run to plot (best at the largest budget any run reached)."""
    table: Dict[str, Dict] = {}
    for result in results:
        entry = table.setdefault(result["label"], {"runs": [], "budgets": {}, "swept": result["swept"]})
        entry["runs"].append(result)
    for label, entry in table.items():
        for budget in budgets:
            best = None
            statuses = set()
            for result in entry["runs"]:
                cell = result["budgets"][budget]
                statuses.add(cell["status"])
                if cell["status"] == "ok" and math.isfinite(cell["row"]["error"]):
                    if best is None or cell["row"]["error"] < best["row"]["error"]:
                        best = {**cell, "gamma": result["gamma"], "spec": result["spec"]}
            if best is None:
                status = "—" if statuses == {"—"} else ("diverged" if statuses == {"diverged"}
                                                        else "not reached")
                best = {"status": status}
            entry["budgets"][budget] = best
        plotted = None
        for budget in sorted(budgets, reverse=True):
            if entry["budgets"][budget]["status"] == "ok":
                plotted = entry["budgets"][budget]["spec"]
                break
        entry["plot_spec"] = plotted or entry["runs"][0]["spec"]
    return table


# --------------------------------------------------------------------------------------------------
# files


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_")


def run_file(spec: str) -> str:
    return slug(spec.replace(":", "_").replace(",", "_")) + ".jsonl"


def history_jsonl(history: Sequence[Dict]) -> str:
    return "".join(json.dumps({"step": r["step"], "bits_per_peer": r["bits_per_peer"],
                               "error": r["error"]}) + "\n" for r in history)


def fmt_err(value: float) -> str:
    return f"{value:.3g}"


def fmt_gamma(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.4g}"


def budget_name(budget: float) -> str:
    exponent = math.log10(budget)
    return f"1e{int(exponent)}" if exponent == int(exponent) else f"{budget:g}"


def cell_text(cell: Dict, swept: bool) -> str:
    if cell["status"] != "ok":
        return cell["status"]
    text = fmt_err(cell["row"]["error"])
    return f"{text} (γ={fmt_gamma(cell['gamma'])})" if swept else text


def format_table(summary: Dict[str, Dict], budgets: Sequence[float], markdown: bool = False) -> str:
    """The error reached at each bit budget (per peer), one row per algorithm."""
    header = ["algorithm", "γ"] + [f"≤ {budget_name(b)} bits" for b in budgets]
    rows = []
    for label, entry in summary.items():
        gammas = {r["gamma"] for r in entry["runs"]}
        gamma = "swept (best per budget)" if entry["swept"] else fmt_gamma(next(iter(gammas)))
        rows.append([label, gamma] + [cell_text(entry["budgets"][b], entry["swept"]) for b in budgets])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[k])) for r in rows + [header]) for k in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def table_csv(results: Sequence[Dict], summary: Dict[str, Dict], budgets: Sequence[float],
              topology: str, problem: str) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["topology", "problem", "algorithm", "spec", "gamma", "budget_bits", "status",
                     "step", "bits_per_peer", "error", "best"])
    for result in results:
        for budget in budgets:
            cell = result["budgets"][budget]
            best = summary[result["label"]]["budgets"][budget]
            is_best = best.get("spec") == result["spec"]
            row = cell.get("row", {})
            writer.writerow([topology, problem, result["label"], result["spec"], result["gamma"],
                             f"{budget:g}", cell["status"], row.get("step", ""),
                             row.get("bits_per_peer", ""), row.get("error", ""), int(is_best)])
    return buffer.getvalue()


def plot(summary: Dict[str, Dict], results: Sequence[Dict], out: Path, title: str,
         budgets: Sequence[float] = ()) -> List[Path]:
    """error_vs_bits.png (log-log) and error_vs_steps.png (semilog-y), one line per algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_spec = {r["spec"]: r for r in results}
    paths = []
    for name, xkey, xlabel, logx in (("error_vs_bits.png", "bits_per_peer", "bits sent per peer", True),
                                      ("error_vs_steps.png", "step", "steps", False)):
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for k, (label, entry) in enumerate(summary.items()):
            result = by_spec[entry["plot_spec"]]
            rows = [r for r in result["history"] if (r[xkey] > 0 or not logx) and r["error"] > 0]
            if not rows:
                continue
            legend = label + (f" (γ={fmt_gamma(result['gamma'])})" if entry["swept"] else "")
            style = "-" if label.startswith(("PowerGossip", "exact")) else "--"
            ax.plot([r[xkey] for r in rows], [r["error"] for r in rows], style, label=legend,
                    color=f"C{k % 10}", linewidth=1.4)
        ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
            for budget in budgets:
                ax.axvline(budget, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("error: mean over peers of ‖x_i − x̄‖²")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
        path = out / name
        tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
        try:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
            os.replace(tmp, path)
        finally:
            plt.close(fig)
            if tmp.exists():
                tmp.unlink()
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------------
# the experiment


def default_out(topology: str, problem: str, base: Path = SCRATCH_OUT) -> Path:
    return base / f"{slug(topology.replace(':', ''))}_{slug(problem.replace(':', ''))}"


def run_experiment(topology: str = "ring:8", problem: str = "matrix", algorithms: Optional[Sequence[str]] = None,
                   steps: Optional[int] = None, backend: str = "local", out: Optional[Path] = None,
                   sweep: bool = False, gammas: Sequence[float] = DEFAULT_GAMMAS,
                   budgets: Sequence[float] = BUDGETS, weights: str = "uniform",
                   max_bits: Optional[float] = None, sweep_bits: Optional[float] = None,
                   finalists: int = 2, log=print, write: bool = True, plots: bool = True,
                   command: Optional[str] = None) -> Dict:
    """Run every algorithm (every gamma when sweeping); write the outputs; return the summary.

    Sweeping is two-stage when `sweep_bits` (default: the second largest budget) is below
    `max_bits` (default: the largest budget): every gamma runs until it exceeds `sweep_bits`, then
    the `finalists` best gammas at `sweep_bits` are rerun to `max_bits`. So the table's columns up
    to `sweep_bits` are the best over the whole grid, the others the best over the finalists.

    Under `backend="mpi"` this is collective (every rank calls it, rank 0 writes and logs).
    """
    import topologies

    torch.set_num_threads(1)
    topo = topologies.parse(topology, weights=weights)
    problem_shapes(problem)  # validate before anything runs
    budgets = tuple(sorted(float(b) for b in budgets))
    max_bits = float(max_bits if max_bits is not None else budgets[-1])
    max_steps = int(steps) if steps else STEP_CAP
    if algorithms is None:
        algorithms = UNTUNED + (BASELINES if sweep else ())
    out = Path(out) if out is not None else default_out(topology, problem)
    runner = Runner(topo, backend)
    say = log if runner.is_root else (lambda *a, **k: None)
    started = time.perf_counter()
    ratio = runner(_matched_ratio, problem) if any("topk:matched" in a for a in algorithms) else None
    plan = expand(algorithms, sweep, gammas, ratio)
    say(f"consensus: {topology} (weights={weights}, γ={topo.gamma:.4g}), problem {problem}, "
        f"backend {backend}, {len(plan)} runs" + (f", top-k matched ratio {ratio:g}" if ratio else ""))
    screen_bits = float(sweep_bits) if sweep_bits is not None else (budgets[-2] if len(budgets) > 1 else max_bits)
    screening = any(item["swept"] for item in plan) and screen_bits < max_bits and finalists > 0
    counter = {"k": 0, "total": len(plan)}

    def one(item: Dict, bits_limit: float, stage: str) -> Dict:
        outcome = runner(consensus_curve, problem, item["spec"], max_steps, bits_limit, budgets)
        history = outcome["history"]
        cells = cells_for(history, budgets, outcome["stop"], stage)
        result = {**item, "gamma": gamma_of(item["spec"], topo), "history": history, "stage": stage,
                  "stop": outcome["stop"], "seconds": outcome["seconds"], "budgets": cells,
                  "steps": history[-1]["step"], "bits_per_peer": history[-1]["bits_per_peer"],
                  "file": run_file(item["spec"])}
        counter["k"] += 1
        say(f"  [{counter['k']:2d}/{counter['total']}] {stage:<6s} {item['spec']:<46s} {result['steps']:6d} steps "
            f"{result['bits_per_peer']:10.4g} bits  error {fmt_err(history[-1]['error']):>9s}  "
            f"{outcome['stop']:<9s} {outcome['seconds']:6.1f} s")
        return result

    results = []
    for item in plan:
        stage = "screen" if screening and item["swept"] else "full"
        results.append(one(item, screen_bits if stage == "screen" else max_bits, stage))
    if screening:
        # Rerun to the full length the `finalists` gammas of each swept algorithm that are best at the
        # screening budget (diverged ones excluded); the others keep their screening curves.
        labels = list(dict.fromkeys(r["label"] for r in results if r["stage"] == "screen"))
        chosen = []
        for label in labels:
            ranked = sorted((r for r in results if r["label"] == label and r["stage"] == "screen"
                             and r["stop"] != "diverged"),
                            key=lambda r: budget_rows(r["history"], [screen_bits])[screen_bits]
                            .get("row", {"error": math.inf})["error"])
            chosen += ranked[:finalists]
        counter["total"] += len(chosen)
        for result in chosen:
            results[results.index(result)] = one({k: result[k] for k in ("label", "spec", "swept")},
                                                 max_bits, "full")
    summary = summarize(results, budgets)
    seconds = time.perf_counter() - started
    table = format_table(summary, budgets)
    say(f"\nerror at bit budgets (per peer), {topology} {problem}, {seconds:.0f} s:\n{table}\n")
    record = {"topology": topology, "weights": weights, "gamma_topology": topo.gamma, "problem": problem,
              "backend": backend, "budgets": list(budgets), "gammas": list(gammas), "sweep": sweep,
              "topk_ratio": ratio, "max_bits": max_bits, "max_steps": max_steps, "seconds": seconds,
              "screen_bits": screen_bits if screening else None, "finalists": finalists if screening else None,
              "out": str(out), "results": results, "summary": summary, "table": table,
              "command": command or "python -m experiments.consensus " + " ".join(map(shlex.quote, sys.argv[1:]))}
    if write and runner.is_root:
        write_outputs(record, out, plots)
    return record


def load_record(out: Path) -> Dict:
    """The record `run_experiment` returned, rebuilt from the files it wrote into `out`."""
    out = Path(out)
    saved = json.loads((out / "summary.json").read_text())
    budgets = tuple(float(b) for b in saved["budgets"])
    results = []
    for run in saved["runs"]:
        rows = [json.loads(line) for line in (out / "runs" / run["file"]).read_text().splitlines() if line]
        results.append({**run, "history": rows,
                        "budgets": cells_for(rows, budgets, run["stop"], run.get("stage", "full"))})
    summary = summarize(results, budgets)
    if "finished" not in saved:
        mtime = (out / "summary.json").stat().st_mtime
        saved["finished"] = datetime.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M")
    return {**saved, "budgets": list(budgets), "out": str(out), "results": results, "summary": summary,
            "table": format_table(summary, budgets)}


def write_outputs(record: Dict, out: Path, plots: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for result in record["results"]:
        atomic_write(out / "runs" / result["file"], history_jsonl(result["history"]))
    atomic_write(out / "table.csv", table_csv(record["results"], record["summary"], record["budgets"],
                                              record["topology"], record["problem"]))
    light = {k: v for k, v in record.items() if k not in ("results", "summary", "table", "out")}
    light["finished"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    light["runs"] = [{k: r[k] for k in ("label", "spec", "gamma", "swept", "stage", "stop", "steps",
                                         "bits_per_peer", "seconds", "file")} for r in record["results"]]
    light["best"] = {label: {f"{b:g}": {k: v for k, v in cell.items() if k != "status"} | {"status": cell["status"]}
                             for b, cell in entry["budgets"].items()}
                     for label, entry in record["summary"].items()}
    atomic_write(out / "summary.json", json.dumps(light, indent=1) + "\n")
    if plots:
        plot(record["summary"], record["results"], out,
             f"{record['topology']} (W={record['weights']}), {record['problem']}: consensus error",
             record["budgets"])


# --------------------------------------------------------------------------------------------------
# report


def _headline(record: Dict) -> List[str]:
    """Data-driven comparison lines at each budget: the best PowerGossip against exact gossip, the
    best tuned baseline, and the best baseline whose compressor has PowerGossip's float count
    (top-k, low rank)."""
    lines = []
    summary = record["summary"]
    error0 = record["results"][0]["history"][0]["error"]

    def ratio(e_pg: float, e_other: float) -> str:
        if max(e_pg, e_other) < 1e-9 * error0:
            return "both at the float32 rounding floor"
        return (f"PowerGossip's error is {e_other / e_pg:.3g}× lower" if e_pg < e_other
                else f"PowerGossip's error is {e_pg / e_other:.3g}× higher")

    for budget in record["budgets"]:
        def best(prefixes, exclude=()):
            cells = [(label, e["budgets"][budget]) for label, e in summary.items()
                     if label.startswith(prefixes) and not any(x in label for x in exclude)
                     and e["budgets"][budget]["status"] == "ok"]
            return min(cells, key=lambda c: c[1]["row"]["error"]) if cells else None

        pg = best(("PowerGossip",))
        if pg is None:
            continue
        e_pg = pg[1]["row"]["error"]
        parts = [f"best PowerGossip ({pg[0]}) {fmt_err(e_pg)}"]
        verdicts = []
        exact = best(("exact",))
        if exact is not None:
            parts.append(f"exact gossip {fmt_err(exact[1]['row']['error'])}")
            verdicts.append(f"vs exact gossip: {ratio(e_pg, exact[1]['row']['error'])}")
        for name, found in (("best tuned baseline", best(("Choco", "DeepSqueeze"))),
                            ("best top-k / low-rank baseline", best(("Choco", "DeepSqueeze"), ("sign",)))):
            if found is not None:
                parts.append(f"{name} ({found[0]}, γ={fmt_gamma(found[1]['gamma'])}) "
                             f"{fmt_err(found[1]['row']['error'])}")
                verdicts.append(f"vs {name}: {ratio(e_pg, found[1]['row']['error'])}")
        lines.append(f"- ≤ {budget_name(budget)} bits per peer: " + " · ".join(parts) + ". "
                     + "; ".join(verdicts) + ".")
    return lines


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _edge_notes(record: Dict) -> List[str]:
    """Swept algorithms whose best gamma at the largest budget is an end of the grid."""
    grid = record["gammas"]
    lines = []
    for label, entry in record["summary"].items():
        cell = entry["budgets"][record["budgets"][-1]]
        if entry["swept"] and cell["status"] == "ok" and cell["gamma"] in (min(grid), max(grid)):
            side = "largest" if cell["gamma"] == max(grid) else "smallest"
            lines.append(f"- {label}: the best γ at ≤ {budget_name(record['budgets'][-1])} bits is the "
                         f"grid's {side} value ({fmt_gamma(cell['gamma'])}); a γ beyond the grid might do better.")
    return lines


def write_report(records: Sequence[Dict], command: str, seconds: float, path: Path = REPORT_PATH,
                 date: Optional[str] = None, note: str = "") -> Path:
    """experiments/results/consensus.md from the records of `run_experiment` (or `load_record`)."""
    backends = sorted({r["backend"] for r in records})
    lines = [
        "# Consensus experiment (PowerGossip paper §5)",
        "",
        f"Command: `{command}`{note}  ",
        f"Date: {date or datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} · commit {_git_commit()} · "
        f"backend: {', '.join(backends)} ({'LocalCluster, one thread per peer' if backends == ['local'] else 'MPI'}), "
        f"torch threads 1 · running time {seconds / 60:.1f} min on {os.cpu_count()} shared cores "
        f"({platform.machine()})",
        "",
        "Every peer holds N(0,1) float32 tensors seeded 42 + rank and only gossips. Error = mean over "
        "peers of ‖x_i − x̄‖²_F (`consensus_distance`, float64). Bits per peer = 8 × the transport's "
        "`comm.stats.bytes_sent` (top-k's int32 indices and sign's scale included). Mixing weights "
        "W = uniform (1/(degree+1)). Exact gossip and PowerGossip use the topology's γ "
        "(2/(λmin+λmax) of I−W), untuned. Choco and DeepSqueeze are swept over "
        f"γ ∈ {{{', '.join(fmt_gamma(g) for g in records[0]['gammas'])}}}"
        + (f" in two stages to keep the running time modest: every γ runs until it has sent "
           f"{budget_name(records[0]['screen_bits'])} bits per peer, then the {records[0]['finalists']} "
           f"best γ at that budget are rerun to {budget_name(records[0]['max_bits'])} bits. Each budget "
           f"column shows the best γ's error at that budget (γ given per cell): over the whole grid up "
           f"to {budget_name(records[0]['screen_bits'])} bits, over the finalists beyond. "
           if records[0].get("screen_bits") else
           " with full-length runs; each budget column shows the best γ's error at that budget (γ "
           "given per cell). ")
        + "A run stops after the first step that exceeds the largest budget, or as *diverged* once its "
        f"error exceeds {DIVERGE_FACTOR:g}× the initial error. A cell is the error of the last step "
        "whose cumulative bits per peer are ≤ the budget; \"—\" when the first step already exceeds "
        "it. The plots show each algorithm at the γ that is best at the largest budget.",
        "",
        "Top-k keeps k matched to PowerGossip rank 1's floats per message (measured from its traffic: "
        "the ratio is given per section); it also sends k int32 indices, so it costs twice the bits "
        "of PowerGossip rank 1 per step. `lowrank:1` is a rank-1 approximation by one power "
        "iteration from a fresh random start each round (not an exact SVD).",
        "",
    ]
    for record in records:
        rel = Path(record["out"]).resolve().relative_to(path.parent.resolve())
        steps_note = ", ".join(f"{r['label']}{' γ=' + fmt_gamma(r['gamma']) if r['swept'] else ''}: "
                               f"{r['steps']}" for r in record["results"] if not r["swept"])
        lines += [
            f"## {record['topology']}, {record['problem']} "
            f"({len(problem_shapes(record['problem']))} tensor(s), "
            f"{sum(math.prod(s) for s in problem_shapes(record['problem']))} floats per peer)",
            "",
            f"γ (topology) = {record['gamma_topology']:.4g}"
            + (f" · top-k ratio {record['topk_ratio']:g}" if record["topk_ratio"] else "")
            + f" · {len(record['results'])} runs in {record['seconds']:.0f} s · steps run: {steps_note}",
            "",
            format_table(record["summary"], record["budgets"], markdown=True),
            "",
            *_headline(record),
            *_edge_notes(record),
            "",
            f"![error vs bits]({rel.as_posix()}/error_vs_bits.png) "
            f"![error vs steps]({rel.as_posix()}/error_vs_steps.png)",
            "",
            f"Data: [`{rel.as_posix()}/table.csv`]({rel.as_posix()}/table.csv) (every γ at every budget), "
            f"`{rel.as_posix()}/runs/*.jsonl` (curves), `{rel.as_posix()}/summary.json`.",
            "",
        ]
    atomic_write(path, "\n".join(lines))
    return path


# --------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.consensus",
                                     description=__doc__.split("\n\n")[0].replace("\n", " "),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="ring:8", help="topology spec (default ring:8)")
    parser.add_argument("--weights", default="uniform",
                        help="mixing weights: uniform (the paper's 1/3 on a ring), metropolis, ...")
    parser.add_argument("--problem", default="matrix", help="matrix (100x100), matrix:N, matrix:RxC or cnn")
    parser.add_argument("--algorithms", nargs="+", metavar="SPEC",
                        help="algorithm specs (default: exact gossip and PowerGossip rank 1, 2, 4 warm "
                             "and rank 1 restart; with --sweep also Choco and DeepSqueeze with sign, "
                             "topk:matched and lowrank:1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="at most this many steps per run (default: until a run exceeds the "
                             "largest budget)")
    parser.add_argument("--backend", choices=("local", "mpi"), default=None,
                        help="local: one thread per peer; mpi: one peer per rank, under mpiexec "
                             "(default: mpi when launched by mpiexec)")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--sweep", action="store_true",
                        help="run Choco/DeepSqueeze specs without gamma at every value of --gammas")
    parser.add_argument("--gammas", type=float, nargs="+", default=list(DEFAULT_GAMMAS),
                        help="the sweep's gamma grid (default: 8 log-spaced values in [1e-3, 1])")
    parser.add_argument("--sweep-bits", type=float, default=None,
                        help="sweep stage 1: every gamma runs to this many bits per peer (default: the "
                             "second largest budget); 0 = every gamma runs to the largest budget")
    parser.add_argument("--finalists", type=int, default=2,
                        help="sweep stage 2: rerun this many best gammas (at --sweep-bits) to the "
                             "largest budget (default 2)")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS),
                        help="bit budgets per peer for the table (default 1e5 1e6 1e7)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    parser.add_argument("--render-only", action="store_true",
                        help="with --report: rebuild the report page from the saved outputs, run nothing")
    parser.add_argument("--report", action="store_true",
                        help=f"run ring:8 and torus:4x4, matrix and cnn, with --sweep, on the local "
                             f"backend, and write {REPORT_PATH.relative_to(ROOT)}")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from gossip_powersgd.launch import launched_by_mpiexec

    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    backend = args.backend or ("mpi" if launched_by_mpiexec() else "local")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if any(b <= 0 for b in args.budgets) or any(g <= 0 for g in args.gammas):
        raise ValueError("budgets and gammas must be > 0")
    if backend == "mpi" and not launched_by_mpiexec():
        raise ValueError("--backend mpi needs mpiexec: mpiexec -n N python -m experiments.consensus "
                         "--backend mpi ... (N = the topology's size)")
    if backend == "local" and launched_by_mpiexec():
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            raise ValueError("--backend local runs every peer in one process: do not launch it "
                             "with mpiexec -n > 1")
    if args.finalists < 1:
        raise ValueError(f"--finalists must be >= 1, got {args.finalists}")
    sweep_bits = args.sweep_bits
    if sweep_bits is not None and sweep_bits <= 0:
        sweep_bits = math.inf  # no screening: every gamma runs to the largest budget
    if args.render_only:
        if not args.report:
            raise ValueError("--render-only goes with --report")
        records = [load_record(default_out(t, p, DEFAULT_OUT)) for t, p in REPORT_CONFIGS]
        command = records[0].get("command", "python -m experiments.consensus --report")
        dates = sorted(r.get("finished", "") for r in records)
        path = write_report(records, command, sum(r["seconds"] for r in records), date=dates[-1] or None,
                            note=" (this page re-rendered from its saved outputs by "
                                 "`python -m experiments.consensus --report --render-only`)")
        print(f"wrote {path}")
        return 0
    if args.report:
        if backend != "local":
            raise ValueError("--report runs two topology sizes: use the local backend")
        command = "python -m experiments.consensus " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        started = time.perf_counter()
        records = []
        for topology, problem in REPORT_CONFIGS:
            records.append(run_experiment(topology, problem, args.algorithms, args.steps, "local",
                                          default_out(topology, problem, DEFAULT_OUT), True, args.gammas,
                                          args.budgets, args.weights, sweep_bits=sweep_bits,
                                          finalists=args.finalists, command=command))
        path = write_report(records, command, time.perf_counter() - started)
        print(f"wrote {path}")
        return 0
    command = "python -m experiments.consensus " + " ".join(
        shlex.quote(str(a)) for a in (argv if argv is not None else sys.argv[1:]))
    run_experiment(args.topology, args.problem, args.algorithms, args.steps, backend, args.out,
                   args.sweep, args.gammas, args.budgets, args.weights, sweep_bits=sweep_bits,
                   finalists=args.finalists, plots=not args.no_plot, command=command)
    return 0


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
