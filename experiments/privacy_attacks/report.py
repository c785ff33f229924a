"""The privacy-attacks page from measured rows: markdown tables, CSV, JSON and three PNG plots
(reconstruction error over time, membership AUC against MB sent, network-DP heat maps)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Dict, List, Sequence

from .measure import ALGORITHMS, DP, MODELS, OBSERVER, VICTIM

ERROR_PNG = "privacy_attacks_reconstruction.png"
AUC_PNG = "privacy_attacks_auc_vs_mb.png"
HEATMAP_PNG = "privacy_attacks_network_dp.png"


def label(spec: str) -> str:
    return dict((s, name) for name, s in ALGORITHMS).get(spec, spec)


def _dp_text(row: Dict[str, Any]) -> str:
    return f"ε = {row['eps_max']:.3g} (σ = {row['sigma']:.3g})" if row["private"] else "none"


def _num(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def runs_table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = ["| topology | algorithm | DP | MB sent / peer | MB recorded by observer | "
             "averaged-model acc | training loss | reconstruction error (final) | "
             "trivial error (final) | " + " | ".join(f"AUC {title}" for _, title in MODELS) + " | "
             + " | ".join(f"TPR@1%FPR {name[:1]}" for name, _ in MODELS) + " |",
             "|---" * (9 + 2 * len(MODELS)) + "|"]
    for r in rows:
        if "failure" in r:
            lines.append(f"| {r['topology']} | {label(r['spec'])} | {'ε' if r['private'] else 'none'}"
                         f" | FAILED: {r['failure']} |")
            continue
        aucs = " | ".join(_num(r[f"auc_{name}"]) for name, _ in MODELS)
        tprs = " | ".join(_num(r[f"tpr_{name}"]) for name, _ in MODELS)
        lines.append(f"| {r['topology']} | {label(r['spec'])} | {_dp_text(r)} | "
                     f"{r['mb_sent_per_peer']:.3f} | {r['observed_mb']:.3f} | "
                     f"{100 * r['acc_avg']:.2f} % | {r['train_loss']:.3f} | {_num(r['final_error'], 4)}"
                     f" | {_num(r['final_error_trivial'], 4)} | {aucs} | {tprs} |")
    return "\n".join(lines) + "\n"


def error_table(rows: Sequence[Dict[str, Any]], points: int = 5) -> str:
    """Relative reconstruction error at a few evenly spaced recorded steps."""
    ok = [r for r in rows if "failure" not in r]
    if not ok:
        return ""
    steps = ok[0]["error_steps"]
    picks = sorted({steps[round(k * (len(steps) - 1) / (points - 1))] for k in range(points)})
    lines = ["| topology | algorithm | DP | " + " | ".join(f"step {s}" for s in picks) + " |",
             "|---" * (3 + len(picks)) + "|"]
    for r in ok:
        where = {s: e for s, e in zip(r["error_steps"], r["error"])}
        trivial = {s: e for s, e in zip(r["error_steps"], r["error_trivial"])}
        cells = " | ".join(f"{where[s]:.3g} ({trivial[s]:.3g})" if s in where else "n/a" for s in picks)
        lines.append(f"| {r['topology']} | {label(r['spec'])} | {'yes' if r['private'] else 'no'} | "
                     f"{cells} |")
    return "\n".join(lines) + "\n"


NOISE_TEXT = {"once": "once", "every_step": "every step"}


def network_table(network: Dict[str, Any]) -> str:
    lines = ["| noise | steps | topology | ε min | ε median | ε max | pairs at the local-DP ceiling "
             "| local-DP ceiling | Muffliato's per-message sum (not a bound): min – max; pairs below "
             "the exact ε; pairs above the ceiling |",
             "|---" * 9 + "|"]
    for c in network["cases"]:
        summed = (f"{c['per_message_min']:.3g} – {c['per_message_max']:.3g}; "
                  f"{100 * c['per_message_below_exact']:.0f} %; "
                  f"{100 * c['per_message_above_local']:.0f} %" if "per_message_min" in c else "n/a")
        lines.append(f"| {NOISE_TEXT[c['noise']]} | {c['steps']} | {c['topology']} | {c['min']:.3g} "
                     f"| {c['median']:.3g} | {c['max']:.3g} | {100 * c['at_local']:.0f} % "
                     f"| {c['local']:.3g} | {summed} |")
    return "\n".join(lines) + "\n"


def network_text(network: Dict[str, Any]) -> str:
    """The network-DP section: what is computed, the table and the heat maps."""
    made = f"{network['generated']} " if network.get("generated") else ""
    return (f"## Pairwise network DP of noisy exact gossip (exact accountant)\n\n{made}"
            f"ε[u, v] of peer u towards observer v's whole view (everything v receives over the "
            f"run, its own values known), σ = {network['sigma']:g}, δ = {network['delta']:g}, "
            f"sensitivity 1. For linear gossip with Gaussian noise the view is one Gaussian "
            f"mechanism, so ε is exact (`gossip_powersgd.privacy.pairwise_epsilon`, analytic "
            f"Gaussian conversion). Noise once: each peer noises its value once, then gossip runs "
            f"(the Muffliato consensus setting); every step: fresh noise on each step's "
            f"contribution, any per-step change of norm ≤ 1 (as DP-SGD's clipped gradients), "
            f"the contributions taken as given (non-adaptive). The local-DP ceiling is what the "
            f"peer's own noisy values reveal (every step: all of them). Muffliato's per-message "
            f"sum composes every message as if it carried fresh noise (the previous version of "
            f"this table, here with the same conversion): it is not a bound (last column). "
            f"Linear gossip only: it does not cover PowerGossip's or compressed gossip's messages, "
            f"which per-peer DP-SGD covers by post-processing.\n\n"
            + network_table(network) + f"\n![network DP]({HEATMAP_PNG})\n\n")


def findings(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Sentences computed from the rows (no number on the page is typed by hand)."""
    ok = [r for r in rows if "failure" not in r]
    out = []
    for r in ok:
        gap = r["auc_victim"] - r["auc_reconstruction"]
        over_own = r["auc_reconstruction"] - r["auc_observer"]
        out.append(
            f"- {r['topology']}, {label(r['spec'])}, DP {'on' if r['private'] else 'off'}: the "
            f"reconstruction's AUC is {r['auc_reconstruction']:.3f}, {gap:+.3f} below the victim's "
            f"own model ({r['auc_victim']:.3f}) and {over_own:+.3f} above the observer's own model "
            f"({r['auc_observer']:.3f}); the observer received {r['observed_mb']:.3f} MB "
            f"(reconstruction error {r['final_error']:.3g} vs {r['final_error_trivial']:.3g} trivial).")
    exact = {(r["topology"], r["private"]): r for r in ok if r["spec"] == "exact"}
    for r in ok:
        if r["spec"].startswith("powergossip") and (r["topology"], r["private"]) in exact:
            e = exact[(r["topology"], r["private"])]
            leak = r["auc_reconstruction"] - 0.5
            full = e["auc_reconstruction"] - 0.5
            share = leak / full if full > 0 else float("nan")
            out.append(f"- {label(r['spec'])} on {r['topology']} (DP {'on' if r['private'] else 'off'})"
                       f" sends {e['mb_sent_per_peer'] / r['mb_sent_per_peer']:.1f}x fewer bytes than "
                       f"exact gossip; the observer's attack keeps {_num(share, 2)} of exact "
                       f"gossip's AUC advantage over chance (AUC − 0.5).")
    return out


