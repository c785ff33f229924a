"""Config validation (training/validation.py), numeric limits: values far beyond what a run can use
are clamped with one warning line naming the value the run uses, or refused in one line; never a
silent no-op, never a hang. (tiny.yaml: 1600 training samples on 4 peers, 13 steps per epoch, 3
epochs; logreg 20 x 4.)"""

from __future__ import annotations

import time

import pytest

from gossip_powersgd.utils import RunWarning

from tests.conftest import TINY, errors_on_every_rank, one_error
from tests.conftest import tiny_config as tiny

HUGE = 10**12


def train_cli(tmp_path, *sets):
    """gossip-train --config tiny in this process: its summary."""
    from gossip_powersgd.cli.train import run

    argv = ["--config", str(TINY), "--quiet", "--set", f"out_dir={tmp_path / 'run'}"]
    for item in sets:
        argv += ["--set", item]
    return run(argv)


def test_local_steps_beyond_the_runs_steps_is_refused_on_every_rank():
    """local_steps 100 with 3 x 13 = 39 steps: no communication round would ever happen."""
    errors = errors_on_every_rank(tiny("local_steps=100"))
    assert len(set(errors)) == 1, errors
    assert errors[0] == (
        "ValueError: local_steps 100 exceeds the run's 39 optimizer steps (3 epochs of 13): the "
        "peers would never communicate; set local_steps to at most 39"
    )


def test_a_warmup_shorter_than_two_steps_is_refused_on_every_rank():
    """warmup_epochs 0.1 at 13 steps per epoch is 1.3 steps, rounded to 1: step k of a W-step
    warm-up runs at lr*(k+1)/W, so the run would have had no warm-up at all (it had, silently)."""
    assert one_error(errors_on_every_rank(tiny("warmup_epochs=0.1"))) == (
        "ValueError: bad value for 'warmup_epochs': 0.1 (1 step(s) at 13 steps per epoch, and a "
        "warm-up needs at least 2: set it to at least 0.153846, or 0 for none)"
    )


@pytest.mark.parametrize(
    "key, words",
    [
        (
            "eval_every",
            "eval_every 1000000000000 exceeds epochs (3): the run evaluates at its end "
            "only (as with eval_every: 3)",
        ),
        (
            "checkpoint_every",
            "checkpoint_every 1000000000000 exceeds epochs (3): the run writes "
            "its checkpoint at its end only (as with checkpoint_every: 3)",
        ),
        (
            "batch_size",
            "batch_size 1000000000000 exceeds the peers' shards (400 training samples "
            "each on average): each step takes a peer's whole shard, an effective batch size of "
            "about 400",
        ),
    ],
)
def test_an_every_or_a_batch_far_beyond_the_run_is_clamped_with_one_warning(tmp_path, key, words):
    with pytest.warns(RunWarning) as caught:
        summary = train_cli(tmp_path, f"{key}={HUGE}")
    assert [str(w.message) for w in caught if w.category is RunWarning] == [words]
    assert summary["epochs"] == 3 and summary["final_test_acc_avg_model"] > 0.25


def test_epochs_beyond_any_run_are_refused_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"bad value for 'epochs': 10{21}.*at most 2\*\*53"):
        tiny("epochs=1000000000000000000000")
    assert time.perf_counter() - start < 30  # the check needs no data (not: a minutes-long hang)


#: A value out of range for each registered algorithm that checks its options (the others take
#: no option with a range), and the constructor's own words for it.
OUT_OF_RANGE = [
    ("powergossip:rank=0", "rank must be an integer >= 1, got 0"),
    ("powergossip:iters=0", "num_iterations must be an integer >= 1, got 0"),
    ("powergossip:gamma=-1", "gamma must be > 0, got -1.0"),
    ("powergossip:gamma=1e39", "gamma must be finite and at most 3.403e+38 (float32), got 1e+39"),
    ("choco:compressor=sign,gamma=inf", "ChocoGossip: gamma must be finite and at most 3.403e+38"),
    ("powersgd:rank=0", "rank must be an integer >= 1, got 0"),
    ("powersgd:start_iter=-1", "start_iter must be an integer >= 0, got -1"),
    ("powersgd:min_compression_rate=-1", "min_compression_rate must be >= 0 and finite, got -1.0"),
    ("exact:gamma=5", "gamma=5 is outside the stable range (0, 1.5) of ring:4"),
    ("choco:gamma=0.1", "ChocoGossip needs a compressor, e.g. compressor='topk:0.01'"),
    ("deepsqueeze:compressor=sign", "DeepSqueeze needs a tuned consensus step gamma"),
]


