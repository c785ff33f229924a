"""The attack pages' plans and runs: the network-DP matrices, each seed's split, then the runs in
order of priority, observer 0 recording, its two neighbours attacked at each of ROUNDS."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Dict, List, Mapping

from experiments.engine import Run
from experiments.pages._privacy import DELTA, NONPRIVATE_LR, membership_split, references

from .regimes import FRACTION, OBSERVER, ROUNDS, dp_recipe, regime


def key(spec: str, target, seed: int) -> str:
    return f"{spec}/{'no DP' if target is None else f'eps={target:g}'}/seed{seed}"


def configs(r: Mapping[str, Any]):
    """(split, train, reference) configs of regime `r`: the split, the base run, the references."""
    setting = r["setting"]
    split = {k: setting[k] for k in ("dataset", "partition", "topology")}
    split.update(fraction=FRACTION, observer=OBSERVER)
    train = {k: v for k, v in setting.items() if k not in ("dp", "reference_lr")}
    train.update(out_dir=None, release_peer_statistics=True)
    reference = dict(epochs=setting["epochs"], lr=setting.get("reference_lr", NONPRIVATE_LR))
    reference.update({k: setting[k] for k in ("momentum", "warmup_epochs")})
    reference["batch"] = setting["batch_size"]
    if r.get("gossip_references"):  # whole gossip runs in the non-private recipe (the audit)
        reference = dict(kind="gossip", train=dict(train, algorithm="exact"))
        reference["train"]["eval_every"] = setting["epochs"]
    return split, train, reference


def plan(name: str, quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    r = regime(name, quick)
    setting, runs = r["setting"], []
    if r["network"]:
        runs.append(Run("network", dict(kind="network", **r["network"])))
    split, train, reference = configs(r)
    runs += [Run(f"split/seed{s}", dict(kind="split", split=split), s) for s in r["seeds"]]
    canaries = min(r.get("canaries", 0), 32) if quick else r.get("canaries", 0)
    count, referenced = r["references"], set()
    waves = r.get("seed_waves", (r["seeds"],))  # the seeds of every group, wave by wave
    order = [(g, s) for wave in waves for g in r["groups"] for s in wave if s in r["seeds"]]
    for group, seed in order:
        if reference.get("kind") == "gossip" and seed not in referenced:
            referenced.add(seed)  # each its own run: --jobs builds them side by side
            config = dict(kind="reference", reference=reference, count=count, split=split)
            runs += [
                Run(f"reference/seed{seed}/{k}", dict(config, k=k), seed) for k in range(count)
            ]
        for spec, target in group:
            mine = dict(train, algorithm=spec)
            if target is not None:
                mine.update(dp_recipe(setting, target), dp_target_epsilon=target)
            mine["eval_every"] = max(1, mine["epochs"] // 4)  # quarters: the plateau check
            config = dict(kind="attack", spec=spec, target=target, train=mine, split=split)
            config.update(reference=reference, references=r["references"])
            if canaries:
                config["canaries"] = canaries
            runs.append(Run(key(spec, target, seed), config, seed))
    # --jobs starts the costliest first: the cost is the plan's order of priority
    return [dataclasses.replace(run, cost=len(runs) - n) for n, run in enumerate(runs)]


def row(run: Run) -> Dict[str, Any]:
    kind = run.config["kind"]
    if kind == "network":
        from .network import network_dp

        return network_dp(run.config)
    split = membership_split(run.config["split"], run.seed)
    if kind == "split":
        return dict(key=split.key(), record=split.record())
    if kind == "reference":
        return reference_row(run.config, run.seed, split)
    try:
        return attacked(run.config, run.seed, split)
    except Exception as exc:  # one failed run is a row of the page, not a lost page
        from gossip_powersgd.utils import one_line

        failed = dict(spec=run.config["spec"], target=run.config["target"], seed=run.seed)
        return dict(failed, failure=one_line(exc, 200))


def reference_row(c: Mapping[str, Any], seed: int, split) -> Dict[str, Any]:
    """One gossip-trained LiRA reference run, cached for its seed's runs; its row: its cost."""
    import time

    from gossip_powersgd.privacy.attacks import Candidates
    from gossip_powersgd.privacy.gossip_references import reference_stats

    started, train = time.perf_counter(), c["reference"]["train"]
    phi, _ = reference_stats(split, Candidates.of(split), train, c["count"], seed, OBSERVER, c["k"])
    return dict(k=c["k"], seconds=time.perf_counter() - started, phi_mean=float(phi.mean()))


