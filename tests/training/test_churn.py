"""Training through membership changes (on_peer_loss: continue, a churn schedule, backend local):
the no-churn path is unchanged, members evaluate and checkpoint, joiners are handed their state,
a run that lost and gained peers resumes bit for bit, and what cannot follow a change is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config, validate_config
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.trainer import TIMING_KEYS, train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
MEMBERSHIP_KEYS = ("live_peers", "membership_epoch", "membership_changes", "average_shift_total")
# tiny.yaml: 13 steps per epoch; peer 1 is away for steps 10..32, peer 3 from step 20 to the end
CHURN = "leave:1@10,leave:3@20,join:1@33"


class Interrupted(RuntimeError):
    pass


def config_for(out_dir=None, **changes):
    base = load_config(TINY, deep=False).replace(
        out_dir=None if out_dir is None else str(out_dir),
        quiet=True,
        momentum=0.9,
        lr=0.2,
        epochs=4,
        log_every=4,
        checkpoint_every=1,
        on_peer_loss="continue",
        churn=CHURN,
    )
    return base.replace(**changes)


def run(config, resume=False, stop_at=None):
    def on_step(step):
        if stop_at is not None and step == stop_at:
            raise Interrupted(f"interrupted at step {step}")

    topology = topologies.parse(config.topology)
    return LocalCluster(topology, timeout=60).run(train, config, resume=resume, on_step=on_step)


def comparable(records, drop=()):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS + tuple(drop)} for r in records]


@pytest.fixture(scope="module")
def churned(tmp_path_factory):
    out = tmp_path_factory.mktemp("churn") / "run"
    return out, run(config_for(out))


def test_continue_without_churn_gives_the_same_models_as_abort():
    abort = run(config_for(churn=None, on_peer_loss="abort"))
    cont = run(config_for(churn=None))
    for a, c in zip(abort, cont):
        assert c["model_sha256"] == a["model_sha256"]
        assert comparable(c["history"], MEMBERSHIP_KEYS) == comparable(a["history"])
        assert c["mb_sent_per_peer"] == a["mb_sent_per_peer"]
    assert cont[0]["membership_changes"] == 0 and cont[0]["transfer_mb_sent"] == 0


def test_members_train_evaluate_and_checkpoint_through_the_changes(churned):
    out, results = churned
    evals = {k: [r for r in s["history"] if r["kind"] == "eval"] for k, s in enumerate(results)}
    # epochs end at steps 13, 26, 39, 52: members then are {0,2,3}, {0,2}, {0,1,2}, {0,1,2}
    assert [e["live_peers"] for e in evals[0]] == [3, 2, 3, 3]
    assert [e["step"] for e in evals[1]] == [39, 52]  # away at 13 and 26
    assert [e["step"] for e in evals[3]] == [13]  # gone from step 20 on
    assert results[3]["departed"] and "model_sha256" not in results[3]
    final = results[0]
    assert final["membership_changes"] == 3 and final["live_peers_at_end"] == 3
    assert final["final_test_acc_avg_model"] > 0.8  # the members still learn (tiny reaches ~0.9)
    # checkpoints: members at each epoch end; the leavers' away files, written when they left
    assert ckpt.available_epochs(out, 1) == [3, 4] and ckpt.available_epochs(out, 3) == [1]
    assert sorted(p.name for p in (out / "checkpoints").glob("*away*")) == [
        "rank-1-away-10.pt",
        "rank-3-away-20.pt",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model_sha256"] == final["model_sha256"] and len(summary["model_sha256"]) == 3
    assert (out / "peers" / "rank-3.json").exists()  # a departed peer's own figures


class Recorder(TrainingHooks):
    """Each peer's model and momentum at the end of step 32 and at the start of step 33."""

    name = "recorder"
    optional = True

    def setup(self, context):
        self.model, self.optimizer, self.seen = context.model, context.optimizer, {}

    def _keep(self, key):
        params = list(self.model.parameters())
        momenta = [self.optimizer.state[p]["momentum_buffer"] for p in params]
        self.seen[key] = [t.detach().clone() for t in params + momenta]

    def after_step(self, step, loss):
        if step == 32:
            self._keep("end of 32")

    def before_backward(self, step, loss):
        if step == 33:
            self._keep("start of 33")


