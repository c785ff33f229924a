"""training/churn_run.py: the state a joiner is handed (`TrainingState`) carries the model, the
optimizer's momentum, the step and the membership counters, and refuses the state of another step;
the exact-gossip baseline counts the rounds a peer's traffic counters cover, less those whose
gossip a lost peer interrupted on it (noted after each gossip, kept in its checkpointed state).
(The loop through membership changes, end to end on the local backend: tests/training/test_churn.py;
across hosts: test_churn_hosts.py.)"""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd.training.churn_run import TrainingState


def test_training_state_round_trip_carries_model_momentum_and_step():
    from gossip_powersgd.training.runstate import RunState

    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        return model, optimizer

    class Driver:
        changes, shift_total, transfer_bytes = 2, 0.5, 1234

    sender = TrainingState(*make(0), RunState(step=7), Driver())
    fresh_model = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.1, momentum=0.9)
    joiner_driver = Driver()
    joiner_driver.changes, joiner_driver.shift_total, joiner_driver.transfer_bytes = 0, 0.0, 0
    joiner = TrainingState(fresh_model, fresh_optimizer, RunState(step=7), joiner_driver)
    joiner.unpack(sender.pack())  # a fresh optimizer (no state yet) takes the momentum too
    for a, b in zip(fresh_model.parameters(), sender.model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(fresh_model.parameters(), sender.model.parameters()):
        assert torch.equal(
            fresh_optimizer.state[a]["momentum_buffer"],
            sender.optimizer.state[b]["momentum_buffer"],
        )
    assert joiner_driver.changes == 2 and joiner_driver.shift_total == 0.5
    assert joiner_driver.transfer_bytes == 1234
    with pytest.raises(ValueError, match="at step 8 but was handed the state of step 7"):
        TrainingState(fresh_model, fresh_optimizer, RunState(step=8), joiner_driver).unpack(
            sender.pack()
        )


def test_exact_messages_count_the_rounds_a_peers_counters_cover():
    """ring:4, peer 2 away in steps 10..29: 2 neighbours in each round it is a member of; a
    process restarted with --rejoin and admitted at step 30 (`counted_from`) counts from there,
    as its traffic counters do; with a round every 2 steps, round t follows step 2t + 1. A round
    whose gossip a lost peer interrupted on the peer counts no message, as its counters count no
    byte of an exchange that did not finish (before, a full round: exact gossip's ratio above 1)."""
    from types import SimpleNamespace

    import topologies
    from gossip_powersgd.membership.epochs import Membership
    from gossip_powersgd.training.churn_run import ChurnRun

    changed = Membership(topologies.ring(4), [(10, (0, 1, 3)), (30, range(4))])

    def messages(rank, rounds, every, counted_from=0, membership=changed, interrupted=()):
        driver = SimpleNamespace(
            peer=SimpleNamespace(membership=membership),
            comm=SimpleNamespace(rank=rank),
            counted_from=counted_from,
            interrupted=list(interrupted),
        )
        return ChurnRun.exact_messages(driver, rounds, every)

    assert messages(2, 52, 1) == 2 * (10 + 22)
    assert messages(2, 52, 1, counted_from=30) == 2 * 22
    assert messages(0, 52, 1) == 2 * 52  # ring:4, then the ring of 0, 1, 3: two neighbours
    # rounds 0..25 after steps 1, 3, ..., 51: peer 2 is a member at rounds 0..4 and 15..25
    assert messages(2, 26, 2) == 2 * (5 + 11)
    assert messages(2, 26, 2, counted_from=31) == 2 * 11  # round 15 follows step 31
    assert messages(2, 26, 2, counted_from=32) == 2 * 10
    assert messages(2, 20, 1) == 2 * 10  # the run's rounds end the count
    # the membership never changed: the run's own graph, counted as without churn
    assert messages(2, 52, 1, membership=Membership(topologies.ring(4))) is None
    # interrupted gossip (training steps): steps 3 and 31 are rounds 1 and 15 with a round
    # every 2 steps; on a schedule, the interrupted round's own graph's neighbours are left out
    assert messages(0, 52, 1, interrupted=[10, 11]) == 2 * 50
    assert messages(2, 26, 2, interrupted=[3, 31]) == 2 * (4 + 10)
    assert messages(2, 52, 1, interrupted=[20]) == 2 * (10 + 22)  # away then: nothing to drop
    schedule = Membership(topologies.parse("one_peer_exponential:4"), [(10, (0, 1, 3))])
    graph = schedule.graph(schedule.epochs[0])
    full = messages(0, 20, 1, membership=schedule)
    assert full - messages(0, 20, 1, membership=schedule, interrupted=[5]) == len(
        graph.at(5).neighbors(0)
    )


def test_the_interrupted_gossip_steps_are_noted_after_each_gossip_and_kept_in_the_state():
    """`after_gossip` notes a step when the algorithm's count of interrupted steps grew during
    it; the list is in the hook's state (a resumed run counts the steps before its checkpoint
    too), and a checkpoint from before it loads as none."""
    from types import SimpleNamespace

    from gossip_powersgd.training.churn_run import ChurnRun

    algorithm = SimpleNamespace(interrupted_steps=0)
    driver = SimpleNamespace(peer=SimpleNamespace(algorithm=algorithm), interrupted=[])
    driver._dropped_seen = 0
    for step, dropped in [(7, 0), (8, 1), (9, 2), (10, 2), (11, 3)]:
        algorithm.interrupted_steps = dropped
        ChurnRun.after_gossip(driver, step)
    assert driver.interrupted == [8, 9, 11]
    driver.changes, driver.shift_total, driver.counted_from = 1, 0.0, 0
    driver.transfer_bytes = None  # (0add734's counter, merged beside this test)
    state = ChurnRun.state_dict(driver)
    resumed = SimpleNamespace()
    ChurnRun.load_state_dict(resumed, state)
    assert resumed.interrupted == [8, 9, 11]
    ChurnRun.load_state_dict(resumed, {"changes": 1, "shift_total": 0.0})
    assert resumed.interrupted == []


def test_every_key_the_churn_summary_adds_is_defined_in_the_churn_docs():
    """summary.json's churn keys are read by users: each is defined in docs/concepts/churn.md.
    `gossip_steps_dropped` adds up each member's interrupted steps (one step interrupted on three
    survivors counts 3), which its name alone would not tell: the docs say it counts member-steps."""
    import re
    from pathlib import Path
    from types import SimpleNamespace

    from gossip_powersgd.training.churn_run import ChurnRun

    fake = SimpleNamespace(
        peer=SimpleNamespace(algorithm=SimpleNamespace(interrupted_steps=1), epoch=None),
        comm=SimpleNamespace(
            stats=SimpleNamespace(transfer_bytes_sent=0), allreduce_=lambda *a, **k: None
        ),
        detected=None,
        changes=0,
        shift_total=0.0,
        transfer_bytes=None,
        config=SimpleNamespace(churn=None),
        interrupted=[],
    )
    fake.peer.epoch = SimpleNamespace(live=(0, 1, 2))
    keys = ChurnRun.summary_fields(fake)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "churn.md").read_text()
    assert [k for k in keys if f"`{k}`" not in docs] == []
    text = " ".join(docs.split())
    sentence = re.search(r"`gossip_steps_dropped`[^.]*\.", text).group(0)
    assert "member-steps" in sentence and "counts 3" in text


