"""Local DP-SGD, Muffliato, ZIP-DL and DECOR at equal epsilon against a neighbour, attacked.

`python -m experiments.privacy_mechanisms [--quick] [--topologies T,...] [--epochs N]
[--schedule constant|cosine] [--out DIR]`, or `--merge DIR DIR ... --out DIR` to join runs made
side by side on different topologies into one page:
local DP-SGD, Muffliato, ZIP-DL and DECOR at equal epsilon against a neighbour, on exact gossip
and PowerGossip r1, on each topology (default ring:8, ring:16, exponential:16), with the neighbour's
membership attack: privacy_mechanisms.md and its CSV in DIR (default runs/privacy-mechanisms; the
committed page is made with --out experiments/results).

Every mechanism's noise is calibrated before training so that the victim's epsilon against a direct
neighbour (victim 1, observer 0; the topologies are vertex transitive) is the target, with that
mechanism's own valid accountant (`privacy.mechanisms`); then each (mechanism, algorithm) trains
with seeds 0, 1, 2, evaluated at every quarter of the run (the plateau check). Every run is
an attacked run (Privacy IV's protocol, `experiments.privacy_attacks`): every peer's shard is split
into members (trained on) and held-out records no peer trains on; observer 0 records what it
receives, and the LOSS and LiRA attacks score its neighbours 1 and n-1's candidates with the model it
reads off (or reconstructs from) their messages, beside the blind baselines and their null band.
``--schedule`` is the learning rate's: ``constant`` (the default) or ``cosine`` (decayed to 0
over the run). Every mechanism's noise is on the clipped gradient sum (DP-SGD's sigma C, DECOR's
pairs' and independent noise), so on the model it is lr_t times that, exactly as the record's
sensitivity lr_t C / batch: DP-SGD's subsampled epsilon and DECOR's SecLDP epsilon hold under any
schedule (post-processing). Muffliato's and ZIP-DL's network bounds model a constant step
(`muffliato.network_applies`): under ``cosine`` they are not computed and those mechanisms report
DP-SGD's local bound, which holds under any schedule (ZIP-DL's zero-sum noise is then independent
extra noise on the messages, at the scale of the base lr's first step).
``--quick`` is a seconds-long smoke run (4 peers, 4 epochs, 1 seed) that writes its page to
runs/privacy-mechanisms-quick unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

from gossip_powersgd.utils import atomic_write

if TYPE_CHECKING:
    import topologies

#: The default output folder (git-ignored); the committed page only with an explicit
#: `--out experiments/results`.
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "runs" / "privacy-mechanisms"
COMMAND = "python -m experiments.privacy_mechanisms"
DELTA, CLIP, TARGET = 1e-5, 1.0, 4.0
#: DECOR's sigma_cor / sigma_ind, fixed before any run (not tuned on accuracy).
DECOR_RATIO = 4.0
#: ZIP-DL's per-draw std over DP-SGD's noise std on the model (`zipdl.noise_ratio`), fixed before
#: any run: its zero-sum noise as large as the DP noise of one step.
ZIPDL_RATIO = 1.0
ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1,iters=1"))
MECHANISMS = ("local", "muffliato", "zipdl", "decor")
TOPOLOGIES = ("ring:8", "ring:16", "exponential:16")
#: Per peer: SHARD records, half of them members (trained on), half held out (no peer trains on
#: them); synthetic_logreg keeps 80 % of n for training.
COMMON = {
    False: dict(
        data="synthetic_logreg:d=20,classes=10,n={n}",
        model="logreg",
        batch_size=64,
        lr=0.5,
        epochs=32,
        seeds=(0, 1, 2),
        shard=1000,
    ),
    True: dict(
        data="synthetic_logreg:d=20,classes=4,n={n}",
        model="logreg",
        batch_size=32,
        lr=0.5,
        epochs=4,
        seeds=(0,),
        shard=200,
    ),
}
#: The attacker (it records what it receives), and the held-out share of every peer's shard.
OBSERVER, FRACTION = 0, 0.5
#: LiRA's reference models per seed (each candidate in half of them).
REFERENCES = {False: 8, True: 2}
#: The network bound is computed on the view of the first NETWORK_STEPS steps (a lower bound on
#: the whole run's: the view only grows), doubled until it settles the minimum with DP-SGD's
#: bound, or up to the whole run (the exact view of a 16-peer graph over 512 steps takes minutes).
NETWORK_STEPS = 128
#: The learning-rate schedules `--schedule` takes (the trainer's names); the first is the default.
SCHEDULES = ("constant", "cosine")


def setting_of(topology: str, quick: bool, schedule: str = SCHEDULES[0]) -> Dict[str, Any]:
    """The run setting on `topology`: every peer `shard` members (and as many held out), the
    learning rate following `schedule`."""
    import topologies

    setting = dict(COMMON[quick], schedule=schedule)
    peers = topologies.parse(topology).size
    n = peers * setting["shard"] * 2 * 5 // 4  # 80 % training: 2 * shard per peer
    setting.update(topology=topology, peers=peers, dataset=setting.pop("data").format(n=n))
    return setting


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def calibrate(setting: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each mechanism's noise for epsilon = TARGET against a neighbour, and its epsilons."""
    import topologies

    from gossip_powersgd.privacy.accounting import noise_for_target, pld_epsilon
    from gossip_powersgd.privacy.mechanisms import muffliato
    from gossip_powersgd.privacy import network_dp

    topology = topologies.parse(setting["topology"])
    n = topology.size
    far = int(max(range(n), key=lambda u: muffliato.hops(topology, 0)[u]))
    q = setting["batch_size"] / setting["shard"]
    steps = setting["epochs"] * math.ceil(setting["shard"] / setting["batch_size"])
    local_sigma = noise_for_target(TARGET, DELTA, [q], steps, "rdp")

    def local_eps(sigma):
        return {"rdp": _rdp(sigma, q, steps), "pld": pld_epsilon([(sigma, q, steps)], DELTA)}

    out: Dict[str, Dict[str, Any]] = {}
    base = local_eps(local_sigma)
    out["local"] = dict(
        sigma=local_sigma,
        extra="—",
        neighbour=base["rdp"],
        far=base["rdp"],
        neighbour_pld=base["pld"],
        local=base["rdp"],
        note="DP-SGD: the same epsilon against every peer",
    )
    local_eps_rdp = _rdp(local_sigma, q, steps)

    def settled(zero_sum: float, name: str):
        """The observer's leakage over the first T steps, T doubled from NETWORK_STEPS until its
        network bound at DP-SGD's sigma is above DP-SGD's epsilon for the neighbour and the most
        distant peer (then min(local, network) is DP-SGD's, exactly) or T is the whole run."""
        span = min(steps, NETWORK_STEPS)
        while True:
            started = time.perf_counter()
            leak = muffliato.network_leakage(topology, span, observer=0, zero_sum=zero_sum)
            log(
                f"{name} view of observer 0 over {span} of {steps} steps: "
                f"{time.perf_counter() - started:.0f} s; l = "
                f"{{{', '.join(f'{u}: {v:.1f}' for u, v in leak.items())}}}"
            )
            net = [
                float(network_dp.gaussian_epsilon(math.sqrt(leak[u]) / local_sigma, DELTA))
                for u in (1, far)
            ]
            if span == steps or min(net) >= local_eps_rdp:
                return leak, span
            span = min(steps, 2 * span)

    def pairwise(leak):
        """sigma for TARGET against the neighbour (peer 1) with epsilon = min(local, network)."""

        def eps(sigma, u):
            net = float(network_dp.gaussian_epsilon(math.sqrt(leak[u]) / sigma, DELTA))
            return min(_rdp(sigma, q, steps), net), net

        lo, hi = 0.05, local_sigma  # the min is <= local: sigma <= local_sigma reaches the target
        if eps(hi, 1)[1] < _rdp(hi, q, steps):  # the network bound is the better one: less noise
            while hi / lo > 1.001:
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if eps(mid, 1)[0] > TARGET else (lo, mid)
        return hi, eps(hi, 1), eps(hi, far)

    def network_row(sigma, near, away, extra, note):
        (nb, nb_net), (fa, fa_net) = near, away
        return dict(
            sigma=sigma,
            extra=extra,
            neighbour=nb,
            far=fa,
            neighbour_pld=local_eps(sigma)["pld"],
            local=_rdp(sigma, q, steps),
            network_neighbour=nb_net,
            network_far=fa_net,
            note=note.format(nb=nb_net, fa=fa_net),
        )

    zip_sigma = ZIPDL_RATIO * setting["lr"] * local_sigma * CLIP / setting["batch_size"]
    if not muffliato.network_applies("exact", 0.0, setting["schedule"], 0.0):
        # The network bounds model a constant step; the local bound holds under any schedule.
        why = (
            f"local bound only: the network view models a constant lr, this run's is "
            f"{setting['schedule']}"
        )
        out["muffliato"] = dict(out["local"], note=f"{why} (same noise as DP-SGD)")
        out["zipdl"] = dict(
            out["local"],
            extra=f"zero-sum std {zip_sigma:.3g} per draw",
            zipdl_sigma=zip_sigma,
            note=f"{why}; the zero-sum noise is extra noise on the messages",
        )
    else:
        network_rows(out, settled, pairwise, network_row, far, steps, setting)
    _decor_row(out, topology, q, steps, far)
    for row in out.values():
        row.update(q=q, steps=steps, far_peer=far)
    return out