@pytest.mark.parametrize("join", ["average", "copy"])
def test_a_joiner_is_handed_its_neighbours_state(join):
    """At step 33 peer 1 (back) gets its model and momentum from its surviving neighbours on
    ring:4 minus peer 3, i.e. peers 0 and 2: their mean (in float64, then float32) or peer 0's
    copy; the transfer is counted apart from the training traffic."""
    config = config_for(churn_join=join)

    def peer(comm):
        recorder = Recorder()
        summary = train(comm, config, hooks=[recorder])
        return summary, recorder.seen

    results = LocalCluster(topologies.parse(config.topology), timeout=60).run(peer)
    got = results[1][1]["start of 33"]
    senders = [0, 2] if join == "average" else [0]
    for k, tensor in enumerate(got):
        parts = [results[j][1]["end of 32"][k].double() for j in senders]
        assert torch.equal(tensor, (sum(parts) / len(parts)).float())
    assert "end of 32" not in results[1][1]  # it was away
    summary = results[0][0]
    assert summary["transfer_mb_sent"] > 0
    reference = run(
        config_for(churn_join=join, churn="leave:3@20")
    )  # the same without peer 1's absence
    assert summary["mb_sent_per_peer"] < reference[0]["mb_sent_per_peer"]


@pytest.mark.parametrize(
    "stop_at", [2 * 13 + 3, 3 * 13 + 3]
)  # peer 1 away / back at the checkpoint
def test_a_run_that_lost_and_gained_peers_resumes_bit_for_bit(tmp_path, churned, stop_at):
    ref_dir, ref = churned
    out = tmp_path / "run"
    config = config_for(out)
    with pytest.raises(Interrupted):
        run(config, stop_at=stop_at)
    resumed = run(config, resume=True)
    for rank in range(4):
        assert resumed[rank].get("model_sha256") == ref[rank].get("model_sha256")
        assert comparable(resumed[rank]["history"]) == comparable(ref[rank]["history"])
    assert json.loads((out / "summary.json").read_text())["model_sha256"] == ref[0]["model_sha256"]


@pytest.mark.parametrize(
    "changes, problem",
    [
        (
            dict(backend="mpi"),
            r"not supported on backend mpi \(MPICH is fail-stop.*support it: local, torch$",
        ),
        (
            dict(backend="torch"),
            r"churn \(a schedule\) drives an in-process run: use backend local",
        ),
        (
            dict(backend="torch", churn=None, device="cuda"),
            r"continue on backend torch moves CPU tensors over gloo.*use device cpu",
        ),
        (dict(on_peer_loss="abort"), r"churn needs on_peer_loss: continue"),
        (
            dict(on_peer_loss="abort", churn=None, churn_join="copy"),
            r"^churn_join is for on_peer_loss: continue \(with abort no peer joins again\)",
        ),
        (
            dict(on_peer_loss="retry"),
            r"bad value for 'on_peer_loss': 'retry' \(valid: abort, continue\)",
        ),
        (dict(churn_join="median"), r"bad value for 'churn_join': 'median'"),
        (
            dict(churn="leave:7@3"),
            r"bad value for 'churn': churn spec 'leave:7@3': .*peer 7 is not one",
        ),
        (dict(churn="rate=2,down=3"), r"bad value for 'churn': .*rate=2 must be in \[0, 1\)"),
        (dict(algorithm="allreduce"), r"'allreduce' cannot go on after peers leave or join"),
        (dict(algorithm="powersgd:rank=1"), r"cannot go on after peers leave.*fail-stop"),
        (dict(topology="directed_exponential:4", algorithm="pushsum"), r"is directed"),
        (
            dict(dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_mechanism="muffliato"),
            r"dp_mechanism: muffliato is bound to one fixed graph",
        ),
        (dict(observers=[1]), r"observers holds the algorithm instance"),
    ],
)
def test_what_cannot_follow_a_change_is_refused_in_one_line(changes, problem):
    config = config_for(**changes)
    with pytest.raises(ValueError, match=problem) as info:
        validate_config(config, deep=False)
    assert "\n" not in str(info.value)


