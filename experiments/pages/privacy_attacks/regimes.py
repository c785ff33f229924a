"""The regimes of the attack pages, in one place: each one's training setting, DP recipe, plan
(groups of (spec, target epsilon or None) in order of priority, each group seed by seed), seeds,
LiRA reference models, and the words its page says about them. A new regime is a new entry of
REGIMES (and its page's name in `__init__`)."""

from __future__ import annotations

from typing import Any, Dict

from experiments.pages import _privacy as dp

ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1"),
    ("PowerGossip r4", "powergossip:rank=4"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
_EXACT, _R1, _R4, _CHOCO = (spec for _, spec in ALGORITHMS)
#: The observer, and the held-out share of each victim's shard (the victims: its neighbours).
OBSERVER, FRACTION = 0, 0.5
#: The attacks run at these fractions of the run.
ROUNDS = (0.25, 0.5, 0.75, 1.0)
#: The network-DP section (privacy_attacks.md): three 16-peer topologies at one sigma and delta
#: (sensitivity 1), noise once then 2 or 20 gossip steps, and fresh noise at each of 20.
NETWORK = dict(
    topologies=["ring:16", "exponential:16", "complete:16"],
    cases=[["once", 2], ["once", 20], ["every_step", 20]],
    sigma=5.0,
    delta=1e-5,
)

#: privacy_dp_sweep.md's regime (`_privacy`): mnist1d with 8000 training samples per peer, cnn1d,
#: ring:8, iid; non-private rows at the sweep's reference batch and epochs but NONPRIVATE_LR; each
#: victim trains on half its shard (8000 members and 8000 non-members pooled over the two victims:
#: TPR at 0.1 % FPR lets 8 non-members above the threshold).
SETTING = dict(
    {k: dp.BASE[k] for k in ("dataset", "partition", "model", "optimizer", "momentum")},
    lr=dp.NONPRIVATE_LR,
    **{k: dp.BASE[k] for k in ("weight_decay", "warmup_epochs", "schedule")},
    batch_size=dp.NONPRIVATE[1],
    epochs=dp.NONPRIVATE[4],
    backend="local",
    quiet=True,
    log_every=0,
    checkpoint_every=0,
    threads=1,
    comm_timeout=900.0,
    topology=dp.BASE["topology"],
)
#: Private rows: the chosen DP recipe, trained for the budget of the row's epsilon. One public
#: sigma for every peer (release_peer_statistics): the accountant picks the sigma at which the
#: peer with the highest sampling rate meets the target, here the victims (half a shard each).
DP = dict(
    batch_size=dp.DP_BATCH,
    lr=dp.DP_LR,
    dp_max_grad_norm=dp.CLIP,
    dp_delta=dp.DELTA,
    release_peer_statistics=True,
)
#: The overfitting regime: each peer 1000 training samples (each victim trains on 500 and holds
#: 500 out) and an MLP (mnist1d's MLPs memorise where its CNN generalises), 60 epochs at batch 32
#: (the cosine schedule ends at lr 0); private rows: Poisson batches of 64, lr 0.5, clip C = 1.
OVERFIT_SETTING = dict(
    SETTING, dataset="mnist1d:num_samples=10000", model="mlp:256,256", lr=0.05, batch_size=32
)
OVERFIT_SETTING.update(epochs=60, reference_lr=0.05)
OVERFIT_SETTING["dp"] = dict(DP, batch_size=64, lr=0.5, epochs=60)
QUICK_SETTING = dict(
    SETTING,
    dataset="synthetic_logreg:d=20,classes=4,n=1200",
    model="mlp:32",
    lr=0.2,
    momentum=0.0,
    batch_size=32,
    topology="ring:4",
    epochs=2,
    warmup_epochs=0,
    dp=dict(batch_size=32, lr=0.2, dp_max_grad_norm=1.0, dp_delta=1e-5, epochs=2),
    reference_lr=0.2,
)

SCALE_NOTE = (
    "the plan, in its order of priority, 3 seeds of every row: (a) exact gossip and PowerGossip "
    "r1 without DP and at target ε = 8; (b) PowerGossip r4 and Choco sign at ε = 8; (c) exact "
    "gossip at ε = 3 and 1; then PowerGossip r4 and Choco sign without DP; PowerGossip r1 at "
    "ε = 3 and 1; last, PowerGossip r4 and Choco sign at ε = 3. 8 LiRA reference models per "
    "seed (not more: the rows came first). The DP rows train for their ε's budget from "
    "privacy_dp_budget.md (30 epochs at ε = 8 where the sweep chose its recipe at 15, 15 at "
    "ε = 3 and 1): the ε = 8 rows ran again at 30 epochs (`--part dp`, niced, beside two other "
    "jobs on the 2 shared cores), and the rows whose setting and recipe did not change were "
    "taken from the previous page (`--reuse`, each with the commit that made it)."
)
NOT_REACHED = (
    "The non-private rows train at lr 0.1, not at privacy_dp_sweep.md's 0.4 (its non-private "
    "reference, one seed): run at 0.4 (this page's command at commit bf0fd24), exact gossip "
    "without DP ended at 97.9 %, 90.0 % and 10.1 % (chance) on seeds 0, 1 and 2, so the "
    "regime's non-private accuracy is not robust at 0.4; the DP rows keep the sweep's chosen "
    "row unchanged.",
    "Useful accuracy below ε = 8: in this regime DP falls well short of the non-private "
    "accuracy at ε = 3 and reaches none at ε = 1 (the runs table), so the leakage at those ε "
    "is measured on models no one would deploy.",
    "PowerGossip r4 and Choco sign at target ε = 1 were not run (time on the shared machine).",
    "No attack finds members in this regime, even without DP, so where the neighbour's TPR "
    "reaches chance cannot be read here: privacy_attacks_overfit.md answers it where the "
    "models memorise (1000 samples per peer, an MLP).",
    "The LiRA reference models are trained without DP in the non-private recipe, also for "
    "the DP rows (a weaker attacker than one that mimics the victims' DP training); 8 "
    "reference models per seed (4 IN, 4 OUT per candidate), far fewer than the 64+ of Carlini "
    "et al.: online LiRA's AUC here is a lower bound on what LiRA can do.",
    "One public σ for every peer: the victims (half a shard each, sampling rate 256 / 4000) set "
    "it, so the DP rows' σ is higher than privacy_dp_sweep.md's at the same target ε (rate "
    "256 / 8000 there), and the other peers' ε is lower than the target.",
    "The remedies for PowerGossip under DP tried are a higher rank (here and in "
    "privacy_dp_sweep.md) and more power iterations (privacy_dp_sweep.md); noise in the "
    "exchanged subspace and DP on what is sent are not tried.",
)
OVERFIT_SCALE_NOTE = (
    "this page is the companion of privacy_attacks.md, whose regime (8000 samples per peer, "
    "cnn1d) lets DP learn but where no attack separates members from held-out records, even "
    "without DP. Here the models memorise: 1000 samples per peer and an MLP, so that the "
    "attacks have something to find and the ε at which the neighbour's TPR falls to chance "
    "can be read off. Run at nice 15 on one core of the shared machine beside other "
    "engineers' jobs; the plan, in its order of priority, 3 seeds of every row: the four "
    "algorithms without DP; exact gossip at target ε = 64, 16, 8, 3 and 1; PowerGossip r1 at "
    "ε = 64 and 8."
)
OVERFIT_REGIME_TEXT = (
    "Non-private rows: batch {batch}, lr {lr}, {epochs} epochs (the cosine schedule ends at "
    "lr 0; the runs table's last-quarter change says whether a run ended on a plateau). "
    "Private rows: DP-SGD on every peer (Poisson batches of {dp_batch}, lr {dp_lr}, clip "
    "C = {clip}, {dp_epochs} epochs, δ = {delta}; this recipe is not swept: it is the better "
    "of two tried at target ε = 8 (batch 128 at lr 1.0 was the other), and a sweep could "
    "raise the private rows' accuracy), "
)
OVERFIT_NOT_REACHED = (
    "In this regime DP that brings the neighbour's TPR to chance also costs most of the "
    "accuracy (the runs table): the useful-accuracy private rows are on privacy_attacks.md, "
    "where no attack finds members even without DP. A regime where both hold at once (a "
    "model that memorises and still learns under DP) was not found on this machine's budget.",
    "The LiRA reference models train without DP (also for the DP rows) and number 8 per seed "
    "(4 IN, 4 OUT per candidate), far fewer than the 64+ of Carlini et al.; online LiRA's "
    "per-candidate IN/OUT means rest on 4 models each.",
    "With 1000 non-members pooled over the two victims, TPR at 0.1 % FPR lets one non-member "
    "above the threshold: its null band is wide (the band column).",
    "PowerGossip r4 and Choco sign were run without DP only; the remedies for PowerGossip "
    "under DP (noise in the exchanged subspace, DP on what is sent) are not on this page.",
)

#: page name -> its regime. "quick": the --quick plan's (setting, groups, seeds, references).
REGIMES: Dict[str, Dict[str, Any]] = {
    "privacy_attacks": dict(
        setting=SETTING,
        groups=(
            ((_EXACT, None), (_R1, None), (_EXACT, 8.0), (_R1, 8.0)),
            ((_R4, 8.0), (_CHOCO, 8.0)),
            ((_EXACT, 3.0), (_EXACT, 1.0)),
            ((_R4, None), (_CHOCO, None)),
            ((_R1, 3.0), (_R1, 1.0)),
            ((_R4, 3.0), (_CHOCO, 3.0)),
        ),
        seeds=(0, 1, 2),
        references=8,
        network=NETWORK,
        title="What a curious neighbour learns",
        scale_note=SCALE_NOTE,
        not_reached=NOT_REACHED,
        regime_text=None,  # the default regime's own words (`page.regime_text`)
    ),
    "privacy_attacks_overfit": dict(
        setting=OVERFIT_SETTING,
        groups=(
            ((_EXACT, None), (_R1, None)),
            ((_EXACT, 64.0), (_EXACT, 8.0)),
            ((_R4, None), (_CHOCO, None)),
            ((_EXACT, 16.0), (_EXACT, 3.0), (_R1, 64.0), (_R1, 8.0)),
            ((_EXACT, 1.0),),
        ),
        seeds=(0, 1, 2),
        references=8,
        network=None,
        title="What a curious neighbour learns where the models overfit",
        scale_note=OVERFIT_SCALE_NOTE,
        not_reached=OVERFIT_NOT_REACHED,
        regime_text=OVERFIT_REGIME_TEXT,
    ),
}
QUICK = dict(
    setting=QUICK_SETTING,
    groups=(((_EXACT, None), (_R1, None), (_EXACT, 8.0)),),
    seeds=(0, 1),
    references=4,
    scale_note="--quick: a smoke test, not a result.",
    not_reached=(),
)


def regime(name: str, quick: bool) -> Dict[str, Any]:
    """The regime of page `name` (--quick: its small plan, on the page's other choices)."""
    if not quick:
        return REGIMES[name]
    small = dict(NETWORK, topologies=["ring:4"], cases=[["once", 2]])
    return dict(REGIMES[name], **QUICK, network=REGIMES[name]["network"] and small)


def dp_recipe(setting: Dict[str, Any], target: float) -> Dict[str, Any]:
    """The DP keys a row of `target` epsilon trains with in `setting`: a regime's own DP recipe
    carries its epochs; the default one (DP) takes its epsilon's budget (`_privacy.dp_epochs`)."""
    return setting.get("dp") or dict(DP, epochs=dp.dp_epochs(target))