def network_rows(out, settled, pairwise, network_row, far, steps, setting) -> None:
    """Muffliato's and ZIP-DL's rows with min(local, network view) (constant lr only)."""
    # Muffliato: network bound on exact gossip (plain SGD, constant lr); leakage independent of sigma
    leak, span = settled(0.0, "Muffliato")
    sigma, near, away = pairwise(leak)
    bound = "network bound alone" + (
        f" (view of the first {span} steps: a lower bound)" if span < steps else ""
    )
    sign = "≥ " if span < steps else ""
    out["muffliato"] = network_row(
        sigma,
        near,
        away,
        "—",
        f"min(local, network view); {bound}: neighbour {sign}{{nb:.3g}}, peer {far} hops "
        f"away {sign}{{fa:.3g}} (exact gossip only; PowerGossip: local)",
    )
    out["muffliato"]["network_steps"] = span
    # ZIP-DL: the same view with its zero-sum draws added (rho fixed, so l does not depend on sigma)
    zip_leak, span = settled(ZIPDL_RATIO, "ZIP-DL")
    sigma, near, away = pairwise(zip_leak)
    bound = "network bound alone" + (
        f" (view of the first {span} steps: a lower bound)" if span < steps else ""
    )
    sign = "≥ " if span < steps else ""
    zip_sigma = ZIPDL_RATIO * setting["lr"] * sigma * CLIP / setting["batch_size"]
    out["zipdl"] = dict(
        network_row(
            sigma,
            near,
            away,
            f"zero-sum std {zip_sigma:.3g} per draw",
            f"min(local, network view with the zero-sum noise); {bound}: neighbour "
            f"{sign}{{nb:.3g}}, peer {far} hops away {sign}{{fa:.3g}} (exact gossip only; "
            "PowerGossip: local)",
        ),
        zipdl_sigma=zip_sigma,
        network_steps=span,
    )


