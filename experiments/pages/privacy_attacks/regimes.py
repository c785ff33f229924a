"""The regimes of the attack pages, in one place (REGIMES): each one's training setting, DP recipe,
plan, seeds, LiRA reference models, and the words its page says of them (regimes.md)."""

from __future__ import annotations

from typing import Any, Dict

from experiments.pages import _privacy as dp
from experiments.pages import privacy_regime as sweep
from experiments.pages._markdown import snippets

ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1"),
    ("PowerGossip r4", "powergossip:rank=4"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
_EXACT, _R1, _R4, _CHOCO = (spec for _, spec in ALGORITHMS)
#: The observer, and the held-out share of each victim's shard (the victims: its neighbours).
OBSERVER, FRACTION = 0, 0.5
#: The one-run audit's canaries per victim (pooled over the two victims: twice as many).
CANARIES_PER_VICTIM = 256
#: The attacks run at these fractions of the run.
ROUNDS = (0.25, 0.5, 0.75, 1.0)
#: The network-DP section (privacy_attacks.md): three 16-peer topologies at one sigma and delta
#: (sensitivity 1), noise once then 2 or 20 gossip steps, and fresh noise at each of 20.
NETWORK = dict(topologies=["ring:16", "exponential:16", "complete:16"])
NETWORK.update(cases=[["once", 2], ["once", 20], ["every_step", 20]], sigma=5.0, delta=1e-5)

#: privacy_dp_sweep.md's regime (mnist1d, 8000 training samples per peer, cnn1d, ring:8, iid), on
#: which every regime here is built.
_DP_SWEEP_SETTING = {k: v for k, v in dp.BASE.items() if k not in ("seed", "out_dir")}
_DP_SWEEP_SETTING.update(lr=dp.NONPRIVATE_LR, batch_size=dp.NONPRIVATE[1], comm_timeout=900.0)
_DP_SWEEP_SETTING["epochs"] = dp.NONPRIVATE[4]
#: privacy_attacks.md's regime: `privacy_regime.ATTACK_PAGES_REGIME` (privacy_regime.md says
#: whether it is still that sweep's choice), in that sweep's recipes (NONPRIVATE, DP).
MAIN = {k: v for k, v in sweep.ATTACK_PAGES_REGIME.items() if k != "dp"}
SETTING = dict(_DP_SWEEP_SETTING, model=MAIN["model"], epochs=MAIN["epochs"], **sweep.NONPRIVATE)
SETTING["dataset"] = sweep.dataset(MAIN["records"], quick=False)
SETTING["dp"] = dict(sweep.DP, **sweep.ATTACK_PAGES_REGIME["dp"])
#: The default DP recipe (a regime without its own "dp" takes its epsilon's budget). One public
#: sigma for every peer (release_peer_statistics): the accountant picks the sigma at which the
#: peer with the highest sampling rate meets the target, here the victims (half a shard each).
DP = dict(batch_size=dp.DP_BATCH, lr=dp.DP_LR, dp_max_grad_norm=dp.CLIP, dp_delta=dp.DELTA)
DP["release_peer_statistics"] = True
#: The overfitting regime: 1000 training samples per peer (each victim trains on 500) and an MLP
#: (mnist1d's MLPs memorise where its CNN generalises), 60 epochs at batch 32.
OVERFIT_SETTING = dict(_DP_SWEEP_SETTING, dataset="mnist1d:num_samples=10000", model="mlp:256,256")
OVERFIT_SETTING.update(lr=0.05, batch_size=32, epochs=60, reference_lr=0.05)
OVERFIT_SETTING["dp"] = dict(DP, batch_size=64, lr=0.5, epochs=60)
QUICK_SETTING = dict(_DP_SWEEP_SETTING, dataset="synthetic_logreg:d=20,classes=4,n=1200")
QUICK_SETTING.update(model="mlp:32", lr=0.2, momentum=0.0, batch_size=32, topology="ring:4")
QUICK_SETTING.update(epochs=2, warmup_epochs=0, reference_lr=0.2)
QUICK_SETTING["dp"] = dict(batch_size=32, lr=0.2, dp_max_grad_norm=1.0, dp_delta=1e-5, epochs=2)

_TEXT = snippets(__file__, "regimes.md")


def _words(prefix: str) -> Dict[str, Any]:
    """The words a page says of its regime (regimes.md; the not-reached list: an item a line)."""
    names = ("scale_note", "regime_text", "reference_words")
    words = {k: _TEXT[prefix + k.upper()] for k in names}
    return dict(words, not_reached=tuple(x for x in _TEXT[prefix + "NOT_REACHED"].split("\n") if x))


#: page name -> its regime: setting, groups of (spec, target ε or None) in order of priority,
#: seeds (with seed_waves: wave by wave), LiRA references per seed, the page's words.
ATTACKS = dict(setting=SETTING, seeds=(0, 1, 2), seed_waves=((0,), (1, 2)), references=4)
ATTACKS.update(gossip_references=True, canaries=CANARIES_PER_VICTIM, network=NETWORK)
ATTACKS.update(title="What a curious neighbour learns", **_words(""))
ATTACKS["groups"] = (
    ((_EXACT, None), (_R1, None), (_EXACT, 8.0), (_R1, 8.0)),
    ((_CHOCO, 8.0), (_R4, 8.0)),
    ((_EXACT, 3.0), (_R1, 3.0)),
    ((_CHOCO, None), (_R4, None)),
)
OVERFIT = dict(setting=OVERFIT_SETTING, seeds=(0, 1, 2), references=8, network=None)
OVERFIT.update(title="What a curious neighbour learns where the models overfit")
OVERFIT.update(_words("OVERFIT_"))
OVERFIT["groups"] = (
    ((_EXACT, None), (_R1, None)),
    ((_EXACT, 64.0), (_EXACT, 8.0)),
    ((_R4, None), (_CHOCO, None)),
    ((_EXACT, 16.0), (_EXACT, 3.0), (_R1, 64.0), (_R1, 8.0)),
    ((_EXACT, 1.0),),
)
REGIMES: Dict[str, Dict[str, Any]] = {
    "privacy_attacks": ATTACKS,
    "privacy_attacks_overfit": OVERFIT,
}
QUICK = dict(setting=QUICK_SETTING, groups=(((_EXACT, None), (_R1, None), (_EXACT, 8.0)),))
QUICK.update(seeds=(0, 1), references=4, not_reached=())
QUICK["scale_note"] = "--quick: a smoke test, not a result."


def regime(name: str, quick: bool) -> Dict[str, Any]:
    """The regime of page `name` (--quick: its small plan, on the page's other choices)."""
    if not quick:
        return REGIMES[name]
    small = dict(NETWORK, topologies=["ring:4"], cases=[["once", 2]])
    return dict(REGIMES[name], **QUICK, network=REGIMES[name]["network"] and small)


def dp_recipe(setting: Dict[str, Any], target: float) -> Dict[str, Any]:
    """The DP keys of a row at `target` (the default recipe takes that ε's `dp_epochs`)."""
    return setting.get("dp") or dict(DP, epochs=dp.dp_epochs(target))
