"""Recorded views (privacy/views.py) when things go wrong: observers on changing graphs, views
across --resume (observers added or dropped, a refused resume, another observe_every), a full disk
while recording and a killed writer's leftovers (damaged view files: test_view_files.py)."""

from __future__ import annotations


import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view, observed_dir, reconstruct
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train

from tests.conftest import TINY, no_space_for


def tiny(*overrides):
    return load_config(TINY, ["quiet=true", "log_every=0", "epochs=1", *overrides], deep=False)


def train_everywhere(config, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config, **kwargs)


def active_senders(topology, rank: int, step: int):
    """Whom `rank` hears from at `step`: its neighbours of W(step) (in-neighbours if directed)."""
    graph = topology.at(step)
    return sorted(graph.in_neighbors(rank) if graph.is_directed else graph.neighbors(rank))


# ---- observers on schedules and directed graphs -------------------------------------------------

CHOCO = "choco:compressor=topk:0.5,gamma=0.5"


@pytest.mark.parametrize(
    "spec, algorithm",
    [
        ("matchings:4", "exact"),
        ("one_peer_exponential:4", "powergossip:rank=1"),
        ("edge_sampling:ring:4:0.5", "powergossip:rank=1"),  # rank 1 is idle at steps 1, 14 and 15
        ("edge_sampling:ring:4:0.5", CHOCO),
        ("cyclic:ring:4,complete:4", CHOCO),
        ("directed_exponential:4", "pushsum"),
    ],
)
def test_observers_record_what_arrived_on_changing_graphs(tmp_path, spec, algorithm):
    out = tmp_path / "run"
    summaries = train_everywhere(
        tiny(f"topology={spec}", f"algorithm={algorithm}", f"out_dir={out}", "observers=[0, 1]")
    )
    topology, steps = topologies.parse(spec), summaries[0]["steps"]
    views = {k: load_view(observed_dir(out, k)) for k in (0, 1)}
    view = views[1]
    assert view.steps == list(range(steps))  # idle steps too: the view stays consecutive
    for record in view.records:
        expected = active_senders(topology, 1, record["step"])
        assert record["senders"] == expected
        assert sorted({m["sender"] for m in record["messages"]}) == expected
    if algorithm == "exact":  # the message is the model: read off bit for bit where the edge was up
        truth = views[0].own_trajectory()
        estimates = reconstruct(view, 0)
        assert sorted(estimates) == [s for s in range(steps) if 0 in active_senders(topology, 1, s)]
        for step, estimate in estimates.items():
            assert all(torch.equal(e, t) for e, t in zip(estimate, truth[step]))
    if algorithm.startswith("powergossip"):  # each edge alternates its own sides, idle or not
        for j in view.meta["neighbors"]:
            kinds = [m["kind"] for m in view.messages_from(j)]
            assert kinds == ["right" if n % 2 == 0 else "left" for n in range(len(kinds))]
        estimates = reconstruct(view, 0)
        assert estimates and all(len(e) == len(view.meta["shapes"]) for e in estimates.values())
    if algorithm == CHOCO:  # the public copies rebuilt from the view are rank 1's own, bit for bit
        state = ckpt.read_checkpoint(ckpt.checkpoint_path(out, 1, 1))["state"]["algorithm"]
        for j in view.meta["neighbors"]:
            estimates = reconstruct(view, j)
            last = estimates[max(estimates)]
            assert torch.equal(torch.cat([t.reshape(-1) for t in last]), state[f"x_hat_in.{j}"])


# ---- --resume: every traffic counter, observers added or dropped ---------------------------------


class Interrupted(RuntimeError):
    pass


def run_with_stats(config, resume=False, stop_at=None):
    """Train on every peer; each peer's summary and its communicator's final `CommStats`."""

    def on_step(step):
        if step == stop_at:
            raise Interrupted(f"interrupted at step {step}")

    def peer(comm):
        summary = train(comm, config, resume=resume, on_step=on_step)
        return summary, comm.stats

    return LocalCluster(topologies.parse(config.topology), timeout=60).run(peer)


def resumable(out, *overrides):
    return tiny(f"out_dir={out}", "epochs=3", "log_every=5", "checkpoint_every=1", *overrides)


def interrupt_in_epoch_3(config):
    steps_per_epoch = 13  # 1600 training samples / (4 peers x 32), rounded up
    with pytest.raises(Interrupted):
        run_with_stats(config, stop_at=2 * steps_per_epoch + 3)
    return 2 * steps_per_epoch  # the step the run resumes at (the epoch-2 checkpoint)


def message_bytes(view):
    return sum(
        m["tensor"].numel() * m["tensor"].element_size()
        for r in view.records
        for m in r["messages"]
    )


def test_a_run_resumes_with_observers_added_recording_from_the_resumed_step(tmp_path):
    reference = run_with_stats(resumable(tmp_path / "ref"))
    out = tmp_path / "run"
    start = interrupt_in_epoch_3(resumable(out))
    assert not (out / "observed").exists()
    resumed = run_with_stats(resumable(out, "observers=[1]"), resume=True)
    assert [s["model_sha256"] for s, _ in resumed] == [s["model_sha256"] for s, _ in reference]
    view = load_view(observed_dir(out, 1))
    assert view.steps == list(range(start, reference[0][0]["steps"]))
    assert resumed[0][0]["observed_bytes"] == [0, message_bytes(view), 0, 0]