def _decor_row(
    out: Dict[str, Dict[str, Any]], topology: topologies.Topology, q: float, steps: int, far: int
) -> None:
    """DECOR's row: SecLDP, its noise on the gradient sum (valid under any lr schedule)."""
    from gossip_powersgd.privacy.mechanisms import decor

    adjacency = decor.adjacency_of(topology)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        s_ind = decor.sigma_ind_for_target(
            TARGET, adjacency, DECOR_RATIO, q, steps, DELTA, [(1, 0)]
        )
        s_cor = DECOR_RATIO * s_ind
        nb = decor.secldp_epsilon(adjacency, s_ind, s_cor, 1, 0, q, steps, DELTA)
        fa = decor.secldp_epsilon(adjacency, s_ind, s_cor, far, 0, q, steps, DELTA)
        nb_pld = decor.secldp_epsilon(adjacency, s_ind, s_cor, 1, 0, q, steps, DELTA, "pld")
    out["decor"] = dict(
        sigma=s_ind,
        extra=f"sigma_cor {s_cor:.3g} per pair",
        sigma_cor=s_cor,
        neighbour=nb,
        far=fa,
        neighbour_pld=nb_pld,
        local=_rdp(s_ind, q, steps),
        note=(
            "SecLDP; 'local' = against a peer holding all the victim's pair keys (sigma_ind alone)"
        ),
    )


