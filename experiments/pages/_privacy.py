"""What the privacy pages share. The DP regime, in one place: privacy_dp_sweep.md chose its recipe (data per
peer, batch, lr, clip norm), privacy_dp_budget.md its epochs at each ε (`DP_EPOCHS`); privacy.md,
privacy_dp_budget.md, privacy_dp_subspace.md and privacy_attacks.md train in it. `dp_row` is one
run of it: a training config, trained on every peer in-process, measured (accuracy at the end and
at ¾ of the run, each peer's ε, σ, sampling rate, consensus distance over time); a failed run is a
row saying so."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional

from experiments.pages import _figures
from experiments.suite.runs import LOCAL, QUICK_BASE

#: 8 peers x 8000 training samples (mnist1d generates any number; 20 % of them are its test set):
#: DP-SGD's noise on a batch mean is sigma C / batch, and the sigma that a target epsilon needs
#: grows with the sampling rate batch / samples, so more data per peer buys batches large
#: enough to drown the noise at a small sampling rate.
DATA = "mnist1d:num_samples=80000"
#: Training samples per peer in DATA (the pages' wording only).
PER_PEER = 8000
BASE = dict(dataset=DATA, model="cnn1d", optimizer="sgd", momentum=0.9, weight_decay=0.0, **LOCAL)
BASE.update(warmup_epochs=1, schedule="cosine", seed=0, topology="ring:8", partition="iid")
BASE["comm_timeout"] = 600.0
DELTA = 1e-5
#: Every DP row of the sweep's target epsilon (at DELTA; the accountant picks sigma).
TARGET = 8.0
#: Epochs of every sweep row: with batch 256 that is 15 x ceil(8000 / 256) = 480 optimizer steps.
EPOCHS = 15
#: The non-private reference: (label, batch, lr, clip, epochs, target epsilon), the regime of the
#: sweep's non-private rows (lr 0.4: batch 32's 0.1 scaled with the batch).
NONPRIVATE = ("non-private", 128, 0.4, None, EPOCHS, None)
#: The sweep: (label, batch, lr, clip C or None for no clipping, epochs, target or None for no
#: noise); privacy_dp_sweep.md then runs its best DP row again clipped without noise.
SWEEP = (
    NONPRIVATE,
    ("DP", 256, 1.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 2.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 4.0, 0.5, EPOCHS, TARGET),
    ("DP", 512, 2.0, 1.0, EPOCHS, TARGET),
)
#: The DP recipe the sweep chose (its best DP row: batch 256, lr 2.0, C 1.0), the recipe of every
#: privacy page's DP rows. The sweep picks its best row from what it measures; a page that chooses
#: another row must change this constant with it.
CHOSEN = SWEEP[2]
_, DP_BATCH, DP_LR, CLIP, _, _ = CHOSEN
#: The non-private rows' lr on the privacy pages: 0.1, not the sweep's 0.4. At 0.4 (the attack
#: page's run at commit bf0fd24) exact gossip without DP ended at chance on one seed of three and
#: at 90 % on another, and most LiRA reference models trained alone at 0.4 diverged.
NONPRIVATE_LR = 0.1
#: Epochs of the privacy pages' DP rows at each target epsilon: privacy_dp_budget.md's verdicts (a
#: test holds the two equal). At a fixed epsilon a longer run adds more noise per step, so
#: accuracy first rises with the budget and then falls, at a budget that depends on epsilon.
DP_EPOCHS = {8.0: 30, 3.0: 15, 1.0: 15}
#: --quick: a tiny problem (seconds).
QUICK = dict(
    BASE,
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    model="logreg",
    topology="ring:4",
    warmup_epochs=0,
)


def dp_epochs(target: float) -> int:
    """The privacy pages' budget at target epsilon `target` (DP_EPOCHS)."""
    try:
        return DP_EPOCHS[float(target)]
    except KeyError:
        raise ValueError(
            f"no DP budget for target epsilon {target:g}: privacy_dp_budget.md measured "
            f"{', '.join(f'{t:g}' for t in sorted(DP_EPOCHS))}; add a cell for it there first"
        ) from None


def budget_text() -> str:
    """DP_EPOCHS in words, for the pages: '30 epochs at ε = 8, 15 at ε = 3 and 1'."""
    by: Dict[int, List[float]] = {}
    for target, epochs in sorted(DP_EPOCHS.items(), reverse=True):
        by.setdefault(epochs, []).append(target)
    return ", ".join(
        f"{epochs}{' epochs' if i == 0 else ''} at ε = " + " and ".join(f"{t:g}" for t in targets)
        for i, (epochs, targets) in enumerate(by.items())
    )