CSV_FIELDS = ("topology", "spec", "private", "eps_max", "sigma", "epochs", "steps", "parameters",
              "mb_sent_per_peer", "observed_mb", "acc_avg", "acc_local_mean", "train_loss",
              "final_error", "final_error_trivial", "members", "auc_null_std",
              *(f"auc_{n}" for n, _ in MODELS), *(f"tpr_{n}" for n, _ in MODELS), "run_seconds",
              "failure")


def rows_csv(rows: Sequence[Dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    return buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_errors(rows: Sequence[Dict[str, Any]], path: Path) -> None:
    """Relative reconstruction error against step, one panel per (topology, DP)."""
    plt = _pyplot()
    ok = [r for r in rows if "failure" not in r]
    panels = list(dict.fromkeys((r["topology"], r["private"]) for r in ok))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (topology, private) in zip(axes.flat, panels):
        for r in ok:
            if (r["topology"], r["private"]) == (topology, private):
                line, = ax.plot(r["error_steps"], [max(e, 1e-8) for e in r["error"]],
                                label=label(r["spec"]))
                ax.plot(r["error_steps"], r["error_trivial"], color=line.get_color(), ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("‖x̂ − x‖ / ‖x‖ (dotted: observer's own model)")
        ax.set_title(f"{topology}, DP {'on' if private else 'off'}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_auc(rows: Sequence[Dict[str, Any]], path: Path) -> None:
    """Membership AUC with the observer's reconstruction against MB sent per peer."""
    plt = _pyplot()
    ok = [r for r in rows if "failure" not in r]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {False: "o", True: "s"}
    for r in ok:
        ax.plot([r["mb_sent_per_peer"]], [r["auc_reconstruction"]], linestyle="none",
                marker=markers[r["private"]])
        ax.annotate(f"{label(r['spec'])}, {r['topology']}{', DP' if r['private'] else ''}",
                    (r["mb_sent_per_peer"], r["auc_reconstruction"]), fontsize=7,
                    xytext=(4, 2), textcoords="offset points")
    ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per peer (log)")
    ax.set_ylabel("LOSS-attack AUC, observer's reconstruction")
    ax.set_title("membership leakage vs bytes (squares: DP on)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_network(network: Dict[str, Any], path: Path) -> None:
    """epsilon[u, v] heat maps on one colour scale (log), one row per case, one column per
    topology; white: epsilon = 0 (u's noise does not reach v)."""
    import numpy as np
    from matplotlib.colors import LogNorm

    plt = _pyplot()
    cases = network["cases"]
    specs = list(dict.fromkeys(c["topology"] for c in cases))
    rows = list(dict.fromkeys((c["noise"], c["steps"]) for c in cases))
    mats = [np.array(c["matrix"]) for c in cases]
    finite = np.concatenate([m[np.isfinite(m) & (m > 0)] for m in mats])
    norm = LogNorm(vmin=finite.min(), vmax=finite.max())
    fig, axes = plt.subplots(len(rows), len(specs), figsize=(4.2 * len(specs), 3.8 * len(rows)),
                             squeeze=False)
    for c, m in zip(cases, mats):
        ax = axes[rows.index((c["noise"], c["steps"])), specs.index(c["topology"])]
        image = ax.imshow(np.where(m > 0, m, np.nan), norm=norm, cmap="viridis")
        ax.set_title(f"{c['topology']}, noise {NOISE_TEXT[c['noise']]}, T = {c['steps']}", fontsize=9)
        ax.set_xlabel("observer v")
        if specs.index(c["topology"]) == 0:
            ax.set_ylabel("peer u")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="ε of u towards v")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def page(rows: Sequence[Dict[str, Any]], network: Dict[str, Any], plan: Dict[str, Any],
         generated: str) -> str:
    """The markdown page."""
    setting = plan["setting"]
    text = "# What a curious neighbour learns\n\n"
    text += (f"{generated} Backend: `local` (every peer a thread of one process). Rank {OBSERVER} "
             f"observes (records every message it receives, every step) and attacks its neighbour, "
             f"rank {VICTIM}, whose own recorded view gives the truth.\n\n")
    text += ("**Threat model.** Honest-but-curious peers: they follow the protocol, do not collude, "
             "and see exactly the bytes the transport delivers to them, plus what they legitimately "
             "know (their own model, the shared edge seeds and PowerGossip factors, the algorithm's "
             "public state such as Choco's x̂ of the neighbour).\n\n")
    text += (f"**Setting (chosen so the attack has signal).** `{setting['dataset']}`, partition "
             f"`{setting['partition']}`, model `{setting['model']}` "
             f"(over-parameterised for its shard), `{setting['optimizer']}` lr {setting['lr']} "
             f"momentum {setting['momentum']}, no weight decay, batch {setting['batch_size']}, "
             f"{plan['epochs']} epochs, seed {setting['seed']}. Private runs: DP-SGD on every peer "
             f"with target ε = {DP['dp_target_epsilon']:g} at δ = {DP['dp_delta']:g}, clip "
             f"C = {DP['dp_max_grad_norm']:g}; {plan['private_note']} Membership inference: the LOSS "
             f"attack on the victim's shard against as many test samples; an AUC within ~2 × "
             f"{_num(rows[0].get('auc_null_std') if rows else None)} (the null standard deviation) of "
             f"0.5 is chance. Reconstruction: exact gossip read off, PowerGossip least squares over "
             f"the last {plan['window']} half-steps, Choco its public copy x̂ (see "
             f"`gossip_powersgd/privacy/reconstruction.py`).\n\n")
    text += "## Runs\n\n" + runs_table(rows) + "\n"
    text += ("AUC columns: LOSS attack with (a) the victim's true model, (b) the observer's "
             "reconstruction of it, (c) the observer's own model, (d) the average of all peers' "
             "models; TPR@1%FPR columns in the same order (v, r, o, a). All models at the last "
             "step, before its gossip.\n\n")
    text += ("## Reconstruction error over time\n\nRelative error ‖x̂ − x‖ / ‖x‖ of the observer's "
             "estimate of the victim's model (in brackets: of the observer's own model, the trivial "
             "estimate).\n\n" + error_table(rows) + f"\n![reconstruction error]({ERROR_PNG})\n\n")
    text += f"## Membership AUC against bytes\n\n![AUC vs MB]({AUC_PNG})\n\n"
    text += "## What the rows show\n\n" + "\n".join(findings(rows)) + "\n\n"
    text += network_text(network)
    text += ("Data: [privacy_attacks.csv](privacy_attacks.csv) (one row per run), "
             "[privacy_attacks.json](privacy_attacks.json) (rows with their error curves, and the "
             "network-DP matrices).\n")
    return text
