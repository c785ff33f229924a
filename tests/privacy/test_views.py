"""Curious neighbours in training runs: the `observers` / `observe_every` config keys record views
through the trainer (local and under mpiexec) without changing the run, and the summary states how
many bytes were recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view, observed_dir, reconstruction_errors
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def tiny(*overrides):
    return load_config(
        TINY,
        ["quiet=true", "checkpoint_every=0", "log_every=0", "epochs=1", *overrides],
        deep=False,
    )


def train_everywhere(config):
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)


def message_bytes(view):
    return sum(
        m["tensor"].numel() * m["tensor"].element_size()
        for r in view.records
        for m in r["messages"]
    )


def test_the_observers_key_records_views_without_changing_a_model_bit(tmp_path):
    recorded = train_everywhere(tiny(f"out_dir={tmp_path / 'rec'}", "observers=[3, 0]"))
    plain = train_everywhere(tiny(f"out_dir={tmp_path / 'plain'}"))
    for a, b in zip(recorded, plain):
        assert a["model_sha256"] == b["model_sha256"]
        assert a["mb_sent_per_peer"] == b["mb_sent_per_peer"]
    assert [observed_dir(tmp_path / "rec", k).is_dir() for k in range(4)] == [
        True,
        False,
        False,
        True,
    ]
    assert not (tmp_path / "plain" / "observed").exists()
    assert "observed_bytes" not in plain[0]

    views = {k: load_view(observed_dir(tmp_path / "rec", k)) for k in (0, 3)}
    steps = recorded[0]["steps"]
    assert views[3].steps == list(range(steps)) and views[3].meta["neighbors"] == [0, 2]
    summary = json.loads((tmp_path / "rec" / "summary.json").read_text())
    assert summary["observers"] == [0, 3] and summary["observe_every"] == 1
    assert summary["observed_bytes"] == [message_bytes(views[0]), 0, 0, message_bytes(views[3])]
    assert summary["observed_bytes"][3] > 0
    assert "observed message MB" in (tmp_path / "rec" / "summary.md").read_text()
    # Rank 3 reconstructs its neighbour 0, whose own recorded view holds the truth.
    errors = reconstruction_errors(views[3], 0, views[0].own_trajectory())
    assert errors["estimate"][-1] < errors["trivial"][-1]


def test_observe_every_thins_the_views_and_the_bytes(tmp_path):
    every = train_everywhere(tiny(f"out_dir={tmp_path / 'every'}", "observers=[1]"))
    thinned = train_everywhere(
        tiny(f"out_dir={tmp_path / 'thin'}", "observers=[1]", "observe_every=3")
    )
    assert every[0]["model_sha256"] == thinned[0]["model_sha256"]
    view = load_view(observed_dir(tmp_path / "thin", 1))
    assert view.steps == list(range(0, every[0]["steps"], 3))
    assert thinned[0]["observed_bytes"][1] == message_bytes(view) < every[0]["observed_bytes"][1]


def test_observers_without_out_dir_record_in_memory_and_still_report_bytes():
    summaries = train_everywhere(tiny("observers=[2]"))
    assert summaries[0]["observed_bytes"][2] > 0
    assert summaries[0]["observed_bytes"][:2] == [0, 0]


@pytest.mark.mpi
def test_recording_works_under_mpiexec_through_the_trainer_cli(tmp_path):
    from tests.conftest import run_mpi

    def cli(out, *extra):
        return run_mpi(
            4,
            [
                "-m",
                "experiments.train",
                "--config",
                TINY,
                "--set",
                "backend=mpi",
                "--set",
                "epochs=1",
                "--set",
                "checkpoint_every=0",
                "--set",
                f"out_dir={out}",
                "--quiet",
                *extra,
            ],
            timeout=180,
        )

    result = cli(tmp_path / "mpi", "--set", "observers=[1]")
    assert result.returncode == 0, result.stderr[-2000:]
    local = train_everywhere(
        tiny(f"out_dir={tmp_path / 'local'}", "observers=[1]", "checkpoint_every=0")
    )
    summary = json.loads((tmp_path / "mpi" / "summary.json").read_text())
    assert summary["model_sha256"] == local[0]["model_sha256"]
    assert [observed_dir(tmp_path / "mpi", k).exists() for k in range(4)] == [
        False,
        True,
        False,
        False,
    ]
    mpi_view = load_view(observed_dir(tmp_path / "mpi", 1))
    local_view = load_view(observed_dir(tmp_path / "local", 1))
    assert (
        summary["observed_bytes"]
        == local[0]["observed_bytes"]
        == [0, message_bytes(mpi_view), 0, 0]
    )
    assert mpi_view.meta == local_view.meta and mpi_view.steps == local_view.steps
    for a, b in zip(mpi_view.records, local_view.records):
        assert all(
            torch.equal(x["tensor"], y["tensor"]) for x, y in zip(a["messages"], b["messages"])
        )


def test_the_attack_pages_network_section():
    from experiments.pages.privacy_attacks.network import network_dp, network_text
    from experiments.pages.privacy_attacks.regimes import NETWORK

    network = network_dp(NETWORK)
    cases = {(c["noise"], c["steps"], c["topology"]): c for c in network["cases"]}
    specs = NETWORK["topologies"]
    assert list(cases) == [(*case, spec) for case in NETWORK["cases"] for spec in specs]
    for c in cases.values():  # never above the local-DP ceiling (1e-12: the SVD's rounding)
        assert c["max"] <= c["local"] * (1 + 1e-12) and 0 <= c["min"] <= c["median"]
    # After 20 steps every observer's view determines x + eta: every pair at the ceiling.
    assert all(cases[("once", 20, spec)]["at_local"] == 1.0 for spec in specs)
    # With fresh noise every step, the ring hides distant peers best, the complete graph not at all.
    every = [cases[("every_step", 20, spec)]["median"] for spec in specs]
    assert every[0] < every[1] < every[2]
    assert every[2] == pytest.approx(cases[("every_step", 20, "ring:16")]["local"])
    # The section's table, on ring:4 after 2 steps (the page's --quick network row): the observer
    # computes x_2 + eta_2 exactly (tests/privacy/test_network_dp.py), every pair at the ceiling 0.726.
    small = network_dp(dict(NETWORK, topologies=["ring:4"], cases=[["once", 2]]))
    assert "| once | 2 | ring:4 | 0.726 | 0.726 | 0.726 | 100 % | 0.726 |" in network_text(small)
    # The page's rows: tests/experiments/pages/privacy_attacks/


# ---- observers on schedules, through the declared message layout --------------------------------

SCHEDULES = ["one_peer_exponential:4", "matchings:4", "edge_sampling:ring:4:0.5"]
OBSERVED_SHAPES = [(6, 6), (6, 6), (5, 5), (5,)]  # square (full rank determines them) and a bias


def _tapped_peer(comm, spec, steps):
    """Gossip `spec` with every peer recording its view, and tapping what it sends: (view records,
    {(step, exchange within it): {receiver: tensor sent}}, the algorithm's final state)."""
    from gossip_powersgd.algorithms import make_algorithm
    from gossip_powersgd.privacy.views import RecordingCommunicator, ViewRecorder

    g = torch.Generator().manual_seed(100 + comm.rank)
    x = [torch.randn(s, generator=g, dtype=torch.float64) for s in OBSERVED_SHAPES]
    sent, holder = {}, {}

    def tap(send, recv):
        step = holder["algorithm"].steps
        exchange = sum(1 for s, _ in sent if s == step)
        sent[(step, exchange)] = {j: t.clone() for j, t in send.items()}

    algorithm = holder["algorithm"] = make_algorithm(spec, x, RecordingCommunicator(comm, tap))
    recorder = ViewRecorder(algorithm)
    for step in range(steps):
        for t in x:  # a local change, standing in for the optimizer's step
            t.add_(torch.randn(t.shape, generator=g, dtype=t.dtype), alpha=0.05)
        algorithm.step()
        recorder.flush()
    return recorder.records, recorder.meta, sent, algorithm.state_dict()


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(
    "spec",
    [
        "powergossip:rank=1,min_compression_rate=0",
        "powergossip:rank=6,min_compression_rate=0",
        "choco:compressor=topk:0.5,gamma=0.5",
    ],
)
def test_a_view_on_a_schedule_decodes_to_what_the_neighbour_sent(schedule, spec):
    from gossip_powersgd.privacy.reconstruction import reconstruct, relative_error
    from gossip_powersgd.privacy.views import ObservedView

    topology, steps = topologies.parse(schedule), 6
    out = LocalCluster(topology).run(_tapped_peer, spec, steps)
    views = [ObservedView(meta, records) for records, meta, _, _ in out]
    for i, view in enumerate(views):
        for record in view.records:  # the neighbours of the step's graph, never the union's
            assert record["senders"] == sorted(topology.at(record["step"]).neighbors(i))
        for j in view.meta["neighbors"]:
            messages = view.messages_from(j)
            sender_sent, sender_own = out[j][2], views[j].own_trajectory()
            assert [m["step"] for m in messages] == [
                s for s in range(steps) if j in topology.at(s).neighbors(i)
            ]
            for m in messages:
                # the bytes are those j sent to i in that exchange
                assert torch.equal(m["tensor"], sender_sent[(m["step"], m["exchange"])][i])
                parts = view.decode(m)
                if spec.startswith("choco"):
                    (part,) = parts
                    assert part.kind == "increment" and part.indices == [0, 1, 2, 3]
                    continue
                truth = sender_own[m["step"]]  # j's model when it sent (one half-step per step)
                for part in parts:
                    if part.kind == "model":  # the exactly gossiped bias, bit for bit
                        assert part.indices == [3] and torch.equal(part.values[0], truth[3])
                        continue
                    matrices = torch.stack([truth[k] for k in part.indices])
                    if part.kind == "right":  # (M Q)^T
                        expected = (matrices @ part.factor).transpose(1, 2)
                    else:  # P^T M
                        expected = part.factor.transpose(1, 2) @ matrices
                    # Each entry is a dot product of length n = 6 of a row (right) or column (left)
                    # of M with a unit-norm factor column, summed in another order than the
                    # sender's kernel: they differ by at most 2 n u |row| |column| (twice the dot
                    # product's forward error bound, one for each side; u = eps / 2).
                    longest = max(
                        torch.linalg.vector_norm(matrices, dim=d).max().item() for d in (1, 2)
                    )
                    bound = 6 * torch.finfo(torch.float64).eps * longest
                    assert (part.block - expected).abs().max().item() <= bound
                # both ends hold the same factors: i's record of j's message, j's of i's
                back = [
                    n
                    for n in views[j].messages_from(i)
                    if (n["step"], n["exchange"]) == (m["step"], m["exchange"])
                ]
                assert all(
                    torch.equal(m["factors"][g], back[0]["factors"][g]) for g in m["factors"]
                )
            estimates = reconstruct(view, j, window=1)
            assert sorted(estimates) == sorted({m["step"] for m in messages})
            if spec.startswith("choco"):  # the rebuilt copy is what j holds of itself, bit for bit
                held = out[j][3][f"x_hat_out.{i}"]
                if not estimates:  # an edge idle in every step so far: both copies still zero
                    assert not held.any()
                    continue
                last = torch.cat([t.reshape(-1) for t in estimates[max(estimates)]])
                assert torch.equal(last, held)
            elif "rank=6" in spec:  # full rank: one half-step's square factor determines M_j;
                # Q (or P) is orthonormal to rounding (QR), so the solve loses only ~n*u
                for step, estimate in estimates.items():
                    assert relative_error(estimate, sender_own[step]) < 1e-12


def test_a_pushsum_view_on_a_directed_schedule_decodes_to_the_de_biased_model():
    from gossip_powersgd.privacy.reconstruction import reconstruct
    from gossip_powersgd.privacy.views import ObservedView

    topology, steps = topologies.parse("directed_exponential:4"), 4
    out = LocalCluster(topology).run(_tapped_peer, "pushsum", steps)
    views = [ObservedView(meta, records) for records, meta, _, _ in out]
    checked = 0
    for i, view in enumerate(views):
        for j in view.meta["neighbors"]:
            truth = views[j].own_trajectory()  # z_j, what j's parameters hold
            for step, estimate in reconstruct(view, j).items():
                assert j in topology.at(step).in_neighbors(i)
                # the message is fl(w z) and w: dividing again is off by at most 2u|z| + O(u^2)
                for e, z in zip(estimate, truth[step]):
                    assert ((e - z).abs() <= 1.01 * torch.finfo(z.dtype).eps * z.abs()).all()
                checked += 1
    assert checked >= 4 * (steps - 1)  # every peer hears from someone at every step
