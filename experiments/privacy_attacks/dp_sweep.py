"""`python -m experiments.privacy_attacks.dp_sweep [--quick]`: the small sweep that chose the DP
regime of the privacy pages (data per peer, batch, learning rate, clip norm), and the consensus
distance over time of every algorithm under DP in that regime, with PowerGossip remedies.

Writes experiments/results/privacy_dp_sweep.{md,json}. Part 1 (exact gossip, mnist1d cnn1d iid
ring:8): non-private references, then DP at target epsilon 8 for a few (batch, lr, C, epochs);
the chosen regime is the DP row with the best averaged-model accuracy. Part 2: every algorithm
(and PowerGossip with more power iterations / a higher rank) in the chosen regime at epsilon 8,
with the consensus distance at every evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from gossip_powersgd.utils import atomic_write, git_commit

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

ROOT = Path(__file__).resolve().parents[2]
#: The default output folder (git-ignored); the committed page only with an explicit
#: `--out experiments/results`.
DEFAULT_OUT = ROOT / "runs" / "dp-sweep"

#: 8 peers x 2000 training samples (mnist1d generates any number; 20 % of them are its test set).
DATA = "mnist1d:num_samples=20000"
BASE = dict(
    dataset=DATA,
    model="cnn1d",
    optimizer="sgd",
    momentum=0.9,
    weight_decay=0.0,
    warmup_epochs=1,
    schedule="cosine",
    seed=0,
    backend="local",
    quiet=True,
    log_every=0,
    checkpoint_every=0,
    out_dir=None,
    threads=1,
    topology="ring:8",
    partition="iid",
    comm_timeout=600.0,
)
DELTA = 1e-5
#: (label, batch, lr, clip C or None for no DP, epochs).
#: DP-SGD's cost grows with epochs x data (one per-example gradient each); on the shared 2 cores
#: at load 10-15 one DP run of this size takes ~10 min: 15 epochs, and few rows.
SWEEP = (
    ("non-private, batch 32", 32, 0.1, None, 15),
    ("DP", 256, 1.0, 1.0, 15),
    ("DP", 256, 2.0, 1.0, 15),
)
#: Part 2: the algorithms in the chosen regime, (label, spec, private); PowerGossip's remedy
#: (more power iterations) under DP. Exact gossip's DP row is the sweep's.
ALGORITHMS = (
    ("PowerGossip r1", "powergossip:rank=1", True),
    ("PowerGossip r1, 4 power iterations", "powergossip:rank=1,iters=4", True),
    ("Choco sign", "choco:compressor=sign,gamma=1.0", True),
    ("PowerGossip r1", "powergossip:rank=1", False),
)
QUICK = dict(
    BASE,
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    model="logreg",
    topology="ring:4",
    warmup_epochs=0,
)


def _peer(comm: Comm, config):
    from gossip_powersgd.training.trainer import train

    return train(comm, config)


def run(overrides: Dict[str, Any], quick: bool = False) -> Dict[str, Any]:
    """One run (threads); accuracy, every peer's epsilon, and the evaluations over time."""
    import torch

    from gossip_powersgd.launch import run_peers
    from gossip_powersgd.training.config import config_from_dict, resolve_topology

    torch.set_num_threads(1)
    config = config_from_dict(dict(QUICK if quick else BASE, **overrides))
    topology = resolve_topology(config)
    config = config.replace(peers=topology.size)
    started = time.perf_counter()
    summary = run_peers(topology, _peer, config, backend="local", timeout=config.comm_timeout)[0]
    epsilons = [math.inf if e == "inf" else float(e) for e in summary.get("epsilon", [math.inf])]
    evals = [
        dict(
            epoch=r.get("epoch"),
            step=r.get("step"),
            acc_avg=r.get("test_acc_avg_model"),
            consensus=r.get("consensus_distance"),
            loss=r.get("train_loss"),
        )
        for r in summary["history"]
        if r.get("kind") == "eval"
    ]
    return dict(
        acc_avg=summary["final_test_acc_avg_model"],
        acc_local_mean=summary["final_test_acc_local_mean"],
        consensus=summary.get("final_consensus_distance"),
        eps_max=max(epsilons),
        eps_min=min(epsilons),
        sigma=summary.get("noise_multiplier"),
        steps=summary["steps"],
        evals=evals,
        seconds=time.perf_counter() - started,
    )


