"""Reliability III, recorded views and the failures of the newer features: observers on changing
graphs, counters and views across --resume, user code that calls sys.exit, attack scores of a
diverged model, files that are not regular files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view, observed_dir, reconstruct
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train

from tests.conftest import ROOT, no_space_for

TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def tiny(*overrides):
    return load_config(TINY, ["quiet=true", "log_every=0", "epochs=1", *overrides], deep=False)


def train_everywhere(config, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config, **kwargs)


def cli(argv, capsys):
    """experiments.train's console entry point in this process: (exit code, stderr lines)."""
    from experiments.train import main

    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    return info.value.code, capsys.readouterr().err.strip().splitlines()


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


def test_an_internal_key_error_names_its_type_and_key(tmp_path, capsys, monkeypatch):
    from gossip_powersgd.training import trainer as trainer_module

    def broken(*args, **kwargs):
        raise KeyError(0)

    monkeypatch.setattr(trainer_module, "_train", broken)
    code, lines = cli(["--config", TINY, "--set", f"out_dir={tmp_path / 'run'}"], capsys)
    assert code == 1
    assert lines[-1] == (
        "error: internal error: KeyError 0 (a lookup of a missing key; please "
        "report it with the command that caused it)"
    )
    assert lines[0].startswith("Traceback")  # a bug is not hidden behind one line


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