def _rdp(sigma: float, q: float, steps: int) -> float:
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant

    check = make_accountant("rdp")
    check.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return epsilon(check, DELTA)


def victims_of(setting: Dict[str, Any]) -> List[int]:
    """The attacked peers: the observer's neighbours 1 and n - 1 (direct neighbours on every
    topology here)."""
    import topologies

    peers = setting["peers"]
    near = set(topologies.parse(setting["topology"]).neighbors(OBSERVER))
    chosen = sorted({1 % peers, peers - 1})
    if not set(chosen) <= near:
        raise ValueError(f"peers {chosen} are not all neighbours of {OBSERVER} on this topology")
    return chosen


def split_of(setting: Dict[str, Any], seed: int):
    """Every peer's shard split into members and held-out records (the seed's draw)."""
    from gossip_powersgd.privacy.heldout import make_split

    return make_split(
        setting["dataset"],
        setting["peers"],
        "iid",
        seed=0,
        victims=range(setting["peers"]),
        fraction=FRACTION,
        split_seed=seed,
    )


def train_row(setting, spec, mechanism, noise, seed, refs_cache) -> Dict[str, Any]:
    """Train one run on the seed's split with observer 0 recording, and attack its neighbours."""
    from experiments.privacy_attacks.measure import Snapshots
    from experiments.suite.runs import run_one
    from gossip_powersgd.privacy.views import ObservedView, ObserverHooks

    split = split_of(setting, seed)
    overrides = dict(
        topology=setting["topology"],
        dataset=split.spec(),
        partition="local",
        public_train_size=setting["peers"] * setting["shard"],  # sizes an epoch; public anyway
        model=setting["model"],
        batch_size=setting["batch_size"],
        lr=setting["lr"],
        momentum=0.0,
        weight_decay=0.0,
        schedule=setting["schedule"],
        warmup_epochs=0,
        epochs=setting["epochs"],
        eval_every=max(1, setting["epochs"] // 4),  # quarters: the plateau check
        seed=seed,
        algorithm=spec,
        comm_timeout=600.0,
    )
    if mechanism is not None:
        overrides.update(
            dp_noise_multiplier=noise["sigma"],
            dp_max_grad_norm=CLIP,
            dp_delta=DELTA,
            dp_mechanism=mechanism,
        )
        if mechanism == "zipdl":
            overrides["dp_zipdl_sigma"] = noise["zipdl_sigma"]
        if mechanism == "decor":
            overrides["dp_decor_sigma_cor"] = noise["sigma_cor"]
    hooks: Dict[int, Dict[str, Any]] = {}

    def make_hooks(rank: int):
        mine = hooks[rank] = {"snap": Snapshots((1.0,))}
        if rank == OBSERVER:
            mine["observer"] = ObserverHooks([OBSERVER])
        return list(mine.values())

    m = run_one(overrides, make_hooks=make_hooks)
    if noise is not None and m["steps"] != noise["steps"]:
        raise RuntimeError(
            f"the run took {m['steps']} steps, the calibration assumed "
            f"{noise['steps']}: fix SETTINGS"
        )
    recorder = hooks[OBSERVER]["observer"].recorder
    view = ObservedView(recorder.meta, recorder.records)
    snaps = {k: h["snap"].parameters for k, h in hooks.items()}
    m.update(attack(setting, split, view, snaps, seed, refs_cache))
    at = {round(e["epoch"] * 4 / setting["epochs"]): e["acc_avg"] for e in m["evals"]}
    m["acc_half"], m["acc_3q"] = at.get(2, float("nan")), at.get(3, float("nan"))
    return m


#: The page's attack figures: (model, attack) pairs and the blind baselines, as flat keys.
ATTACK_MODELS = ("received", "victim's own")
ATTACKS = ("LOSS", "LiRA offline")


def attack(setting, split, view, snaps, seed, refs_cache) -> Dict[str, Any]:
    """Privacy IV's attacks (`experiments.privacy_attacks.attacks`) by the observer on its
    neighbours at the last step: through the model it reads off their messages (exact gossip)
    or reconstructs from them (PowerGossip: `reconstruction.reconstruct`, 4 messages), and,
    as the ceiling, through the victim's own model; with the blind baselines and null band."""
    from experiments.privacy_attacks.attacks import Candidates, References, evaluate, flat
    from gossip_powersgd.privacy.membership import model_with_parameters
    from gossip_powersgd.privacy.reconstruction import reconstruct
    from gossip_powersgd.training.models import build_model

    base = split.data()
    victims = victims_of(setting)
    candidates = Candidates.of(split, victims)

    def model(parameters):
        fresh = build_model(setting["model"], base.input_shape, base.num_classes, 0)
        return model_with_parameters(fresh, parameters)

    if seed not in refs_cache:
        recipe = dict(
            epochs=setting["epochs"], lr=setting["lr"], batch=setting["batch_size"], momentum=0.0
        )
        refs_cache[seed] = References.build(
            split,
            candidates,
            OBSERVER,
            lambda: build_model(setting["model"], base.input_shape, base.num_classes, 0),
            setting["references"],
            recipe,
            seed,
        )
    refs = refs_cache[seed]
    last = max(next(iter(snaps.values())))
    received = {}
    for v in victims:
        estimates = reconstruct(view, v, window=4)
        received[v] = model(estimates[max(k for k in estimates if k <= last)])
    models = {
        "received": received,
        "victim's own": {v: model(snaps[v][last]) for v in victims},
    }
    evaluation = evaluate(models, candidates, refs, split)
    out = {k: v for k, v in flat(evaluation).items()}
    band = evaluation["null_band"]
    out.update(
        {
            "null/auc": band["auc"],
            "null/tpr0.1": band["tpr"][0],
            "null/tpr1": band["tpr"][1],
            "members": int(candidates.member.sum()),
            "nonmembers": int((~candidates.member).sum()),
            "victims": victims,
            "reference_seconds": refs.seconds,
        }
    )
    return out


def _pm(values: List[float], pct: bool = True) -> str:
    scale = 100 if pct else 1
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.2f}{' %' if pct else ''}"
    return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}{' %' if pct else ''}"


