"""What the privacy pages share: the DP regime (privacy_dp_sweep.md chose its recipe,
privacy_dp_budget.md its epochs at each ε) and `dp_row`, one run of it on every peer in-process."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from experiments.engine import made_by
from experiments.suite.runs import LOCAL, QUICK_BASE
from experiments.suite.tables import _pct

#: 8 peers x PER_PEER training samples (20 % more are the test set): batches large enough to
#: drown DP-SGD's noise (sigma C / batch) at a small sampling rate.
DATA = "mnist1d:num_samples=80000"
PER_PEER = 8000
BASE = dict(dataset=DATA, model="cnn1d", optimizer="sgd", momentum=0.9, weight_decay=0.0, **LOCAL)
BASE.update(warmup_epochs=1, schedule="cosine", seed=0, topology="ring:8", partition="iid")
BASE["comm_timeout"] = 600.0
DELTA = 1e-5
#: The sweep's target epsilon (at DELTA) and epochs; its rows: (label, batch, lr, clip, epochs,
#: target epsilon), clip or target None: none.
TARGET, EPOCHS = 8.0, 15
NONPRIVATE = ("non-private", 128, 0.4, None, EPOCHS, None)
SWEEP = (
    NONPRIVATE,
    ("DP", 256, 1.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 2.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 4.0, 0.5, EPOCHS, TARGET),
    ("DP", 512, 2.0, 1.0, EPOCHS, TARGET),
)
#: The sweep's best DP row, every privacy page's DP recipe (to change with the sweep's choice).
CHOSEN = SWEEP[2]
_, DP_BATCH, DP_LR, CLIP, _, _ = CHOSEN
#: The privacy pages' non-private lr: at the sweep's 0.4 (commit bf0fd24) exact gossip ended at
#: chance on one seed of three, and most LiRA reference models trained alone diverged.
NONPRIVATE_LR = 0.1
#: Epochs of the privacy pages' DP rows per target epsilon: privacy_dp_budget.md's verdicts (a test
#: holds the two equal; at a fixed epsilon a longer run adds more noise per step).
DP_EPOCHS = {8.0: 30, 3.0: 15, 1.0: 15}
_REFS: Dict[str, Any] = {}  #: this process's LiRA references (`references`)
#: --quick: a tiny problem (seconds).
QUICK = dict(BASE, dataset="synthetic_logreg:d=20,classes=4,n=2000", model="logreg")
QUICK.update(topology="ring:4", warmup_epochs=0)


def dp_epochs(target: float) -> int:
    """The privacy pages' budget at target epsilon `target` (DP_EPOCHS)."""
    try:
        return DP_EPOCHS[float(target)]
    except KeyError:
        raise ValueError(
            f"no DP budget for target epsilon {target:g}: privacy_dp_budget.md measured "
            f"{', '.join(f'{t:g}' for t in sorted(DP_EPOCHS))}; add a cell for it there first"
        ) from None


