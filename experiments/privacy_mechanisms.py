"""`python -m experiments.privacy_mechanisms [--quick] [--out DIR]`: local DP-SGD, Muffliato, ZIP-DL
and DECOR at equal epsilon against a neighbour, on exact gossip and PowerGossip r1:
privacy_mechanisms.md and its CSV in DIR (default runs/privacy-mechanisms; the committed page is
made with --out experiments/results).

Every mechanism's noise is calibrated before training so that the victim's epsilon against a direct
neighbour (ring:8, victim 1, neighbour 0; the ring is vertex transitive) is the target, with that
mechanism's own valid accountant (`privacy.mechanisms`); then each (mechanism, algorithm) trains
with seeds 0, 1, 2. ``--quick`` is a seconds-long smoke run (4 peers, 2 epochs, 1 seed) that writes
its page to runs/privacy-mechanisms-quick unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List

from gossip_powersgd.utils import atomic_write

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
SETTINGS = {
    False: dict(
        topology="ring:8",
        peers=8,
        dataset="synthetic_logreg:d=20,classes=10,n=10000",
        model="logreg",
        batch_size=64,
        lr=0.5,
        epochs=32,
        seeds=(0, 1, 2),
        shard=1000,
    ),
    True: dict(
        topology="ring:4",
        peers=4,
        dataset="synthetic_logreg:d=20,classes=4,n=1000",
        model="logreg",
        batch_size=32,
        lr=0.5,
        epochs=2,
        seeds=(0,),
        shard=200,
    ),
}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def calibrate(setting: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each mechanism's noise for epsilon = TARGET against a neighbour, and its epsilons."""
    import topologies

    from gossip_powersgd.privacy.accounting import noise_for_target, pld_epsilon
    from gossip_powersgd.privacy.mechanisms import decor, muffliato
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
    # Muffliato: network bound on exact gossip (plain SGD, constant lr); leakage independent of sigma
    started = time.perf_counter()
    leak = muffliato.network_leakage(topology, steps, observer=0)
    log(
        f"Muffliato view of observer 0 over {steps} steps: {time.perf_counter() - started:.0f} s; "
        f"l = {{{', '.join(f'{u}: {v:.1f}' for u, v in leak.items())}}}"
    )

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

    sigma, near, away = pairwise(leak)
    out["muffliato"] = network_row(
        sigma,
        near,
        away,
        "—",
        f"min(local, network view); network bound alone: neighbour {{nb:.3g}}, peer {far} hops "
        "away {fa:.3g} (exact gossip only; PowerGossip: local)",
    )
    # ZIP-DL: the same view with its zero-sum draws added (rho fixed, so l does not depend on sigma)
    started = time.perf_counter()
    zip_leak = muffliato.network_leakage(topology, steps, observer=0, zero_sum=ZIPDL_RATIO)
    log(
        f"ZIP-DL view of observer 0 over {steps} steps: {time.perf_counter() - started:.0f} s; "
        f"l = {{{', '.join(f'{u}: {v:.1f}' for u, v in zip_leak.items())}}}"
    )
    sigma, near, away = pairwise(zip_leak)
    zip_sigma = ZIPDL_RATIO * setting["lr"] * sigma * CLIP / setting["batch_size"]
    out["zipdl"] = dict(
        network_row(
            sigma,
            near,
            away,
            f"zero-sum std {zip_sigma:.3g} per draw",
            f"min(local, network view with the zero-sum noise); network bound alone: neighbour "
            f"{{nb:.3g}}, peer {far} hops away {{fa:.3g}} (exact gossip only; PowerGossip: local)",
        ),
        zipdl_sigma=zip_sigma,
    )
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
    for row in out.values():
        row.update(q=q, steps=steps, far_peer=far)
    return out


def _rdp(sigma: float, q: float, steps: int) -> float:
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant

    check = make_accountant("rdp")
    check.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return epsilon(check, DELTA)


