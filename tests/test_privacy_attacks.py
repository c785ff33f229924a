"""What a curious neighbour learns: recorded views, model reconstruction and membership inference
(the network-DP accountant: tests/test_network_dp.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import topologies
from conftest import run_scenario_mpi
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.membership import (
    auc,
    loss_attack,
    membership_inference,
    membership_samples,
    model_with_parameters,
    null_auc_std,
    tpr_at_fpr,
)
from gossip_powersgd.privacy.reconstruction import (
    reconstruct,
    reconstruction_errors,
    relative_error,
    trivial_estimates,
)
from gossip_powersgd.privacy.views import ObserverHooks, load_view, observed_dir
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.data import load_dataset
from gossip_powersgd.training.models import build_model
from gossip_powersgd.training.trainer import train
from privacy_attack_scenarios import observed_gossip

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
RING = topologies.ring(4)

SPECS = ["exact", "powergossip:rank=1", "powergossip:rank=6,min_compression_rate=0",
         "choco:compressor=topk:0.3,gamma=0.3", "deepsqueeze:compressor=sign,gamma=0.1"]


def run_views(spec, steps=4, observe_every=1, tmp=None):
    """Gossip on a 4-ring with every rank observing; returns (results, views by rank)."""
    results = LocalCluster(RING, timeout=30).run(observed_gossip, spec, steps, "all", tmp,
                                                 str(observe_every))
    views = [load_view(observed_dir(tmp, k)) for k in range(4)] if tmp is not None else None
    return results, views


# ---- recorded views ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS)
def test_a_recorded_view_is_bit_for_bit_what_the_algorithm_consumed(spec, tmp_path):
    results, views = run_views(spec, steps=3, tmp=tmp_path)
    for rank, (result, view) in enumerate(zip(results, views)):
        assert view.steps == [0, 1, 2]
        assert view.meta["observer"] == rank and view.meta["neighbors"] == list(RING.neighbors(rank))
        for step, record in enumerate(view.records):
            assert len(record["messages"]) == len(RING.neighbors(rank))  # one exchange per step here
            for message in record["messages"]:
                consumed = result["consumed"][step][message["sender"]]
                assert message["tensor"].dtype == consumed.dtype
                assert torch.equal(message["tensor"], consumed)
            for own, sent in zip(record["own"], result["sent"][step]):
                assert torch.equal(own, sent)
        if spec.startswith("powergossip"):
            assert [r["messages"][0]["kind"] for r in view.records] == ["right", "left", "right"]


def test_recording_changes_no_model_bit():
    for spec in SPECS:
        recorded = LocalCluster(RING).run(observed_gossip, spec, 3, "all")
        plain = LocalCluster(RING).run(observed_gossip, spec, 3, "")
        for a, b in zip(recorded, plain):
            assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"])), spec
            assert "records" in a and "records" not in b


def test_observe_every_bounds_what_is_recorded(tmp_path):
    _, views = run_views("exact", steps=5, observe_every=2, tmp=tmp_path)
    assert views[0].steps == [0, 2, 4]
    with pytest.raises(ValueError, match="observe_every must be an integer >= 1"):
        ObserverHooks([0], observe_every=0)


def test_bad_observers_and_missing_views_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"observers \[4\] are not ranks of this 4-peer run"):
        train_all(tiny(), lambda: ObserverHooks([4]))
    with pytest.raises(ValueError, match="holds no recorded view"):
        load_view(tmp_path)


def tiny(**changes):
    base = load_config(TINY, deep=False).replace(quiet=True, checkpoint_every=0, log_every=0,
                                                 epochs=1)
    return base.replace(**changes)


def train_all(config, make_hooks):
    hooks = {}

    def peer(comm):
        hooks[comm.rank] = make_hooks()
        return train(comm, config, hooks=[hooks[comm.rank]])

    return LocalCluster(topologies.parse(config.topology), timeout=60).run(peer), hooks


def test_observer_hooks_record_under_train_without_changing_the_run(tmp_path):
    run = tmp_path / "run"
    observed, hooks = train_all(tiny(out_dir=str(run)), lambda: ObserverHooks(range(4)))
    plain, _ = train_all(tiny(out_dir=str(tmp_path / "plain")), lambda: ObserverHooks([]))
    assert observed[0]["model_sha256"] == plain[0]["model_sha256"]
    assert observed[0]["mb_sent_per_peer"] == plain[0]["mb_sent_per_peer"]  # counted once
    assert not (tmp_path / "plain" / "observed").exists()
    steps = observed[0]["history"][-1]["step"]
    views = [load_view(observed_dir(run, k)) for k in range(4)]
    view0, view1 = views[0], views[1]
    assert view1.steps == list(range(steps))
    message_bytes = sum(m["tensor"].numel() * m["tensor"].element_size()
                        for r in view1.records for m in r["messages"])
    assert hooks[1].bytes_recorded == message_bytes > 0
    assert observed[1]["history"][-1]["observed_bytes"] == message_bytes

    # The observer (rank 1) reconstructs its neighbour 0; rank 0's own view holds the truth.
    errors = reconstruction_errors(view1, 0, view0.own_trajectory(), window=4)
    assert errors["steps"] == list(range(steps))
    assert errors["estimate"][-1] < errors["trivial"][-1]

    # Membership of rank 0's shard with its true model, the reconstruction, the observer's model,
    # and the average of all four.
    config = tiny()
    dataset = load_dataset(config.dataset, config.seed)
    members, nonmembers = membership_samples(dataset, 0, 4, config.partition, config.seed)
    assert len(members[0]) == len(nonmembers[0]) > 0
    model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
    last = steps - 1
    average = [torch.stack(ts).mean(0) for ts in zip(*(v.own_trajectory()[last] for v in views))]
    models = {"victim": model_with_parameters(model, view0.own_trajectory()[last]),
              "reconstruction": model_with_parameters(model, reconstruct(view1, 0)[last]),
              "observer": model_with_parameters(model, view1.own_trajectory()[last]),
              "average": model_with_parameters(model, average)}
    report = membership_inference(models, members, nonmembers)
    for values in report.values():
        assert 0 <= values["auc"] <= 1 and 0 <= values["tpr_at_fpr"] <= 1


# ---- reconstruction --------------------------------------------------------------------------

def test_reconstruction_reads_exact_gossip_off_bit_for_bit(tmp_path):
    results, views = run_views("exact", steps=3, tmp=tmp_path)
    estimates = reconstruct(views[0], 1)
    for step in range(3):
        assert all(torch.equal(e, t) for e, t in zip(estimates[step], results[1]["sent"][step]))


def test_reconstruction_is_exact_for_full_rank_powergossip(tmp_path):
    results, views = run_views("powergossip:rank=6,min_compression_rate=0", steps=4, tmp=tmp_path)
    truth = {step: sent for step, sent in enumerate(results[3]["sent"])}
    errors = reconstruction_errors(views[0], 3, truth, window=1)
    assert errors["steps"] == [0, 1, 2, 3]
    assert max(errors["estimate"]) < 1e-10  # right and left half-steps alike (square factors)
    assert min(errors["trivial"]) > 1e-3


def test_low_rank_powergossip_reconstruction_beats_the_trivial_estimate(tmp_path):
    results, views = run_views("powergossip:rank=1", steps=6, tmp=tmp_path)
    truth = dict(enumerate(results[1]["sent"]))
    errors = reconstruction_errors(views[0], 1, truth, window=4)
    assert all(e < t for e, t in zip(errors["estimate"], errors["trivial"]))
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        reconstruct(views[0], 1, window=0)
    with pytest.raises(ValueError, match="not a neighbour"):
        reconstruct(views[0], 2)


@pytest.mark.parametrize("spec", ["choco:compressor=identity,gamma=0.5",
                                  "deepsqueeze:compressor=identity,gamma=0.5"])
def test_public_estimates_are_the_model_with_the_identity_compressor(spec, tmp_path):
    results, views = run_views(spec, steps=4, tmp=tmp_path)
    estimates = reconstruct(views[2], 1)
    for step in range(4):
        assert relative_error(estimates[step], results[1]["sent"][step]) < 1e-12


def test_compressed_public_estimates_are_closer_than_the_trivial_one(tmp_path):
    results, views = run_views("choco:compressor=topk:0.3,gamma=0.3", steps=6, tmp=tmp_path)
    errors = reconstruction_errors(views[0], 1, dict(enumerate(results[1]["sent"])))
    assert errors["estimate"][-1] < errors["trivial"][-1]


def test_choco_reconstruction_needs_every_step(tmp_path):
    _, views = run_views("choco:compressor=topk:0.3,gamma=0.3", steps=3, observe_every=2, tmp=tmp_path)
    with pytest.raises(ValueError, match="observe_every=1"):
        reconstruct(views[0], 1)


def test_trivial_estimate_is_the_observers_own_model(tmp_path):
    results, views = run_views("exact", steps=2, tmp=tmp_path)
    own = trivial_estimates(views[0])
    assert all(torch.equal(a, b) for a, b in zip(own[1], results[0]["sent"][1]))
    assert relative_error(own[1], own[1]) == 0.0


# ---- membership inference ----------------------------------------------------------------------

def test_auc_and_tpr_on_hand_computed_scores():
    assert auc([3, 4], [1, 2]) == 1.0 and auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 3], [2, 2]) == 0.5 and auc([2], [2]) == 0.5  # ties count one half
    others = list(range(100))  # threshold at 1 % FPR: the second-largest non-member score, 98
    assert tpr_at_fpr([99, 98.5, 50, 10], others, fpr=0.01) == 0.5
    assert null_auc_std(1000, 1000) == pytest.approx(math.sqrt(2001 / 12e6))


def _blobs(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def test_loss_auc_is_high_for_an_overfitted_model_and_chance_for_an_unseen_one():
    members, nonmembers = _blobs(40, 1), _blobs(40, 2)  # random labels: only memorising helps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(members[0]), members[1]).backward()
        optimizer.step()
    overfitted = loss_attack(model, members, nonmembers)
    assert overfitted["auc"] > 0.9 and overfitted["tpr_at_fpr"] > 0.2

    fresh = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    big_in, big_out = _blobs(2000, 3), _blobs(2000, 4)
    unseen = loss_attack(fresh, big_in, big_out)["auc"]
    assert abs(unseen - 0.5) < 4 * null_auc_std(2000, 2000)


def test_model_with_parameters_refuses_another_models_parameters():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter tensors"):
        model_with_parameters(model, [torch.zeros(2, 3)])
    copied = model_with_parameters(model, [torch.ones(2, 3), torch.zeros(2)])
    assert torch.equal(copied.weight, torch.ones(2, 3)) and not torch.equal(model.weight, copied.weight)


# ---- under mpiexec -------------------------------------------------------------------------------

@pytest.mark.mpi
def test_recording_works_under_mpiexec_and_matches_the_local_run(tmp_path):
    spec, steps = "powergossip:rank=2", 3
    mpi_dir, local_dir = tmp_path / "mpi", tmp_path / "local"
    mpi_dir.mkdir()
    results = run_scenario_mpi(4, "privacy_attack_scenarios:mpi_observed_gossip", "ring:4", mpi_dir,
                               extra=(mpi_dir, spec, steps))
    local = LocalCluster(RING).run(observed_gossip, spec, steps, "3", local_dir)
    for a, b in zip(results, local):
        assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"]))
    assert [observed_dir(mpi_dir, k).exists() for k in range(4)] == [False, False, False, True]
    mpi_view, local_view = load_view(observed_dir(mpi_dir, 3)), load_view(observed_dir(local_dir, 3))
    assert mpi_view.meta == local_view.meta and mpi_view.steps == local_view.steps == [0, 1, 2]
    for a, b in zip(mpi_view.records, local_view.records):
        for x, y in zip(a["messages"], b["messages"]):
            assert (x["sender"], x["kind"]) == (y["sender"], y["kind"])
            assert torch.equal(x["tensor"], y["tensor"])
            assert all(torch.equal(x["factors"][g], y["factors"][g]) for g in x["factors"])
