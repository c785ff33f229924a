"""One suite run: train on every peer of a topology (threads of this process, through
`gossip_powersgd.run`) and keep the numbers a table row needs; a failing run becomes a row saying
so. The recipes (`BASE`, `QUICK_BASE`) and the projected-time model live here too."""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, Sequence

LATENCY_S = 50e-6
BANDWIDTHS = (("1 Gbit/s", 1e9 / 8), ("10 Gbit/s", 10e9 / 8))

#: How every recipe here runs: every peer a thread of this process (one torch thread each),
#: quiet, no files written.
LOCAL = dict(backend="local", quiet=True, log_every=0, checkpoint_every=0, out_dir=None, threads=1)
#: The MNIST-1D demo recipe (experiments/configs/demo.yaml), on the local backend.
BASE = dict(dataset="mnist1d", model="cnn1d", optimizer="sgd", lr=0.1, momentum=0.9, **LOCAL)
BASE.update(weight_decay=0.0001, warmup_epochs=2, schedule="cosine", batch_size=32, seed=0)
#: --quick: a tiny problem (seconds), for tests and smoke checks.
QUICK_BASE = dict(dataset="synthetic_logreg:d=20,classes=4,n=2000", model="logreg", **LOCAL)
QUICK_BASE.update(optimizer="sgd", lr=0.5, batch_size=32, seed=0)
#: A row's evaluation fields: {field: the evaluation history's name}.
EVAL_NAMES = dict(mb="mb_sent_per_peer", acc_avg="test_acc_avg_model")
EVAL_NAMES.update(acc_local_mean="test_acc_mean", acc_local_min="test_acc_min")


def run_one(overrides: Dict[str, Any], quick: bool = False, make_hooks=None) -> Dict[str, Any]:
    """Train once on every peer (threads of this process) with the recipe (`BASE`, or
    `QUICK_BASE`) and `overrides`; the row's raw measurements (see `measure`)."""
    return measure(dict(QUICK_BASE if quick else BASE, **overrides), make_hooks)


def measure(config: Dict[str, Any], make_hooks=None) -> Dict[str, Any]:
    """`gossip_powersgd.run(config)` (every peer a thread of this process) and the numbers a
    table row needs. `make_hooks`: rank -> that peer's list of `TrainingHooks` (the caller keeps
    what it needs of them, e.g. an observer's recorded view), or None."""
    from gossip_powersgd import run

    result = run(config, hooks=make_hooks)
    names = dict(epoch="epoch", **EVAL_NAMES)
    evals = [{key: r[name] for key, name in names.items()} for r in result.evals]
    stats = [result.stats[rank] for rank in sorted(result.stats)]
    return measurements(result.summary, stats, result.wall_seconds, evals)


def measurements(
    summary: Dict[str, Any],
    stats: Sequence[Dict[str, int]],
    seconds: float,
    evals: Sequence[Dict[str, float]] = (),
) -> Dict[str, Any]:
    """The numbers a table row needs, from a `train` summary, every peer's `CommStats.as_dict()`
    (the critical path: the slowest peer's rounds and largest-message bytes) and the evaluations
    as dicts (epoch, mb, acc_avg, acc_local_mean, acc_local_min; `curve`: their (mb, acc_avg))."""
    steps = max(1, int(summary["steps"]))
    out = {k: summary[k] for k in ("algorithm", "topology", "partition", "model", "peers")}
    out.update(epochs=summary["epochs"], steps=steps, parameters=summary["parameters"])
    finals = dict(acc_avg="avg_model", acc_local_mean="local_mean", acc_local_min="local_min")
    out.update({key: summary[f"final_test_acc_{name}"] for key, name in finals.items()})
    out["mb_per_peer"] = summary["mb_sent_per_peer"]
    out["mb_per_step"] = summary["mb_sent_per_peer"] / steps
    out["compute_s"] = summary["time_compute_s"] + summary["time_gossip_compute_s"]
    out.update({key: max(int(s[key]) for s in stats) for key in ("rounds", "critical_bytes")})
    curve = [(e["mb"], e["acc_avg"]) for e in evals]
    return dict(out, run_seconds=seconds, curve=curve, evals=[dict(e) for e in evals])


def projected_seconds(m: Dict[str, Any], bandwidth_bytes_per_second: float) -> float:
    """Measured compute + projected communication (`CommStats.projected_seconds` on the counters,
    `LATENCY_S`)."""
    from gossip_powersgd.comm.base import CommStats

    comm = CommStats(rounds=int(m["rounds"]), critical_bytes=int(m["critical_bytes"]))
    return float(m["compute_s"]) + comm.projected_seconds(LATENCY_S, bandwidth_bytes_per_second)


def combine(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Several seeds of one row: accuracies as mean and std, the rest as means; the evaluation
    history as the mean over seeds at each evaluation all seeds share (same epochs)."""
    out = dict(runs[0], seeds=len(runs), seed_list=[r.get("seed", 0) for r in runs])
    averaged = "acc_avg acc_local_mean acc_local_min mb_per_peer mb_per_step compute_s rounds"
    for key in averaged.split() + ["critical_bytes", "run_seconds"]:
        values = [float(r[key]) for r in runs]
        out[key] = statistics.fmean(values)
        out[key + "_std"] = statistics.stdev(values) if len(values) > 1 else None
    histories = [r.get("evals") or [] for r in runs]
    shared = min(len(h) for h in histories) if histories else 0
    out["evals"] = [
        {key: statistics.fmean(float(h[i][key]) for h in histories) for key in histories[0][i]}
        for i in range(shared)
    ]
    out["curve"] = [(e["mb"], e["acc_avg"]) for e in out["evals"]] or list(runs[0].get("curve", []))
    return out


def log(text: str) -> None:
    """A timestamped progress line."""
    print(f"[suite {time.strftime('%H:%M:%S')}] {text}", flush=True)


def attempt_config(
    label: str, config: Dict[str, Any], gamma=None, kind: str = "main"
) -> Dict[str, Any]:
    """Run one row (the whole training config): its measurements, label, spec, group (`kind`) and
    γ as the table shows it ("topology" where the spec takes the topology's), or a row saying why
    it failed."""
    from gossip_powersgd.algorithms import gamma_kind

    spec, seed = config["algorithm"], config.get("seed", 0)
    log(
        f"{label} {config.get('topology')} {config.get('partition')} "
        f"{config.get('epochs')} epochs seed {seed}: {spec}"
    )
    try:
        m = measure(config)
    except Exception as exc:  # a failing algorithm is a table row saying so, not a lost suite
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log(f"  FAILED: {type(exc).__name__}: {first}")
        what = "diverged" if type(exc).__name__ == "NonFiniteError" else type(exc).__name__
        row = {k: config.get(k) for k in ("topology", "partition", "epochs")}
        row.update(algorithm=spec, error=f"{what}: {first}"[:200].replace("|", "/"), label=label)
        row.update(spec=spec, gamma=gamma, model_kind=kind, seed=seed)
        return dict(row, gamma_text="—" if gamma is None else f"{gamma:g}")
    log(f"  acc {m['acc_avg']:.4f}  {m['mb_per_peer']:.3f} MB/peer  {m['run_seconds']:.1f} s")
    topology = gamma is None and gamma_kind(spec) == "topology"
    text = f"{gamma:.3g}" if gamma is not None else "topology" if topology else "—"
    row = dict(m, label=label, spec=spec, model_kind=kind, gamma=gamma, gamma_text=text)
    return dict(row, seed=seed)