def attacked(c: Mapping[str, Any], seed: int, split) -> Dict[str, Any]:
    """Train with the seed's split (DP at the target epsilon, or none), attack, measure."""
    import torch

    from gossip_powersgd.privacy.attack_run import canary_audit, neighbour_report, observe
    from gossip_powersgd.privacy.attack_run import victim_accuracy
    from gossip_powersgd.privacy.attacks import Candidates, References
    from gossip_powersgd.privacy.canaries import canary_hooks
    from gossip_powersgd.privacy.dp_report import peer_epsilons
    from gossip_powersgd.privacy.gossip_references import gossip_references
    from gossip_powersgd.training.models import build_model

    torch.set_num_threads(1)
    base, victims = split.data(), split.victims
    hooks = canary_hooks(victims, base, c["canaries"], seed) if c.get("canaries") else []
    run = observe(dict(c["train"], seed=seed), split, OBSERVER, ROUNDS, hooks)
    config, summary = run.result.config, run.result.summary
    candidates, last = Candidates.of(split), run.steps[-1]

    def make():
        return build_model(config.model, base.input_shape, base.num_classes, 0)

    reference, count = c["reference"], c["references"]
    if reference.get("kind") == "gossip":
        args = (split, candidates, reference["train"], count, seed, OBSERVER)
        build = functools.partial(gossip_references, *args)
    else:
        args = (split, candidates, OBSERVER, make, count, reference, seed)
        build = functools.partial(References.build, *args)
    refs = references([reference, count, split.key()], build)
    out = {"rounds": neighbour_report(run, split, OBSERVER, refs, make, base.x_test)}
    evals = [dict(epoch=e["epoch"], acc_avg=e["test_acc_avg_model"]) for e in run.result.evals]
    for e, record in zip(evals, run.result.evals):
        e["consensus"] = record.get("consensus_distance")
        e.update(acc_local_mean=record["test_acc_mean"], acc_local_min=record["test_acc_min"])
    epsilons = peer_epsilons(summary)
    victim_acc = victim_accuracy(run, victims, make, base.x_test, base.y_test)
    if hooks:
        initial = build_model(config.model, base.input_shape, base.num_classes, config.seed)
        delta = c["train"].get("dp_delta", DELTA)
        out["audit"] = canary_audit(hooks, run, make, initial, delta, blind=refs.blind)
    out.update(spec=c["spec"], target=c["target"], seed=seed, steps=summary["steps"], last=last)
    out.update(round_steps=run.steps, epochs=config.epochs, batch=config.batch_size, lr=config.lr)
    out.update(acc_avg=summary["final_test_acc_avg_model"], evals=evals, eps_max=max(epsilons))
    out.update(acc_victim=sum(victim_acc) / len(victim_acc), sigma=summary.get("noise_multiplier"))
    out.update(consensus=summary.get("final_consensus_distance"), split=split.key())
    out["eps_victims"] = [epsilons[v] for v in victims] if len(epsilons) > 1 else None
    out.update(mb_sent_per_peer=summary["mb_sent_per_peer"], observed_mb=run.observed_bytes / 1e6)
    out.update(run_seconds=run.seconds, reference_cpu_seconds=refs.seconds)
    member = candidates.member
    out.update(members=int(member.sum()), nonmembers=int((~member).sum()))
    return dict(out, load=os.getloadavg()[0])