def test_the_dropped_gossip_steps_of_a_resumed_run_count_the_steps_before_its_checkpoint():
    """summary.json's `gossip_steps_dropped` came from the algorithm's own counter, which starts
    at 0 in a resumed process: the steps a loss interrupted before the checkpoint were left out.
    It is now the checkpointed list's length (`interrupted`), summed over the members."""
    from types import SimpleNamespace

    from gossip_powersgd.training.churn_run import ChurnRun

    summed = []

    def allreduce_(tensor, op, metric):
        summed.append(tensor.tolist())
        tensor.mul_(3)  # three members, each with this one's counts

    resumed = SimpleNamespace(
        peer=SimpleNamespace(
            algorithm=SimpleNamespace(interrupted_steps=0), epoch=SimpleNamespace(live=(0, 1, 3))
        ),
        comm=SimpleNamespace(stats=SimpleNamespace(transfer_bytes_sent=0), allreduce_=allreduce_),
        detected=None,
        changes=1,
        shift_total=0.0,
        transfer_bytes=None,
        config=SimpleNamespace(churn=None),
        interrupted=[],
    )
    ChurnRun.load_state_dict(resumed, {"changes": 1, "shift_total": 0.0, "interrupted": [12, 13]})
    assert ChurnRun.summary_fields(resumed)["gossip_steps_dropped"] == 6
    assert summed == [[0.0, 2.0]]


def test_a_joiner_is_handed_the_trackers_run_ids_and_continues_the_same_mlflow_run(tmp_path):
    """A process of gossip-train --rejoin knows no tracker run id: where it became the holder
    its MLflow and W&B runs were new ones. The members now hand it the run ids (raw bytes, with
    who held the trackers from which step) with its state, through the transfer's own bytes
    (`pack_state` / `unpack_state`, as `hand_over` sends them), and its MLflow tracker, opened
    as the holder, continues the members' run: the experiment holds one run, with the records of
    both."""
    from mlflow.tracking import MlflowClient

    from gossip_powersgd.membership.transfer import pack_state, unpack_state
    from gossip_powersgd.training.hooks import HookList
    from gossip_powersgd.training.runstate import RunState
    from gossip_powersgd.training.trackers import MLflowTracker, WandbTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("churn")
    member_run = client.create_run(experiment).info.run_id
    client.log_metric(member_run, "log/train_loss", 1.0, step=10)

    def peer(run_ids, holders):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trackers = [MLflowTracker(tracking_uri=uri), WandbTracker(mode="offline")]
        for tracker, run_id in zip(trackers, run_ids):
            tracker.run_id, tracker.holders = run_id, holders

        class Driver:
            changes, shift_total, transfer_bytes = 1, 0.0, 0
            hooks = HookList(trackers)

        return TrainingState(model, optimizer, RunState(step=20), Driver()), trackers

    member, _ = peer([member_run, "ab12cd34"], [[-1, 0], [10, 1], [20, 0]])
    joiner, (mlflow, wandb) = peer([None, None], [[-1, 0], [19, 1]])
    header, body = pack_state(member.pack())
    joiner.unpack(unpack_state(header, body, source=1))
    assert (mlflow.run_id, wandb.run_id) == (member_run, "ab12cd34")
    assert mlflow.holders == wandb.holders == [[-1, 0], [10, 1], [20, 0]]
    mlflow.active, mlflow.context, mlflow.run_dir = True, None, None  # the holder from step 20
    mlflow._open()
    mlflow.write({"log/train_loss": 0.5}, 25)
    mlflow.finish(None)
    (run,) = client.search_runs([experiment])
    history = client.get_metric_history(run.info.run_id, "log/train_loss")
    assert sorted((m.step, m.value) for m in history) == [(10, 1.0), (25, 0.5)]