def _private(batch, lr, clip, epochs, target=8.0):
    out = dict(batch_size=batch, lr=lr, epochs=epochs, eval_every=max(1, epochs // 5))
    if clip is not None:
        out.update(
            dp_target_epsilon=target,
            dp_max_grad_norm=clip,
            dp_delta=DELTA,
            release_peer_statistics=True,
        )
    return out


def _log(text: str) -> None:
    print(f"[dp-sweep {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _attempt(row: Dict[str, Any], overrides: Dict[str, Any], quick: bool) -> Dict[str, Any]:
    _log(str(row))
    try:
        row.update(run(overrides, quick))
    except Exception as exc:  # a failed run is a row saying so
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        _log("  FAILED " + row["error"])
        return row
    _log(
        f"  acc {row['acc_avg']:.4f} eps {row['eps_max']:.3g} consensus {row['consensus']:.3g} "
        f"{row['seconds']:.0f} s"
    )
    return row


def _key(row: Dict[str, Any]) -> tuple:
    return tuple(row[k] for k in ("label", "algorithm", "batch", "lr", "clip", "epochs"))


def sweep(
    quick: bool, saved: Optional[Dict[str, Any]] = None, save=None, render_only: bool = False
) -> Dict[str, Any]:
    """Every row of the plan; rows already in `saved` (a previous, interrupted run of the same
    commit's plan) are kept, and `save(result)` is called after each new row. `render_only`:
    run nothing, keep the saved rows (the plan's others are listed as not run)."""
    done = {
        _key(r): r
        for part in ("sweep", "algorithms")
        for r in (saved or {}).get(part, [])
        if "error" not in r or render_only
    }
    result: Dict[str, Any] = dict(sweep=[], chosen=None, algorithms=[])

    def attempt(part, row, overrides):
        if render_only and _key(row) not in done:
            result.setdefault("not_run", []).append(row)
            return
        result[part].append(done.get(_key(row)) or _attempt(row, overrides, quick))
        if save is not None:
            save(result)

    for label, b, lr, c, e in SWEEP[:3] if quick else SWEEP:
        e = 1 if quick else e
        attempt(
            "sweep",
            dict(label=label, algorithm="exact", batch=b, lr=lr, clip=c, epochs=e),
            dict(_private(b, lr, c, e), algorithm="exact"),
        )
    private = [r for r in result["sweep"] if r["clip"] is not None and "error" not in r]
    best = max(private, key=lambda r: r["acc_avg"]) if private else None
    if best is None:
        return result
    result["chosen"] = {k: best[k] for k in ("batch", "lr", "clip", "epochs")}
    for label, spec, dp in ALGORITHMS[:2] if quick else ALGORITHMS:
        clip = best["clip"] if dp else None
        attempt(
            "algorithms",
            dict(
                label=label,
                algorithm=spec,
                batch=best["batch"],
                lr=best["lr"],
                clip=clip,
                epochs=best["epochs"],
            ),
            dict(_private(best["batch"], best["lr"], clip, best["epochs"]), algorithm=spec),
        )
    return result


def _sigma(v) -> str:
    return "—" if v is None else f"{v:.3g}"


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.2f} %"


def findings(result: Dict[str, Any]) -> List[str]:
    """Sentences computed from the rows."""
    out = []
    ok = [r for r in result["sweep"] if "error" not in r]
    plain = [r for r in ok if r["clip"] is None]
    private = [r for r in ok if r["clip"] is not None]
    if plain and private:
        best = max(private, key=lambda r: r["acc_avg"])
        top = max(plain, key=lambda r: r["acc_avg"])
        gap = 100 * (top["acc_avg"] - best["acc_avg"])
        out.append(
            f"- Exact gossip: non-private {_pct(top['acc_avg'])}, best DP row (ε = "
            f"{best['eps_max']:.3g}) {_pct(best['acc_avg'])}: {gap:.1f} pp below, "
            + ("within" if gap <= 10 else "**not within**")
            + " the 10 pp target."
        )
    exact = max(private, key=lambda r: r["acc_avg"]) if private else None
    for r in result["algorithms"]:
        if "error" in r or r["clip"] is None:
            continue
        base = f" (exact gossip {exact['consensus']:.3g})" if exact else ""
        out.append(
            f"- {r['label']} under DP: averaged-model accuracy {_pct(r['acc_avg'])}, final "
            f"consensus distance {r['consensus']:.3g}{base}."
        )
    return out


def page(result: Dict[str, Any], command: str, seconds: float, quick: bool) -> str:
    setting = QUICK if quick else BASE
    made = (
        f"Rows made by `python -m experiments.privacy_attacks.dp_sweep` ({seconds:.0f} s of runs), "
        f"page rendered by `{command}` (commit {git_commit()})"
        if "--render-only" in command
        else f"Generated by `{command}` in {seconds:.0f} s (commit {git_commit()})"
    )
    text = (
        f"# The DP regime of the privacy pages: a small sweep\n\n{made}; backend local (8 peer threads), 2 CPU cores "
        f"shared with other jobs. Setting: `{setting['dataset']}` (2000 training samples per "
        f"peer), `{setting['model']}`, {setting['topology']}, {setting['partition']}, SGD "
        f"momentum 0.9, cosine schedule, {setting['warmup_epochs']} warm-up epoch, no weight "
        f"decay. DP: Poisson batches, per-example clip C, target ε = 8 at δ = {DELTA:g}, "
        f"noise secret per peer. ε is each peer's own (iid: all equal).\n\n"
        "## 1. Exact gossip: batch, lr, clip norm\n\n"
        "| run | batch | lr | C | epochs | steps | σ | ε | averaged-model acc | consensus "
        "distance (end) | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in result["sweep"]:
        if "error" in r:
            text += f"| {r['label']} | {r['batch']} | {r['lr']} | {r['clip']} | FAILED: {r['error']} |\n"
            continue
        text += (
            f"| {r['label']} | {r['batch']} | {r['lr']} | {r['clip'] or '—'} | {r['epochs']} "
            f"| {r['steps']} | {_sigma(r['sigma'])} | "
            f"{r['eps_max']:.3g} | {_pct(r['acc_avg'])} | {r['consensus']:.3g} | "
            f"{r['seconds']:.0f} |\n"
        )
    chosen = result["chosen"]
    text += f"\nChosen regime (best DP row): {chosen}.\n\n"
    text += (
        "## 2. Every algorithm in the chosen regime: consensus distance over time\n\n"
        "Consensus distance (mean squared distance of the local models to their average) at "
        "each evaluation, DP (ε = 8) and without DP.\n\n"
        "| algorithm | DP | ε (victim = every peer, iid) | averaged-model acc | consensus "
        "distance at each evaluation |\n|---|---|---|---|---|\n"
    )
    chosen_row = [
        dict(r, label="exact gossip (the chosen sweep row)")
        for r in result["sweep"]
        if "error" not in r
        and r["clip"] is not None
        and chosen
        and all(r[k] == chosen[k] for k in chosen)
    ]
    for r in chosen_row + result["algorithms"]:
        if "error" in r:
            text += f"| {r['label']} | {'yes' if r['clip'] else 'no'} | FAILED: {r['error']} |\n"
            continue
        curve = ", ".join(f"{e['consensus']:.3g}" for e in r["evals"] if e["consensus"] is not None)
        text += (
            f"| {r['label']} | {'yes' if r['clip'] else 'no'} | {r['eps_max']:.3g} | "
            f"{_pct(r['acc_avg'])} | {curve} |\n"
        )
    text += "\n## What the rows show\n\n" + "\n".join(findings(result)) + "\n"
    if result.get("not_run"):
        text += (
            "\n## Not run\n\nThese rows of the plan did not finish in the time the shared "
            "machine allowed (the page was rendered with --render-only from the rows that "
            "did):\n\n"
            + "\n".join(
                f"- {r['label']} ({r['algorithm']}), batch {r['batch']}, "
                f"lr {r['lr']}, C {r['clip']}"
                for r in result["not_run"]
            )
            + "\n"
        )
    return text


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.privacy_attacks.dp_sweep")
    parser.add_argument("--quick", action="store_true", help="tiny problem, seconds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: write the page from the rows of the partial file",
    )
    args = parser.parse_args(argv)
    out = args.out or (ROOT / "runs" / "dp-sweep-quick" if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.privacy_attacks.dp_sweep" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    started = time.perf_counter()
    partial = out / "privacy_dp_sweep.partial.json"
    final = out / "privacy_dp_sweep.json"
    source = partial if partial.exists() else final if args.render_only and final.exists() else None
    saved = json.loads(source.read_text()) if source is not None else None
    result = sweep(
        args.quick,
        saved,
        lambda r: atomic_write(partial, json.dumps(r, indent=1)),
        render_only=args.render_only,
    )
    seconds = (
        time.perf_counter()
        - started
        + sum(
            r.get("seconds", 0)
            for part in ("sweep", "algorithms")
            for r in (saved or {}).get(part, [])
        )
    )
    atomic_write(out / "privacy_dp_sweep.md", page(result, command, seconds, args.quick))
    atomic_write(out / "privacy_dp_sweep.json", json.dumps(result, indent=1) + "\n")
    if not result.get("not_run") and partial.exists():
        partial.unlink()
    _log(f"wrote {out / 'privacy_dp_sweep.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