def plateau_budget(budgets: Sequence[int], settled: Callable[[int], bool]) -> Optional[int]:
    """The smallest of `budgets` from which every doubling is `settled`, or None."""
    for e in budgets:
        later = [b for b in budgets if b >= e and 2 * b in budgets]
        if later and all(map(settled, later)):
            return e
    return None


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
    """The privacy pages' recipe (`epochs` overrides both kinds of row's; --quick: tiny)."""
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
    """The training config (no seed) of `spec` in `plan`, DP at `target` or none."""
    private = target is not None
    epochs = (plan["dp_epochs"] or dp_epochs(target)) if private else plan["epochs"]
    config = {k: v for k, v in (QUICK_BASE if plan["quick"] else BASE).items() if k != "seed"}
    config.update(topology=plan["topology"], partition=partition, epochs=epochs, algorithm=spec)
    config.update(eval_every=max(1, epochs // 4), warmup_epochs=plan["warmup"])
    dp = "dp_" if private else ""
    config.update(batch_size=plan[dp + "batch"], lr=plan[dp + "lr"])
    config["comm_timeout"] = 600.0  # a loaded shared machine can stall a peer thread for minutes
    config.update(extra or {})
    if private:  # the pages report every peer's epsilon and rate: released to the experimenter
        config.update(dp_target_epsilon=target, dp_max_grad_norm=CLIP, dp_delta=DELTA)
        config["release_peer_statistics"] = True
    return config


def dp_row(c: Mapping[str, Any], seed: int) -> Dict[str, Any]:
    """`c["train"]` at `seed` as a row (`dp_measurements`, the load), or its "error"."""
    from gossip_powersgd import run
    from gossip_powersgd.privacy.dp_report import dp_measurements

    from experiments.suite.runs import measurements

    row = dict(label=c["label"], spec=c["spec"], partition=c["partition"], target=c["target"])
    row["seed"], start = seed, os.getloadavg()[0]
    try:
        result = run(dict(c["train"], seed=seed))
        stats = [result.stats[k] for k in sorted(result.stats)]
        m = measurements(result.summary, stats, result.wall_seconds)
        row.update(m, **dp_measurements(result))
    except Exception as exc:  # a failing run is a row saying so, not a lost page
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    return with_load(row, start)


def membership_split(c: Mapping[str, Any], seed: int):
    """The seed's membership split of config `c`: the observer's neighbours are the victims."""
    import topologies

    from gossip_powersgd.privacy.heldout import make_split

    topology = topologies.parse(c["topology"])
    victims = sorted(int(j) for j in topology.neighbors(c["observer"]))
    return make_split(c["dataset"], topology.size, c["partition"], 0, victims, c["fraction"], seed)


def quarters(evals, epochs: int) -> Dict[str, float]:
    """The averaged-model accuracy at half and three quarters of the run (nan: not evaluated)."""
    at: Dict[int, float] = {}
    for e in evals:
        at.setdefault(round(4 * e["epoch"] / epochs), e["acc_avg"])
    return dict(acc_half=at.get(2, float("nan")), acc_3q=at.get(3, float("nan")))


def references(key: Any, build: Callable[[], Any]) -> Any:
    """`build()` once per `key` in this process: the LiRA references that a seed's runs share."""
    key = json.dumps(key, sort_keys=True)
    if key not in _REFS:
        _REFS[key] = build()
    return _REFS[key]


def with_load(row: Dict[str, Any], start: float) -> Dict[str, Any]:
    """`row` with the machine's 1-minute load average at the run's start and end, and its cores."""
    return dict(row, load=[start, os.getloadavg()[0]], cores=os.cpu_count())


def page_fields(rows) -> Dict[str, Any]:
    """The DP pages' opening fields: who made the rows, at what load, the setting, the recipe."""
    origin = rows.records[0].origin or {}
    plan = recipe(rows.quick)
    setting = (
        "the privacy suite's --quick problem"
        if rows.quick
        else f"`{BASE['dataset']}` ({PER_PEER} training samples per peer), `{BASE['model']}`, "
        f"{BASE['topology']}, {BASE['partition']}"
    )
    out = dict(made_by=made_by(rows), cores=rows.data[0].get("cores", "n/a"), setting=setting)
    out.update(at_once=f"{origin['jobs']} run(s) at once " if "jobs" in origin else "")
    values = [x for r in rows.data for x in r.get("load", [])]
    out["loads"] = f"{min(values):.1f}–{max(values):.1f}" if values else "n/a"
    out.update(clip=CLIP, delta=DELTA)
    return dict(out, **{k: plan[k] for k in ("dp_batch", "dp_lr", "warmup")})


def run_line(text: Mapping[str, str], r: Mapping[str, Any]) -> str:
    """A run's line of a DP page's runs table: `text`'s `run` piece, or `failed` with its error."""
    words = dict(r, acc=_pct(r.get("acc_avg")), at_3q=_pct(r.get("acc_3q")))
    words.update(error=r.get("error", "").replace("|", "/"))
    return text["failed" if "error" in r else "run"].format_map(words)
