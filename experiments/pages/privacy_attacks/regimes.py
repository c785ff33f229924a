"""The regimes of the attack pages, in one place: each one's training setting, DP recipe, plan
(groups of (spec, target epsilon or None) in order of priority, each group seed by seed), seeds,
LiRA reference models, and the words its page says about them. A new regime is a new entry of
REGIMES (and its page's name in `__init__`)."""

from __future__ import annotations

from typing import Any, Dict

from experiments.pages import _privacy as dp
from experiments.pages import privacy_regime as sweep

ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1"),
    ("PowerGossip r4", "powergossip:rank=4"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
_EXACT, _R1, _R4, _CHOCO = (spec for _, spec in ALGORITHMS)
#: The observer, and the held-out share of each victim's shard (the victims: its neighbours).
OBSERVER, FRACTION = 0, 0.5
#: The one-run audit's canaries per victim (`audit`; pooled over the two victims: twice as many).
CANARIES_PER_VICTIM = 256
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

#: The regime of the first attack page (privacy_dp_sweep.md's: mnist1d, 8000 training samples per
#: peer, cnn1d, ring:8, iid), on which the overfit regime and the --quick plan are built.
_DP_SWEEP_SETTING = {k: v for k, v in dp.BASE.items() if k not in ("seed", "out_dir")}
_DP_SWEEP_SETTING.update(lr=dp.NONPRIVATE_LR, batch_size=dp.NONPRIVATE[1], comm_timeout=900.0)
_DP_SWEEP_SETTING["epochs"] = dp.NONPRIVATE[4]
#: privacy_attacks.md's regime: `privacy_regime.ATTACK_PAGES_REGIME` (records per peer, model,
#: epochs without DP, and the DP recipe; privacy_regime.md says whether it is still that sweep's
#: choice), trained in that sweep's recipes (`privacy_regime.NONPRIVATE`, `privacy_regime.DP`).
MAIN = {k: v for k, v in sweep.ATTACK_PAGES_REGIME.items() if k != "dp"}
SETTING = dict(
    _DP_SWEEP_SETTING,
    dataset=sweep.dataset(MAIN["records"], quick=False),
    model=MAIN["model"],
    epochs=MAIN["epochs"],
    **sweep.NONPRIVATE,
)
SETTING["dp"] = dict(sweep.DP, **sweep.ATTACK_PAGES_REGIME["dp"])
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
    _DP_SWEEP_SETTING,
    dataset="mnist1d:num_samples=10000",
    model="mlp:256,256",
    lr=0.05,
    batch_size=32,
)
OVERFIT_SETTING.update(epochs=60, reference_lr=0.05)
OVERFIT_SETTING["dp"] = dict(DP, batch_size=64, lr=0.5, epochs=60)
QUICK_SETTING = dict(
    _DP_SWEEP_SETTING,
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
    "the plan, in its order of priority, seed 0 of every group, then seeds 1 and 2 of every "
    "group: (a) exact gossip and PowerGossip r1 without DP and at target ε = 8; (b) Choco sign "
    "and PowerGossip r4 at ε = 8; (c) exact gossip and PowerGossip r1 at ε = 3; (d) Choco sign "
    "and PowerGossip r4 without DP; 4 gossip-trained LiRA reference runs per seed before it. "
    "Every run carries the one-run audit's canaries. Run with `--jobs 2` on the 2 shared cores "
    "(a run's seconds in the runs table include waiting for the other job)."
)
REGIME_TEXT = (
    "privacy_regime.md chose this regime by a committed sweep (its rule: the non-private LOSS "
    "AUC above its null band with at least 2000 pooled non-members, then the highest accuracy "
    "at ε = 8). Non-private rows: batch {batch}, lr {lr}, {epochs} epochs, no weight decay (the "
    "cosine schedule ends at lr 0). Private rows: DP-SGD on every peer (Poisson batches of "
    "{dp_batch}, lr {dp_lr}, clip C = {clip}, {dp_epochs} epochs at every ε, δ = {delta}; "
    "the recipe privacy_regime.md's sweep chose at ε = 8 among three, on these records: what "
    "that choice costs in privacy is accounted there), "
)
REFERENCE_WORDS = (
    "trained the way the victims are: each is a whole exact-gossip run on the same topology "
    "in the non-private recipe, in which each victim trains on a random half of its candidates "
    "(every candidate in exactly half of the references; as many records as it trains on here) "
    "and every other peer on its own shard (population data from the same distribution, never "
    "a candidate: LiRA's shadow-model assumption); a candidate's reference model is its "
    "victim's final model (no DP for the reference models, also for the DP rows: a weaker but "
    "cheaper attacker; exact gossip also for the rows of the other algorithms)"
)
OVERFIT_REFERENCE_WORDS = (
    "trained in-process, each on a random half of the candidate pool (every candidate in "
    "exactly half of them) plus the observer's own shard, with the non-private recipe below but "
    "lr {reference_lr} (each trains alone, without gossip; no DP for the reference models, also "
    "for the DP rows: a weaker but cheaper attacker)"
)
NOT_REACHED = (
    "A clearly attackable non-private row: in privacy_regime.md's sweep this regime's "
    "non-private LOSS AUC lay only a little above its chance band (cnn1d generalises on "
    "mnist1d); the candidates that memorise more (the MLPs) kept far less accuracy at ε = 8 "
    "there, so the sweep's rule chose this one. What DP can be seen to stop here is that "
    "margin.",
    "One DP recipe at every ε (privacy_regime.md's choice at ε = 8): not tuned per ε; its "
    "tuning cost on these records is accounted on privacy_regime.md, not here.",
    "The LiRA reference models train without DP (also for the DP rows), by exact gossip (also "
    "for the other algorithms' rows); 4 per seed (2 IN, 2 OUT per candidate), far fewer than "
    "the 64+ of Carlini et al.: online LiRA's AUC here is a lower bound on what LiRA can do.",
    "One public σ for every peer: the victims (half a shard each, plus their included "
    "canaries) set it, so the other peers' ε is lower than the target.",
    "The audit's canaries are out-of-distribution inputs with random labels; in-distribution "
    "canaries, or scores from the received messages themselves rather than a model, may audit "
    "tighter or looser; the canaries also enter the victims' data, so this page's accuracies "
    "and membership figures are those of victims that carry them.",
)
OVERFIT_SCALE_NOTE = (
    "this page is the companion of privacy_attacks.md, whose regime (privacy_regime.md's "
    "choice) lets DP learn but where the attacks without DP separate members from held-out "
    "records only a little. Here the models memorise: 1000 samples per peer and an MLP, so that the "
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
            ((_CHOCO, 8.0), (_R4, 8.0)),
            ((_EXACT, 3.0), (_R1, 3.0)),
            ((_CHOCO, None), (_R4, None)),
        ),
        seeds=(0, 1, 2),
        seed_waves=((0,), (1, 2)),
        references=4,
        gossip_references=True,
        canaries=CANARIES_PER_VICTIM,
        network=NETWORK,
        title="What a curious neighbour learns",
        scale_note=SCALE_NOTE,
        not_reached=NOT_REACHED,
        regime_text=REGIME_TEXT,
        reference_words=REFERENCE_WORDS,
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
        reference_words=OVERFIT_REFERENCE_WORDS,
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