def test_a_run_resumes_with_observers_dropped(tmp_path):
    reference = run_with_stats(resumable(tmp_path / "ref"))
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out, "observers=[1]"))
    resumed = run_with_stats(resumable(out), resume=True)
    assert [s["model_sha256"] for s, _ in resumed] == [s["model_sha256"] for s, _ in reference]
    assert "observed_bytes" not in resumed[0][0]


def test_an_observer_dropped_on_resume_reports_no_bytes(tmp_path):
    """Resumed with observers [2] instead of [1]: rank 1 records nothing in the resumed run, yet it
    reported the bytes it restored from the checkpoint (observed_bytes [0, N, M, 0] under
    observers [2]; the table's total counted them beside rank 2 alone)."""
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out, "observers=[1]"))
    resumed = run_with_stats(resumable(out, "observers=[2]"), resume=True)
    summary = resumed[0][0]
    assert summary["observers"] == [2]
    assert summary["observed_bytes"] == [0, 0, message_bytes(load_view(observed_dir(out, 2))), 0]


def test_a_refused_resume_writes_no_view(tmp_path):
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out))
    with pytest.raises(ValueError, match="was written with another config: lr 0.5 -> 0.25"):
        run_with_stats(resumable(out, "observers=[1]", "lr=0.25"), resume=True)
    assert not (out / "observed").exists()


def test_a_resume_with_another_observe_every_is_refused_naming_the_view(tmp_path):
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out, "observers=[1]"))
    meta = observed_dir(out, 1) / "meta.pt"
    with pytest.raises(ValueError) as info:
        run_with_stats(resumable(out, "observers=[1]", "observe_every=2"), resume=True)
    assert str(info.value) == (
        f"recorded view file {meta} was written with other settings "
        "(observe_every differ): resume with the observe_every it was "
        "recorded with, or move that directory away"
    )


def test_a_resume_that_would_leave_a_gap_in_the_view_is_refused_naming_it(tmp_path):
    """Observers dropped for a stretch that reached a checkpoint, then added back: appending would
    give a view missing the steps between, read as consecutive (and observed_bytes counting only
    the last stretch)."""
    out = tmp_path / "run"
    with pytest.raises(Interrupted):  # records steps 0..14; the epoch-1 checkpoint is at step 13
        run_with_stats(resumable(out, "observers=[1]"), stop_at=15)
    with pytest.raises(Interrupted):  # steps 13..28 without observers; checkpoint at 26
        run_with_stats(resumable(out), resume=True, stop_at=29)
    folder = observed_dir(out, 1)
    with pytest.raises(ValueError) as info:
        run_with_stats(resumable(out, "observers=[1]"), resume=True)
    assert str(info.value) == (
        f"recorded view {folder} ends at step 14, but this run records from step 26 "
        "(steps 15..25 ran without this observer): move that directory away to record a "
        "new view from this step"
    )
    assert load_view(folder).steps == list(range(15))  # the view is left as it was


# ---- view files: a full disk, damaged files, a killed writer's leftovers --------------------------


def test_a_full_disk_while_recording_names_the_file_and_the_fix(tmp_path, monkeypatch):
    from gossip_powersgd.privacy import views

    out = tmp_path / "run"
    no_space_for(monkeypatch, views, "step-00000003.pt")
    with pytest.raises(OSError) as info:
        train_everywhere(tiny(f"out_dir={out}", "observers=[1]"))
    path = observed_dir(out, 1) / "step-00000003.pt"
    assert str(info.value) == (
        f"rank 1: cannot write the recorded view file {path}: No space "
        "left on device; free space or choose another out_dir "
        "(--set out_dir=...)"
    )


def test_a_killed_writers_leftover_temporary_view_files_are_removed_when_recording_starts(tmp_path):
    from gossip_powersgd import ExactGossip
    from gossip_powersgd.privacy import ViewRecorder

    folder = tmp_path / "view"
    folder.mkdir()
    leftovers = [folder / ".step-00000002.pt.k2j4_x9q.tmp", folder / ".meta.pt.a1b2c3d4.tmp"]
    kept = [folder / "step-00000099.pt", folder / "notes.tmp", folder / ".other.pt.x1y2.tmp"]
    for file in leftovers + kept:
        file.write_bytes(b"half a file")

    def peer(comm):
        x = torch.full((3,), float(comm.rank))
        gossip = ExactGossip([x], comm)
        recorder = ViewRecorder(gossip, folder if comm.rank == 1 else None)
        untouched = all(f.exists() for f in leftovers)  # nothing is written before a record
        for _ in range(2):
            gossip.step()
            recorder.flush()
        recorder.close()
        return untouched

    assert LocalCluster(topologies.ring(4), timeout=30).run(peer)[1]
    assert not any(f.exists() for f in leftovers)
    assert all(f.exists() for f in kept)
    assert sorted(p.name for p in folder.glob("step-0000000*.pt")) == [
        "step-00000000.pt",
        "step-00000001.pt",
    ]