def test_device_auto_that_is_cuda_here_is_refused_under_continue_on_torch(monkeypatch):
    """device auto on a machine with CUDA is cuda (`setup.resolve_device`), and backend torch then
    gossips over NCCL, which the continue policy's groups and hand-over (gloo, CPU tensors) do not
    cover: refused as device cuda is (it was accepted); on a machine without CUDA it is the CPU."""
    config = config_for(backend="torch", churn=None, device="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"over gloo in this version \(device auto is cuda on"):
        validate_config(config, deep=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    validate_config(config, deep=False)


def test_a_private_peer_counts_only_the_steps_it_trained(tmp_path):
    """Under DP each peer's epsilon is its own accountant's: peer 1, away for 23 of 52 steps,
    composes 29 steps, peer 3 the 20 it trained before it left."""
    out = tmp_path / "dp"
    results = run(config_for(out, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, momentum=0.0))
    steps = {
        k: json.loads((out / "peers" / f"rank-{k}.json").read_text())["steps"] for k in range(4)
    }
    assert steps == {0: 52, 1: 52 - 23, 2: 52, 3: 20}
    eps = {
        k: json.loads((out / "peers" / f"rank-{k}.json").read_text())["epsilon"] for k in range(4)
    }
    assert eps[3] < eps[1] < eps[0] == eps[2]
    assert results[0]["membership_changes"] == 3


def test_released_peer_figures_leave_a_peer_away_at_the_end_null_not_zero(tmp_path):
    """With release_peer_statistics the summary gathers every peer's epsilon, rate and label
    histogram over the members at the end; peer 3 (away from step 20, epsilon > 0 in its own
    file) was listed with epsilon 0, rate 0 and an empty histogram. Now null, and named."""
    out = tmp_path / "dp"
    config = config_for(out, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, momentum=0.0)
    run(config.replace(release_peer_statistics=True))
    summary = json.loads((out / "summary.json").read_text())
    peers = [json.loads((out / "peers" / f"rank-{k}.json").read_text()) for k in range(4)]
    assert peers[3]["epsilon"] > 0 and peers[3]["steps"] == 20
    for key in ("epsilon", "epsilon_add_remove", "epsilon_pld", "sample_rate"):
        assert summary[key] == [p[key] for p in peers[:3]] + [None], key
    assert summary["label_histogram"][:3] == [p["label_histogram"] for p in peers[:3]]
    assert summary["label_histogram"][3] is None
    assert "peer 3" in summary["dp_peers_absent"]
    table = (out / "summary.md").read_text()
    assert "(without peer 3: not members at the end)" in table
    assert "| 3 | not a member at the end" in table


#: (topology, churn, {member at the end: models exact gossip sends it over the 52 rounds}), from
#: the schedule's timeline (tiny.yaml: 52 steps, a gossip round after each). complete:4 minus peer
#: 3 from step 20: 20 rounds to 3 neighbours, then 32 to the 2 others, for each of 0, 1, 2. CHURN
#: on ring:4: peers 0 and 2 have 2 neighbours in steps 0..19 (ring:4, then the ring of 0, 2, 3),
#: 1 in 20..32 (the ring of 0 and 2 is one edge), 2 in 33..51 (the ring of 0, 1, 2); peer 1 sends
#: in 0..9 and 33..51 only (its counters keep its sends from before its absence).
TIMELINES = [
    ("complete:4", "leave:3@20", {k: 20 * 3 + 32 * 2 for k in (0, 1, 2)}),
    (
        "ring:4",
        CHURN,
        {0: 20 * 2 + 13 * 1 + 19 * 2, 1: 10 * 2 + 19 * 2, 2: 20 * 2 + 13 * 1 + 19 * 2},
    ),
]


@pytest.mark.parametrize("topology, churn, models", TIMELINES)
def test_the_exact_gossip_baseline_counts_the_graphs_in_force_for_the_members(
    topology, churn, models
):
    """summary.json's exact-gossip bytes are, for each member at the end, model bytes x its
    neighbours in the graph in force at each round it took part in, averaged over those members
    (as mb_sent_per_peer is), not the final graph's mean degree over all ids x every round (78
    models here in both cases, against 124 and 80). Exact gossip sends just that, so the measured
    bytes equal it and the ratio is 1. Tolerance: both are a sum of exact integers over the
    members divided by their number and by 1e6 (a few roundings, each 2^-53 relative)."""
    summary = run(config_for(topology=topology, churn=churn, algorithm="exact"))[0]
    model_bytes = summary["parameters"] * 4  # float32
    expected = model_bytes * sum(models.values()) / len(models) / 1e6
    assert summary["members_at_end"] == sorted(models)
    assert summary["mb_sent_per_peer"] == pytest.approx(expected, rel=1e-14)
    assert summary["exact_gossip_mb_per_peer_formula"] == pytest.approx(expected, rel=1e-14)
    assert summary["compression_ratio"] == pytest.approx(1.0, rel=1e-14)
    assert summary["exact_gossip_formula"].startswith(f"model bytes {model_bytes} x each member's")
    assert f"mean over the {len(models)} members at the end" in summary["exact_gossip_formula"]


@pytest.mark.parametrize(
    "topology, churn, local_steps",
    [
        ("one_peer_exponential:4", "leave:3@20", 1),  # a schedule: each round's own graph
        ("one_peer_exponential:4", "rate=0.03,down=6,seed=2", 2),  # 10 changes, a round per 2 steps
        ("ring:4", "rate=0.03,down=6,seed=2", 3),
    ],
)
def test_exact_gossip_sends_its_own_baseline_through_any_churn(topology, churn, local_steps):
    """Exact gossip sends the model to each neighbour of each round's graph: whatever the
    changes, the schedule or local_steps, its measured bytes are the baseline's, ratio 1 (the
    final graph's mean degree x every round made it 0.63, 1.3 and 1.21 here). Tolerance as above."""
    changes = dict(topology=topology, churn=churn, local_steps=local_steps, checkpoint_every=0)
    results = run(config_for(algorithm="exact", **changes))
    summary = next(r for r in results if not r.get("departed"))
    assert summary["membership_changes"] > 0
    assert summary["compression_ratio"] == pytest.approx(1.0, rel=1e-14)


def test_the_state_handed_to_a_joiner_counts_after_its_senders_leave():
    """summary.json's transfer_mb_sent is the state every change handed to joiners, over all its
    senders: peer 3's return at step 10 on ring:4 (handed by peers 0 and 2) counts the same
    whether or not peer 2 leaves afterwards. (Before, only the members at the end counted their
    own bytes: half of it.) Both runs hand the same bytes, integers summed exactly: equal."""
    changes = dict(checkpoint_every=0)
    kept = run(config_for(churn="leave:3@5,join:3@10", **changes))[0]
    left = run(config_for(churn="leave:3@5,join:3@10,leave:2@20", **changes))[0]
    assert left["members_at_end"] == [0, 1, 3] and kept["members_at_end"] == [0, 1, 2, 3]
    assert left["transfer_mb_sent"] == kept["transfer_mb_sent"] > 0


def test_random_churn_trains_through_every_change_it_draws():
    from gossip_powersgd.membership.churn import churn_membership

    spec = "rate=0.03,down=6,seed=2"
    results = run(config_for(churn=spec, checkpoint_every=0))
    membership = churn_membership(spec, topologies.ring(4), 52)
    assert len(membership.epochs) > 5  # the schedule does churn
    leader = next(r for r in results if not r.get("departed"))
    assert leader["membership_changes"] == len(membership.epochs) - 1
    for summary in results:
        for record in summary["history"]:
            if record["kind"] == "eval":  # members at the epoch's last step, and only they
                live = membership.at(record["step"] - 1).live
                assert summary["rank"] in live and record["live_peers"] == len(live)


def test_a_gamma_that_a_repaired_graph_cannot_take_is_refused_before_the_run():
    """exact:gamma=1.52 is stable on ring:9 (up to 1.547) but not on ring:8 (up to 1.5), the
    graph of the survivors once peer 0 leaves: refused at set-up, naming the change."""
    config = config_for(topology="ring:9", algorithm="exact:gamma=1.52", churn="leave:0@5")
    with pytest.raises(
        ValueError,
        match=r"after the membership change at step 5: gamma=1\.52 is "
        r"outside the stable range \(0, 1\.5\)",
    ):
        run(config)
    assert run(config_for(topology="ring:9", algorithm="exact:gamma=1.49", churn="leave:0@5"))