@pytest.mark.parametrize("topology", ["ring:4", "matchings:4"])
def test_resume_restores_every_traffic_counter(tmp_path, topology):
    reference = run_with_stats(resumable(tmp_path / "ref", f"topology={topology}"))
    config = resumable(tmp_path / "run", f"topology={topology}")
    interrupt_in_epoch_3(config)
    resumed = run_with_stats(config, resume=True)
    for (ref_summary, ref_stats), (summary, stats) in zip(reference, resumed):
        assert summary["model_sha256"] == ref_summary["model_sha256"]
        assert stats == ref_stats  # the whole CommStats: rounds and critical_bytes too
        assert stats.rounds > 0 and stats.critical_bytes > 0
    assert reference[0][0]["steps_per_epoch"] == 13  # what interrupt_in_epoch_3 assumes


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


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A complete recorded view (rank 1 of a tiny run)."""
    out = tmp_path_factory.mktemp("recorded") / "run"
    train_everywhere(tiny(f"out_dir={out}", "observers=[1]", "checkpoint_every=0"))
    return observed_dir(out, 1)


def damaged_copy(recorded, tmp_path, name, damage):
    import shutil

    folder = tmp_path / "view"
    shutil.copytree(recorded, folder)
    path = folder / name
    damage(path)
    return folder, path


def pickled_object(path):
    import pickle

    path.write_bytes(pickle.dumps(Path("/"), protocol=2))  # a class: torch must refuse it


def fifo(path):
    path.unlink()
    os.mkfifo(path)
    unblock_later(path)


def unblock_later(path, seconds=20.0):
    """Should a reader open the FIFO `path` (which would block it for good), open its writing end
    after `seconds` so that the reader gets an empty file: the test then fails instead of hanging."""
    import threading

    def release():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader is waiting (ENXIO) or the FIFO is gone: nothing to release

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()


def directory(path):
    path.unlink()
    path.mkdir()


VIEW_DAMAGES = [
    (
        "meta.pt",
        lambda p: p.write_bytes(b""),
        "is empty (0 bytes; a write that did not finish?): "
        "record the view again, or remove the file",
    ),
    (
        "meta.pt",
        lambda p: p.write_bytes(b"\x80\x02garbage"),
        "is corrupt (not a file torch.save wrote): record the view again, or remove the file",
    ),
    (
        "meta.pt",
        pickled_object,
        "holds objects other than tensors, numbers, strings, lists and "
        "dicts: it was not written by ViewRecorder and was not loaded",
    ),
    (
        "step-00000002.pt",
        lambda p: p.write_bytes(p.read_bytes()[:300]),
        "is truncated or corrupt (",
    ),
    (
        "meta.pt",
        lambda p: torch.save([1, 2], p),
        "holds a list, not the dict of a meta record: it was not written by ViewRecorder",
    ),
    (
        "step-00000002.pt",
        lambda p: torch.save({"step": 2}, p),
        "lacks or mistypes messages, own: it is not a step record written by ViewRecorder",
    ),
    (
        "meta.pt",
        fifo,
        "is a FIFO (named pipe), not a regular file: replace it with the file itself",
    ),
    (
        "step-00000002.pt",
        directory,
        "is a directory, not a regular file: replace it with the file itself",
    ),
]


@pytest.mark.parametrize(
    "name, damage, expected",
    VIEW_DAMAGES,
    ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(VIEW_DAMAGES)],
)
def test_a_damaged_view_file_is_one_line_naming_it(recorded, tmp_path, name, damage, expected):
    folder, path = damaged_copy(recorded, tmp_path, name, damage)
    with pytest.raises(ValueError) as info:
        load_view(folder)
    message = str(info.value)
    assert message.startswith(f"recorded view file {path} {expected}")
    assert "\n" not in message and "weights_only" not in message


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


# ---- a FIFO in place of a checkpoint ----------------------------------------------------------------


def test_a_fifo_in_place_of_a_checkpoint_is_refused_on_every_rank(tmp_path):
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out))
    path = ckpt.checkpoint_path(out, 2, 2)
    path.unlink()
    os.mkfifo(path)
    unblock_later(path)

    def peer(comm):
        try:
            train(comm, resumable(out), resume=True)
        except ValueError as exc:
            return str(exc)
        return "trained"

    lines = LocalCluster(topologies.ring(4), timeout=60).run(peer)  # hung in open() before
    assert set(lines) == {
        f"checkpoint {path} is a FIFO (named pipe), not a regular file: "
        "replace it with the file itself"
    }


# ---- attack scores of a diverged model --------------------------------------------------------------


def test_non_finite_attack_scores_are_refused_naming_the_count():
    from gossip_powersgd.privacy import auc, loss_attack
    from gossip_powersgd.privacy.membership import tpr_at_fpr

    nan = float("nan")
    with pytest.raises(
        ValueError,
        match=r"^3 of 3 member scores are not finite \(NaN or infinite\): "
        r"the model has likely diverged",
    ):
        auc([nan] * 3, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"^1 of 2 non-member scores are not finite"):
        tpr_at_fpr([0.0, 1.0], [float("inf"), 1.0])
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = nan  # every sample's logits, hence every loss, become NaN
    x, y = torch.ones(5, 4), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError) as info:
        loss_attack(model, (x, y), (x, y))
    assert str(info.value) == (
        "5 of 5 member scores are not finite (NaN or infinite): the model "
        "has likely diverged (check its parameters for NaN/inf); no attack "
        "score is meaningful for it"
    )


# ---- user code that calls sys.exit --------------------------------------------------------------------

EXIT_HINT = (
    "; a dataset or model function must return its result (or raise an exception), never "
    "exit the process"
)


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "dataset=exit_fixtures:data_exit0",
            "'exit_fixtures:data_exit0': the user code called sys.exit/exit(0) while calling it",
        ),
        (
            "dataset=exit_fixtures:data_exit1",
            "'exit_fixtures:data_exit1': the user code called sys.exit/exit(1) while calling it",
        ),
        ("dataset=sys:exit", "'sys:exit': the user code called sys.exit/exit() while calling it"),
        (
            "model=builtins:exit",
            "'builtins:exit': the user code called sys.exit/exit() while calling it",
        ),
        (
            "dataset=exit_on_import:data",
            "'exit_on_import:data': the user code called sys.exit/exit(0) "
            "while importing module 'exit_on_import'",
        ),
        (
            "model=exit_fixtures:model_exit_in_forward",
            "'exit_fixtures:model_exit_in_forward': the user "
            "code called sys.exit/exit() while running the model on the dataset's inputs",
        ),
    ],
)
def test_user_code_calling_sys_exit_is_an_error_naming_the_spec(tmp_path, capsys, override, line):
    code, lines = cli(
        ["--config", TINY, "--set", override, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    key = override.split("=")[0]  # the CLI's deep config check loads and runs them first
    assert code == 1 and lines == [f"error: bad value for {key!r}: {line}{EXIT_HINT}"]
    assert not (tmp_path / "run").exists()


def test_user_code_calling_sys_exit_fails_on_every_rank():
    def peer(comm, config):
        try:
            train(comm, config)
        except ValueError as exc:
            return str(exc)
        return "trained"

    for spec, partition in [
        ("exit_fixtures:data_exit0", "iid"),
        ("exit_fixtures:local_data_exit", "local"),
    ]:
        extra = ["public_train_size=64"] if partition == "local" else []  # sizes stay private
        config = tiny(f"dataset={spec}", f"partition={partition}", "checkpoint_every=0", *extra)
        lines = LocalCluster(topologies.ring(4), timeout=60).run(peer, config)
        assert len(set(lines)) == 1 and "the user code called sys.exit/exit(" in lines[0], lines


# ---- in-process peers and torch's global RNG --------------------------------------------------------


def global_rng_peer(comm):
    torch.manual_seed(42 + comm.rank)  # the shared global generator: order depends on the threads
    return torch.randn(3)


def own_generator_peer(comm):
    g = torch.Generator().manual_seed(42 + comm.rank)
    return torch.randn(3, generator=g)


def rng_warnings(cluster, fn):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = cluster.run(fn)
    return results, [
        w
        for w in caught
        if issubclass(w.category, RuntimeWarning) and "global RNG" in str(w.message)
    ]


@pytest.mark.parametrize("kwargs", [dict(cooperative=False), dict(cooperative=True, lanes=2)])
def test_concurrent_peers_that_use_the_global_rng_are_warned_once(kwargs):
    from gossip_powersgd.comm.local import GLOBAL_RNG_WARNING

    _, caught = rng_warnings(LocalCluster(topologies.ring(4), **kwargs), global_rng_peer)
    assert [str(w.message) for w in caught] == [GLOBAL_RNG_WARNING]
    assert "\n" not in GLOBAL_RNG_WARNING and "own torch.Generator" in GLOBAL_RNG_WARNING
    runs = [
        rng_warnings(LocalCluster(topologies.ring(4), **kwargs), own_generator_peer)
        for _ in range(2)
    ]
    assert runs[0][1] == runs[1][1] == []
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))


def test_one_peer_at_a_time_may_use_the_global_rng_unwarned():
    _, caught = rng_warnings(LocalCluster(topologies.ring(4), cooperative=True), global_rng_peer)
    assert caught == []


def test_the_readme_example_is_bit_identical_when_peers_run_at_once():
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## The library in 20 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(block[: block.index("topology = ")], namespace)  # defines peer(comm), runs nothing
    results = []
    for kwargs in [dict(cooperative=True, lanes=2)] * 2 + [dict(cooperative=False)] * 2:
        values, caught = rng_warnings(LocalCluster(topologies.ring(8), **kwargs), namespace["peer"])
        assert caught == []
        results.append(values)
    assert all(r == results[0] for r in results)  # floats compared exactly: the same bits