def train_row(setting, spec, mechanism, noise, seed) -> Dict[str, Any]:
    from experiments.suite.runs import run_one

    overrides = dict(
        topology=setting["topology"],
        dataset=setting["dataset"],
        model=setting["model"],
        batch_size=setting["batch_size"],
        lr=setting["lr"],
        momentum=0.0,
        weight_decay=0.0,
        schedule="constant",
        warmup_epochs=0,
        epochs=setting["epochs"],
        eval_every=setting["epochs"],
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
    m = run_one(overrides)
    if noise is not None and m["steps"] != noise["steps"]:
        raise RuntimeError(
            f"the run took {m['steps']} steps, the calibration assumed "
            f"{noise['steps']}: fix SETTINGS"
        )
    return m


def _pm(values: List[float], pct: bool = True) -> str:
    scale = 100 if pct else 1
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.2f}{' %' if pct else ''}"
    return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}{' %' if pct else ''}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/privacy-mechanisms, or runs/privacy-mechanisms-quick "
        "with --quick; the committed page: --out experiments/results)",
    )
    args = parser.parse_args(argv)
    import torch

    from experiments.suite.tables import generated_sentence

    torch.set_num_threads(1)
    setting = SETTINGS[args.quick]
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    noises = calibrate(setting)
    for name, row in noises.items():
        log(
            f"{name}: sigma {row['sigma']:.4g} {row['extra']}; eps neighbour {row['neighbour']:.3g}"
        )
    reuse_muffliato = abs(noises["muffliato"]["sigma"] - noises["local"]["sigma"]) < 1e-9
    rows: List[Dict[str, Any]] = []
    for label, spec in ALGORITHMS:
        log(f"{label} non-private seed {setting['seeds'][0]}")
        m = train_row(setting, spec, None, None, setting["seeds"][0])
        rows.append(dict(m, mechanism="none", algorithm=label, seed=setting["seeds"][0]))
        for mechanism in MECHANISMS:
            if mechanism == "muffliato" and reuse_muffliato:
                continue
            for seed in setting["seeds"]:
                log(f"{label} {mechanism} seed {seed}")
                m = train_row(setting, spec, mechanism, noises[mechanism], seed)
                rows.append(dict(m, mechanism=mechanism, algorithm=label, seed=seed))
    seconds = time.perf_counter() - started
    out_dir = args.out or DEFAULT_OUT.with_name(
        "privacy-mechanisms-quick" if args.quick else "privacy-mechanisms"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "privacy_mechanisms.csv", rows)
    per_step = statistics.fmean(r["run_seconds"] / r["steps"] for r in rows)
    page = render(
        setting,
        noises,
        rows,
        reuse_muffliato,
        generated_sentence(
            COMMAND
            + (" --quick" if args.quick else "")
            + (f" --out {args.out}" if args.out else ""),
            seconds,
        ),
        dict(load=(load_start, os.getloadavg()[0]), per_step=per_step),
    )
    atomic_write(out_dir / "privacy_mechanisms.md", page.encode())
    log(f"wrote {out_dir / 'privacy_mechanisms.md'} in {seconds:.0f} s")


def write_csv(path: Path, rows) -> None:
    keys = [
        "mechanism",
        "algorithm",
        "seed",
        "acc_avg",
        "acc_local_mean",
        "acc_local_min",
        "mb_per_peer",
        "steps",
        "run_seconds",
    ]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, buffer.getvalue().encode())


def render(setting, noises, rows, reuse_muffliato, generated, measured) -> str:
    from experiments.privacy_mechanisms_page import render_page

    return render_page(
        setting,
        noises,
        rows,
        reuse_muffliato,
        generated,
        dict(
            target=TARGET,
            delta=DELTA,
            clip=CLIP,
            ratio=DECOR_RATIO,
            algorithms=[a for a, _ in ALGORITHMS],
            **measured,
        ),
        _pm,
    )


if __name__ == "__main__":
    main()