def recipe(quick: bool, epochs: Optional[int] = None) -> Dict[str, Any]:
    """The privacy pages' recipe: non-private rows at the sweep's reference batch and epochs but
    NONPRIVATE_LR, private rows at CHOSEN for their epsilon's DP_EPOCHS; `epochs` overrides both
    kinds of rows' epochs. --quick: the suite's tiny problem, 1 epoch."""
    if quick:
        batch, lr = QUICK_BASE["batch_size"], QUICK_BASE["lr"]
        out = dict(quick=True, topology="ring:4", epochs=epochs or 1, dp_epochs=epochs or 1)
        return dict(out, batch=batch, lr=lr, dp_batch=batch, dp_lr=lr, warmup=0)
    out = dict(quick=False, topology=BASE["topology"], epochs=epochs or NONPRIVATE[4])
    out.update(dp_epochs=epochs, batch=NONPRIVATE[1], lr=NONPRIVATE_LR)
    return dict(out, dp_batch=DP_BATCH, dp_lr=DP_LR, warmup=BASE["warmup_epochs"])


def train_config(
    plan: Mapping[str, Any], spec: str, target: Optional[float], partition="iid", extra=None
) -> Dict[str, Any]:
    """The training config (without its seed) of a row of `plan` (a `recipe`): `spec` in the
    regime, DP at `target` epsilon or none, evaluated at every quarter (the plateau check), with
    the config keys of `extra` on top (a variant of the regime, e.g. dp_exchanged_subspace)."""
    private = target is not None
    epochs = (plan["dp_epochs"] or dp_epochs(target)) if private else plan["epochs"]
    config = dict(QUICK_BASE if plan["quick"] else BASE)
    config.pop("seed")
    config.update(
        topology=plan["topology"],
        partition=partition,
        epochs=epochs,
        eval_every=max(1, epochs // 4),
        algorithm=spec,
        warmup_epochs=plan["warmup"],
        batch_size=plan["dp_batch" if private else "batch"],
        lr=plan["dp_lr" if private else "lr"],
        comm_timeout=600.0,  # a loaded shared machine can stall a peer thread for minutes
    )
    config.update(extra or {})
    if private:  # the pages report every peer's epsilon and rate: released to the experimenter
        config.update(dp_target_epsilon=target, dp_max_grad_norm=CLIP, dp_delta=DELTA)
        config["release_peer_statistics"] = True
    return config


def measure(config: Mapping[str, Any]) -> Dict[str, Any]:
    """One run on every peer (threads): the training suite's measurements plus the private run's
    (`privacy.dp_report.dp_measurements`: each peer's epsilon and rate, sigma, the averaged
    model's accuracy at ¾ of the run, the consensus distance at every evaluation)."""
    from gossip_powersgd import run
    from gossip_powersgd.privacy.dp_report import dp_measurements

    from experiments.suite.runs import measurements

    result = run(dict(config))
    stats = [result.stats[k] for k in sorted(result.stats)]
    m = measurements(result.summary, stats, result.wall_seconds)
    return dict(m, **dp_measurements(result))


def dp_row(c: Mapping[str, Any], seed: int) -> Dict[str, Any]:
    """One row: `c["train"]` (a `train_config`) at `seed`, labelled by `c`'s label, spec,
    partition and target; a run that fails is a row with its "error"."""
    row = dict(label=c["label"], spec=c["spec"], partition=c["partition"], target=c["target"])
    row["seed"] = seed
    try:
        row.update(measure(dict(c["train"], seed=seed)))
    except Exception as exc:  # a failing run is a row saying so, not a lost page
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    return row


def with_load(row: Dict[str, Any], start: float) -> Dict[str, Any]:
    """`row` with the machine's 1-minute load average at the run's start and end, and its cores."""
    return dict(row, load=[start, os.getloadavg()[0]], cores=os.cpu_count())


def setting_words(quick: bool) -> str:
    """The regime's data, model, topology and partition in words (the pages' "Setting:")."""
    if quick:
        return "the privacy suite's --quick problem"
    return (
        f"`{BASE['dataset']}` ({PER_PEER} training samples per peer), `{BASE['model']}`, "
        f"{BASE['topology']}, {BASE['partition']}"
    )


def at_once(rows) -> str:
    """The words "N run(s) at once " where the rows' first record says how many ran side by
    side, else nothing."""
    origin = rows.records[0].origin or {}
    return f"{origin['jobs']} run(s) at once " if "jobs" in origin else ""


def pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.2f} %"


def loads(rows) -> str:
    """The 1-minute load averages the rows recorded, as 'min–max'."""
    values = [x for r in rows for x in r.get("load", [])]
    return f"{min(values):.1f}–{max(values):.1f}" if values else "n/a"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig, dpi: int, tight: bool = True) -> bytes:
    """`fig` as PNG bytes (closed after), laid out tight first unless `tight` is False."""
    if tight:
        fig.tight_layout()
    return _figures.png(fig, dpi)