@pytest.mark.parametrize("spec, words", OUT_OF_RANGE, ids=[s for s, _ in OUT_OF_RANGE])
def test_an_algorithm_option_out_of_range_is_refused_as_the_config_loads(spec, words):
    """The algorithm's own checks (`check_config`) run in validate_config where the topology's size
    is known (ring:4 here): one line naming the key and the spec, before any library is loaded
    or any peer set up. Under a launcher that sizes the topology, the set-up runs them
    (`test_an_algorithm_option_out_of_range_under_a_launcher_is_refused_at_set_up`)."""
    from gossip_powersgd.training.config import load_config

    with pytest.raises(ValueError) as raised:
        load_config(TINY, [f"algorithm={spec}"], deep=False)
    line = str(raised.value)
    assert line.startswith(f"bad value for 'algorithm': algorithm spec {spec!r}: {words}"), line
    assert "\n" not in line


def test_an_algorithm_option_out_of_range_under_a_launcher_is_refused_at_set_up():
    """topology "ring" (sized by the launcher's world) cannot be checked as the config loads; the
    set-up checks it on every rank against the communicator's topology, with the same line."""
    import topologies
    from gossip_powersgd import LocalCluster
    from gossip_powersgd.training.config import load_config
    from gossip_powersgd.training.setup import checked_config

    spec = "powersgd:rank=0"
    config = load_config(TINY, [f"algorithm={spec}", "topology=ring", "backend=mpi"], deep=False)
    messages = {}

    def peer(comm):
        try:
            checked_config(comm, config, resume=False)
        except ValueError as exc:
            messages[comm.rank] = str(exc)
            raise

    with pytest.raises(ValueError):
        LocalCluster(topologies.ring(4), timeout=60).run(peer)
    expected = f"bad value for 'algorithm': algorithm spec {spec!r}: rank must be an integer >= 1"
    assert sorted(messages) == [0, 1, 2, 3], messages
    assert {m.split(", got")[0] for m in messages.values()} == {expected}, messages


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_a_decay_without_the_step_schedule_is_refused_as_milestones_are(schedule):
    """`decay` multiplies the learning rate at the step schedule's milestones only: under another
    schedule it was accepted and ignored (milestones there are refused)."""
    with pytest.raises(ValueError) as info:
        tiny(f"schedule={schedule}", "decay=0.5")
    assert str(info.value) == "bad value for 'decay': 0.5 (decay is for schedule: step)"
    assert tiny(f"schedule={schedule}").decay == 0.1  # the default, not set: fine
    assert tiny("schedule=step", "milestones=[2]", "decay=0.5").decay == 0.5


def test_a_milestone_inside_the_warm_up_is_refused_naming_it_and_the_warm_ups_end():
    """A step-schedule milestone before warmup_epochs took effect only when the warm-up ended,
    without a word; one at the warm-up's end decays the first step after it, as it names."""
    from gossip_powersgd.training.config import TrainConfig
    from gossip_powersgd.training.trainer import learning_rate

    with pytest.raises(ValueError) as info:
        tiny("schedule=step", "warmup_epochs=2", "milestones=[0.5, 3]")
    assert str(info.value) == (
        "bad value for 'milestones': [0.5, 3.0] (milestone 0.5 falls inside the warm-up, which "
        "ends at epoch 2 (warmup_epochs), and would only take effect then: move it to 2 or later, "
        "or shorten warmup_epochs)"
    )
    assert tiny("schedule=step", "warmup_epochs=2", "milestones=[2, 3]").milestones == [2.0, 3.0]
    at_end = TrainConfig(lr=1.0, epochs=4, warmup_epochs=1, schedule="step", milestones=[1])
    assert [learning_rate(at_end, s, 10) for s in (8, 9, 10)] == pytest.approx([0.9, 1.0, 0.1])
