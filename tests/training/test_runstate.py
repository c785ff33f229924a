"""training/runstate.py: what changes as a run trains, its loss windows and timers, and the one
place that says what a checkpoint holds (a whole run resumed bit for bit: test_checkpoint.py)."""

import random

import numpy as np
import pytest
import torch

from gossip_powersgd.comm.base import CommStats
from gossip_powersgd.training.hooks import HookList
from gossip_powersgd.training.runstate import RunState


def test_the_two_loss_windows_are_taken_apart_and_an_empty_batch_counts_only_its_step():
    state = RunState()
    for loss in (1.0, None, 3.0):
        state.finish_step(loss)
    assert state.step == 3
    assert state.take_log_loss() == 2.0  # (1 + 3) / 2: the empty batch has no loss
    state.finish_step(5.0)
    assert state.take_log_loss() == 5.0  # a new log window
    assert state.take_train_loss() == 3.0  # (1 + 3 + 5) / 3: the evaluation window goes on
    assert state.take_train_loss() is None  # nothing since: no loss (it read 0.0, a loss)
    state.finish_step(None)
    assert state.take_log_loss() is None  # a window of empty batches only (DP) has no loss


class Holder:
    """A training object: what it was given back by load_state_dict."""

    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class Algorithm(Holder):
    time_compute, time_communication = 0.25, 0.5


class Comm:
    def __init__(self, **counters):
        self.stats = CommStats(**counters)


def objects(value, comm):
    return dict(
        model=Holder(value),
        optimizer=Holder(value),
        algorithm=Algorithm(value),
        batches=Holder(value),
        comm=comm,
        hooks=HookList(),
    )


def test_a_checkpoint_round_trip_restores_every_object_counter_window_and_timer():
    """Saved with the base timers a resumed run starts from (gossip timers: the base plus the
    algorithm's own counters), the training objects' states, the traffic counters and the RNGs;
    loaded into fresh objects it gives the same state back."""
    state = RunState(
        step=12,
        epoch=3,
        history=[{"kind": "eval", "epoch": 3}],
        loss_sum=1.5,
        loss_count=2,
        log_sum=0.5,
        log_count=1,
        time_compute=2.0,
        base_gossip_compute=1.0,
        base_communication=4.0,
        base_wall=10.0,
    )
    saved = state.to_checkpoint(**objects("saved", Comm(bytes_sent=7, rounds=3)), include_rng=True)
    assert saved["times"]["gossip_compute"] == 1.25 and saved["times"]["communication"] == 4.5
    assert saved["times"]["wall"] >= 10.0
    fresh = objects("fresh", Comm())
    resumed = RunState.from_checkpoint(saved, **fresh, restore_rng=False)
    assert all(fresh[k].value == "saved" for k in ("model", "optimizer", "algorithm", "batches"))
    assert fresh["comm"].stats == CommStats(bytes_sent=7, rounds=3)
    kept = ["step", "epoch", "history", "loss_sum", "loss_count", "log_sum", "log_count"]
    assert all(getattr(resumed, name) == getattr(state, name) for name in kept + ["time_compute"])
    assert (resumed.base_gossip_compute, resumed.base_communication) == (1.25, 4.5)
    assert resumed.base_wall == saved["times"]["wall"]


def test_the_global_rngs_travel_only_when_the_process_is_the_peers_own():
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    shared = RunState().to_checkpoint(**objects(0, Comm()), include_rng=False)
    own = RunState().to_checkpoint(**objects(0, Comm()), include_rng=True)
    assert shared["rng"] == {}
    after = (torch.rand(2), np.random.rand(), random.random())
    torch.manual_seed(6)
    np.random.seed(6)
    random.seed(6)
    RunState.from_checkpoint(own, **objects(1, Comm()), restore_rng=True)
    again = (torch.rand(2), np.random.rand(), random.random())
    assert torch.equal(after[0], again[0]) and after[1:] == again[1:]


def test_a_checkpoint_without_a_traffic_counter_is_refused_naming_it():
    saved = RunState().to_checkpoint(**objects(0, Comm()), include_rng=False)
    del saved["stats"]["critical_bytes"]
    with pytest.raises(ValueError, match=r"traffic counters lack 'critical_bytes' .*start the run"):
        RunState.from_checkpoint(saved, **objects(1, Comm()), restore_rng=False)