#: Relative cost of a run by mechanism (measured: DECOR's per-pair noise costs most), so that
#: ``--jobs`` starts the longest runs first and the last ones to finish are short.
COST = {"decor": 3, "zipdl": 2, "muffliato": 2, "local": 2, "none": 1}
#: A worker process's LiRA references, per setting and seed (built once, reused by its runs).
_REFS: Dict[str, Dict[int, Any]] = {}


def _single_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _row(setting, label, spec, mechanism, noise, seed) -> Dict[str, Any]:
    """One planned run, trained and attacked, as its page row."""
    log(f"{setting['topology']} {label} {mechanism} seed {seed}")
    refs = _REFS.setdefault(json.dumps(setting, sort_keys=True, default=str), {})
    begun = time.perf_counter()
    m = train_row(setting, spec, None if mechanism == "none" else mechanism, noise, seed, refs)
    m["attack_seconds"] = time.perf_counter() - begun - m["run_seconds"]
    return dict(m, topology=setting["topology"], mechanism=mechanism, algorithm=label, seed=seed)


def run_plan(tasks: List[tuple], jobs: int) -> List[Dict[str, Any]]:
    """`_row(*task)` for every task, `jobs` at a time (spawned processes when more than one, the
    costliest first: `experiments.engine.pool.run_pool`), returned in the tasks' order. Every run
    seeds its own randomness, and a private run's noise is secret (fresh entropy), so only the
    non-private rows repeat exactly."""
    from experiments.engine.pool import run_pool

    costs = [COST[task[3]] for task in tasks]
    return run_pool(_row, tasks, jobs, costs=costs, initializer=_single_thread)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run")
    parser.add_argument(
        "--topologies",
        default=None,
        help=f"comma-separated topologies (default {','.join(TOPOLOGIES)}; --quick: ring:4)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per run (default 32; --quick: 4): the calibration follows the run's steps",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=SCHEDULES[0],
        help="the learning rate's schedule (default constant; cosine: decayed to 0 over the run); "
        "Muffliato's and ZIP-DL's network bounds need constant, else they report the local bound",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/privacy-mechanisms, or runs/privacy-mechanisms-quick "
        "with --quick; the committed page: --out experiments/results)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: draw the page again from the JSON a finished run left in --out (its "
        "header, date, load and commit kept)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="run nothing: join finished runs of the same plan on different --topologies (made "
        "side by side, one per core) into one page in --out, each run's sentence kept",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at once, in worker processes (default 1; one per core: the page's "
        "figures do not depend on it, its wall time does)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs {args.jobs}: give 1 or more runs at once")
    if args.render_only:
        return render_again(args.out or DEFAULT_OUT)
    if args.merge:
        return merge(args.merge, args.out or DEFAULT_OUT, argv)
    import torch
    import topologies as topology_specs

    from experiments.suite.tables import generated_sentence

    torch.set_num_threads(1)
    names = (args.topologies or ("ring:4" if args.quick else ",".join(TOPOLOGIES))).split(",")
    for name in names:
        try:
            topology_specs.parse(name)
        except Exception as error:  # noqa: BLE001 - any parse failure is bad input
            raise SystemExit(f"--topologies: {name!r} is not a topology ({error})") from None
    if args.epochs is not None and args.epochs < 4:
        raise SystemExit(
            f"--epochs must be at least 4 (evaluated at every quarter), got {args.epochs}"
        )
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    sections = []
    rows: List[Dict[str, Any]] = []
    for name in names:
        setting = dict(
            setting_of(name, args.quick, args.schedule), references=REFERENCES[args.quick]
        )
        if args.epochs is not None:
            setting["epochs"] = args.epochs
        victims_of(setting)  # refuse a topology without the attacked neighbours before training
        begun = time.perf_counter()
        noises = calibrate(setting)
        calibration_seconds = time.perf_counter() - begun
        for mechanism, row in noises.items():
            log(
                f"{name} {mechanism}: sigma {row['sigma']:.4g} {row['extra']}; eps neighbour "
                f"{row['neighbour']:.3g}"
            )
        reuse_muffliato = abs(noises["muffliato"]["sigma"] - noises["local"]["sigma"]) < 1e-9
        tasks = [
            (label, spec, mechanism, None if mechanism == "none" else noises[mechanism], seed)
            for label, spec in ALGORITHMS
            for mechanism in ("none",) + MECHANISMS
            if not (mechanism == "muffliato" and reuse_muffliato)
            for seed in setting["seeds"]
        ]
        sections.append(
            dict(
                setting=setting,
                noises=noises,
                tasks=tasks,
                reuse_muffliato=reuse_muffliato,
                calibration_seconds=calibration_seconds,
            )
        )
    every = [(s["setting"], *task) for s in sections for task in s.pop("tasks")]
    done = run_plan(every, args.jobs)
    for section in sections:
        mine = [m for m in done if m["topology"] == section["setting"]["topology"]]
        # a run's own seconds (training and its attack), so the section's time means the same
        # with --jobs 1 or more (with more, runs overlap and the sum exceeds the wall time)
        section.update(
            rows=mine,
            seconds=section["calibration_seconds"]
            + sum(m["run_seconds"] + m["attack_seconds"] for m in mine),
        )
        rows += mine
    seconds = time.perf_counter() - started
    out_dir = args.out or DEFAULT_OUT.with_name(
        "privacy-mechanisms-quick" if args.quick else "privacy-mechanisms"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "privacy_mechanisms.csv", rows)
    atomic_write(  # every number the page shows, before it is rendered
        out_dir / "privacy_mechanisms.json",
        json.dumps(
            [
                dict(s, rows=[{k: v for k, v in r.items() if k != "curve"} for r in s["rows"]])
                for s in sections
            ],
            indent=1,
            default=str,
        ).encode(),
    )
    per_step = statistics.fmean(r["run_seconds"] / r["steps"] for r in rows)
    command = (
        COMMAND
        + (" --quick" if args.quick else "")
        + (f" --topologies {args.topologies}" if args.topologies else "")
        + (f" --epochs {args.epochs}" if args.epochs is not None else "")
        + (f" --schedule {args.schedule}" if args.schedule != SCHEDULES[0] else "")
        + (f" --jobs {args.jobs}" if args.jobs != 1 else "")
        + (f" --out {args.out}" if args.out else "")
    )
    header = dict(
        generated=generated_sentence(command, seconds),
        command=command,
        load=[load_start, os.getloadavg()[0]],
        nice=os.nice(0),
        per_step=per_step,
    )
    page = render(sections, header["generated"], command, measured(header))
    atomic_write(out_dir / "privacy_mechanisms.md", page.encode())
    atomic_write(out_dir / HEADER_JSON, json.dumps(header, indent=1).encode())
    log(f"wrote {out_dir / 'privacy_mechanisms.md'} in {seconds:.0f} s")


#: What a run's page header holds besides the JSON's numbers (its sentence, command, load and
#: time per step), so that --render-only can draw the same page again.
HEADER_JSON = "privacy_mechanisms.header.json"


def render_again(out_dir: Path) -> None:
    """The page drawn again from `out_dir`'s JSON and the header its run saved beside it (a
    rendering fix needs no new runs)."""
    source, saved = out_dir / "privacy_mechanisms.json", out_dir / HEADER_JSON
    for needed in (source, saved):
        if not needed.exists():
            raise SystemExit(
                f"error: --render-only needs a finished run's {needed}; run without --render-only"
            )
    sections = json.loads(source.read_text())
    header = json.loads(saved.read_text())
    from experiments.engine.provenance import page_commit

    again = (
        f"{header['generated']} Drawn again from its JSON, no run changed, by "
        f"`{COMMAND} --render-only --out {out_dir}` at commit {page_commit()}."
    )
    page = render(sections, again, header["command"], measured(header))
    atomic_write(out_dir / "privacy_mechanisms.md", page.encode())
    log(f"drew {out_dir / 'privacy_mechanisms.md'} again from {source}")


def measured(header: Dict[str, Any]) -> Dict[str, Any]:
    """What the page says of how its runs were made, from a header (a merged page's header
    holds one load pair and one nice value per run; a header from before niceness was recorded
    has none, and the page then says nothing of it)."""
    loads = header["load"]
    loads = [tuple(pair) for pair in loads] if isinstance(loads[0], list) else [tuple(loads)]
    nice = header.get("nice")
    return dict(
        load=loads, nice=nice if isinstance(nice, list) else [nice], per_step=header["per_step"]
    )


def merge(dirs: List[Path], out_dir: Path, argv) -> None:
    """One page from finished runs of the same plan on different topologies: their sections
    joined in the order given, each run's generated sentence and load kept, the time per step
    averaged over all their rows; refused (one line) unless every run has the same setting but
    its topology and no topology comes twice."""
    from experiments.engine.provenance import page_commit

    runs = []
    for d in dirs:
        source, saved = d / "privacy_mechanisms.json", d / HEADER_JSON
        if not source.is_file() or not saved.is_file():
            raise SystemExit(
                f"error: --merge {d}: no finished run there (its privacy_mechanisms.json and "
                f"{HEADER_JSON}); make it with `{COMMAND} --out {d}` first"
            )
        runs.append((json.loads(source.read_text()), json.loads(saved.read_text())))
    sections = [s for secs, _ in runs for s in secs]
    topologies = [s["setting"]["topology"] for s in sections]
    if len(set(topologies)) < len(topologies):
        raise SystemExit(f"error: --merge: a topology comes twice ({', '.join(topologies)})")

    def plan(section):  # the setting but what follows from the topology (peers, data size)
        setting = dict(section["setting"])
        for key in ("topology", "peers"):
            setting.pop(key, None)
        setting["dataset"] = re.sub(r",n=\d+", "", setting["dataset"])
        return setting

    for section in sections[1:]:
        if plan(section) != plan(sections[0]):
            differ = sorted(
                k
                for k in set(plan(section)) | set(plan(sections[0]))
                if plan(section).get(k) != plan(sections[0]).get(k)
            )
            raise SystemExit(
                f"error: --merge: {section['setting']['topology']} was run with another plan than "
                f"{topologies[0]} (differs in {', '.join(differ)}): merge runs of one command's "
                "options, --topologies apart"
            )
    rows = [r for s in sections for r in s["rows"]]
    argv = argv if argv is not None else sys.argv[1:]
    command = "\n".join(
        [h["command"] for _, h in runs] + [COMMAND + "".join(f" {a}" for a in argv)]
    )
    header = dict(
        generated=" ".join(h["generated"] for _, h in runs)
        + f" Joined into one page by `{COMMAND} --merge ...` at commit {page_commit()}.",
        command=command,
        load=[list(p) for _, h in runs for p in measured(h)["load"]],
        nice=[n for _, h in runs for n in measured(h)["nice"]],
        per_step=statistics.fmean(r["run_seconds"] / r["steps"] for r in rows),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "privacy_mechanisms.csv", rows)
    atomic_write(out_dir / "privacy_mechanisms.json", json.dumps(sections, indent=1).encode())
    atomic_write(out_dir / HEADER_JSON, json.dumps(header, indent=1).encode())
    page = render(sections, header["generated"], command, measured(header))
    atomic_write(out_dir / "privacy_mechanisms.md", page.encode())
    log(f"joined {len(runs)} runs into {out_dir / 'privacy_mechanisms.md'}")


def write_csv(path: Path, rows) -> None:
    keys = (
        [
            "topology",
            "mechanism",
            "algorithm",
            "seed",
            "acc_half",
            "acc_3q",
            "acc_avg",
            "acc_local_mean",
            "acc_local_min",
            "mb_per_peer",
            "steps",
            "run_seconds",
            "members",
            "nonmembers",
        ]
        + [
            f"{metric}/{model}/{attack}"
            for model in ATTACK_MODELS + ("blind model",)
            for attack in ATTACKS
            for metric in ("auc", "tpr1", "tpr0.1")
        ]
        + [f"{metric}/class prior" for metric in ("auc", "tpr1", "tpr0.1")]
    )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, buffer.getvalue().encode())


def render(sections, generated, command, measured) -> str:
    from experiments.privacy_mechanisms_page import render_page

    return render_page(
        sections,
        generated,
        command,
        dict(
            target=TARGET,
            delta=DELTA,
            clip=CLIP,
            ratio=DECOR_RATIO,
            algorithms=[a for a, _ in ALGORITHMS],
            observer=OBSERVER,
            fraction=FRACTION,
            network_steps=NETWORK_STEPS,
            **measured,
        ),
        _pm,
    )


if __name__ == "__main__":
    main()
