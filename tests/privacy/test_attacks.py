"""What a curious neighbour records and attacks: recorded views, a whole observed training run, and
the attacks of a run (`privacy.attacks`). Reconstruction, the estimators, the held-out split,
membership scores, LiRA and the observed run have their own files beside this one (the network-DP
accountant: tests/privacy/test_network_dp.py)."""

from __future__ import annotations


import pytest
import torch

from tests.conftest import run_scenario_mpi
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.membership import (
    membership_inference,
    membership_samples,
    model_with_parameters,
    null_auc_std,
)
from gossip_powersgd.privacy.reconstruction import (
    reconstruct,
    reconstruction_errors,
)
from gossip_powersgd.privacy.observing import ObserverHooks
from gossip_powersgd.privacy.views import load_view, observed_dir
from gossip_powersgd.training.data import load_dataset
from gossip_powersgd.training.models import build_model
from gossip_powersgd.privacy.heldout import make_split
from privacy_attack_scenarios import (
    RING,
    SPLIT_DATA,
    observed_gossip,
    run_views,
    tiny,
    train_all,
)

SPECS = [
    "exact",
    "powergossip:rank=1",
    "powergossip:rank=6,min_compression_rate=0",
    "choco:compressor=topk:0.3,gamma=0.3",
    "deepsqueeze:compressor=sign,gamma=0.1",
]


# ---- recorded views ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_a_recorded_view_is_bit_for_bit_what_the_algorithm_consumed(spec, tmp_path):
    results, views = run_views(spec, steps=3, tmp=tmp_path)
    for rank, (result, view) in enumerate(zip(results, views)):
        assert view.steps == [0, 1, 2]
        assert view.meta["observer"] == rank and view.meta["neighbors"] == list(
            RING.neighbors(rank)
        )
        for step, record in enumerate(view.records):
            assert len(record["messages"]) == len(
                RING.neighbors(rank)
            )  # one exchange per step here
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
    message_bytes = sum(
        m["tensor"].numel() * m["tensor"].element_size()
        for r in view1.records
        for m in r["messages"]
    )
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
    models = {
        "victim": model_with_parameters(model, view0.own_trajectory()[last]),
        "reconstruction": model_with_parameters(model, reconstruct(view1, 0)[last]),
        "observer": model_with_parameters(model, view1.own_trajectory()[last]),
        "average": model_with_parameters(model, average),
    }
    report = membership_inference(models, members, nonmembers)
    for values in report.values():
        assert 0 <= values["auc"] <= 1 and 0 <= values["tpr_at_fpr"] <= 1


# ---- under mpiexec -------------------------------------------------------------------------------


@pytest.mark.mpi
def test_recording_works_under_mpiexec_and_matches_the_local_run(tmp_path):
    spec, steps = "powergossip:rank=2", 3
    mpi_dir, local_dir = tmp_path / "mpi", tmp_path / "local"
    mpi_dir.mkdir()
    results = run_scenario_mpi(
        4,
        "privacy_attack_scenarios:mpi_observed_gossip",
        "ring:4",
        mpi_dir,
        extra=(mpi_dir, spec, steps),
    )
    local = LocalCluster(RING).run(observed_gossip, spec, steps, "3", local_dir)
    for a, b in zip(results, local):
        assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"]))
    assert [observed_dir(mpi_dir, k).exists() for k in range(4)] == [False, False, False, True]
    mpi_view, local_view = (
        load_view(observed_dir(mpi_dir, 3)),
        load_view(observed_dir(local_dir, 3)),
    )
    assert mpi_view.meta == local_view.meta and mpi_view.steps == local_view.steps == [0, 1, 2]
    for a, b in zip(mpi_view.records, local_view.records):
        for x, y in zip(a["messages"], b["messages"]):
            assert (x["sender"], x["kind"]) == (y["sender"], y["kind"])
            assert torch.equal(x["tensor"], y["tensor"])
            assert all(torch.equal(x["factors"][g], y["factors"][g]) for g in x["factors"])


# ---- the attacks of a run, with their blind baselines (gossip_powersgd.privacy.attacks) ---------


def test_candidates_pool_each_victims_members_and_heldout_records():
    from gossip_powersgd.privacy.attacks import Candidates

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=2)
    pool = Candidates.of(split)
    for v in (1, 3):
        mine = pool.victim == v
        assert pool.member[mine].sum() == len(split.members[v])
        assert (~pool.member[mine]).sum() == len(split.heldout[v])
    x1, _ = split.heldout_set(1)
    assert torch.equal(pool.x[(pool.victim == 1) & ~pool.member], x1)
    only = Candidates.of(split, victims=[3])  # a split may hold out more peers than are attacked
    assert set(only.victim.tolist()) == {3} and len(only.y) == len(split.members[3]) * 2


def test_null_band_of_depends_on_the_counts_alone_and_narrows_with_them():
    """The central 95 % of the AUC under random labels is about +-1.96 null sds around 1/2. Its
    ends are quantiles of 400 permutations: each within ~4 standard errors, sqrt(0.025 * 0.975 /
    400) / phi(1.96) = 0.135 sd, of the true one, so the width within 1.1 sd of 3.92 sd (28 %)."""
    from gossip_powersgd.privacy.attacks import null_band_of

    for m, n in ((50, 50), (2000, 1000)):
        band = null_band_of(m, n)
        assert null_band_of(m, n) is band  # computed once per counts
        assert band["auc"][0] < 0.5 < band["auc"][1]
        width = band["auc"][1] - band["auc"][0]
        assert width == pytest.approx(3.92 * null_auc_std(m, n), rel=0.28)
