"""The experiment trackers under churn: the lowest member holds them (`training.tracker_base`).

A run whose rank 0 leaves (``on_peer_loss: continue``, ``churn: leave:0@10``, in-process) kept
its trackers on rank 0: TensorBoard held the log records up to step 10 and no evaluation and no
summary, though the run finished normally. Each tracker's own reader reads back what the run wrote
(TensorBoard's event accumulator over every event file of the log dir, the MLflow client on its
SQLite store); TensorBoard stores float32, so values are compared at float32 rounding (2^-24).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.test_trackers import FLOAT32, run_local, tiny


def records(run_dir: Path, rank: int):
    lines = (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def churn_run(tmp_path, churn: str):
    """A 3-epoch run (13 steps each: evaluations at 13, 26, 39) with `churn`, logged to
    TensorBoard and MLflow; (run dir, TensorBoard events, MLflow client, MLflow run)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny(
        tmp_path,
        epochs=3,
        log_every=5,
        on_peer_loss="continue",
        churn=churn,
        loggers=["tensorboard", {"mlflow": {"experiment": "churn"}}],
    )
    run_local(config)
    run_dir = Path(config.out_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("churn").experiment_id])
    return run_dir, events, client, run


def steps_of(events, client, run, tag):
    """The steps of `tag` in TensorBoard and in the MLflow run, each in the order held."""
    tensorboard = [e.step for e in events.Scalars(tag)]
    mlflow = sorted(m.step for m in client.get_metric_history(run.info.run_id, tag))
    return tensorboard, mlflow


def test_when_rank_0_leaves_the_trackers_hold_every_record_and_the_summary_once(tmp_path):
    run_dir, events, client, run = churn_run(tmp_path, "leave:0@10")
    survivor = records(run_dir, 1)  # a member throughout: every record of the run
    summary = json.loads((run_dir / "summary.json").read_text())
    for kind in ("log", "eval"):
        expected = [r["step"] for r in survivor if r["kind"] == kind]
        assert steps_of(events, client, run, f"{kind}/train_loss") == (expected, expected), kind
    evals = [r for r in survivor if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [13, 26, 39]
    for event, record in zip(events.Scalars("eval/test_acc_avg_model"), evals):
        assert event.value == pytest.approx(record["test_acc_avg_model"], rel=FLOAT32)
    assert steps_of(events, client, run, "summary/final_test_acc_avg_model") == ([39], [39])
    (final,) = events.Scalars("summary/final_test_acc_avg_model")
    assert final.value == pytest.approx(summary["final_test_acc_avg_model"], rel=FLOAT32)
    assert run.info.status == "FINISHED" and run.data.params["churn"] == "leave:0@10"
    assert summary["members_at_end"] == [1, 2, 3]


def test_rank_0_back_holds_the_trackers_again_from_its_join(tmp_path):
    """The rule: the lowest current member holds them, so rank 0 takes them back at its join
    (step 20) from rank 1, which held them from step 10: an eval record's own figures
    (``_local``) are its holder's, rank 1's at step 13, rank 0's at 26 and 39."""
    run_dir, events, client, run = churn_run(tmp_path, "leave:0@10,join:0@20")
    zero, one = records(run_dir, 0), records(run_dir, 1)
    for kind in ("log", "eval"):
        expected = [r["step"] for r in one if r["kind"] == kind]
        assert steps_of(events, client, run, f"{kind}/train_loss") == (expected, expected), kind
    evals = {
        rank: {r["step"]: r for r in rows if r["kind"] == "eval"}
        for rank, rows in ((0, zero), (1, one))
    }
    shown = {e.step: e.value for e in events.Scalars("eval/test_loss_local")}
    assert sorted(shown) == [13, 26, 39] and 13 not in evals[0]  # rank 0 was away at 13
    for step, value in shown.items():
        holder = 1 if 10 < step <= 20 else 0
        assert value == pytest.approx(evals[holder][step]["test_loss_local"], rel=FLOAT32), step
    for step in (26, 39):  # the two ranks' figures differ: the check above tells them apart
        assert evals[0][step]["test_loss_local"] != pytest.approx(
            evals[1][step]["test_loss_local"], rel=1e-4
        )
    assert steps_of(events, client, run, "summary/steps") == ([39], [39])
    assert run.info.status == "FINISHED"


def test_a_resumed_run_whose_rank_0_had_left_continues_the_same_tracker_runs(tmp_path):
    """Resumed from the end of epoch 2 (rank 0 away since step 10), rank 1 holds the trackers:
    it continues the MLflow run whose id every peer's checkpoint holds, and TensorBoard shows the
    records the interrupted attempt wrote after the checkpoint once (purged, then written again)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.training.test_trackers import _Interrupt, _stop_at

    config = tiny(
        tmp_path,
        epochs=3,
        log_every=5,
        on_peer_loss="continue",
        churn="leave:0@10",
        loggers=["tensorboard", {"mlflow": {"experiment": "churn"}}],
    )
    with pytest.raises(_Interrupt):  # in epoch 3, after the epoch-2 checkpoint and a log record
        run_local(config, on_step=_stop_at(31))
    run_local(config, resume=True)
    run_dir = Path(config.out_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("churn").experiment_id])
    survivor = records(run_dir, 1)
    for kind in ("log", "eval"):
        expected = [r["step"] for r in survivor if r["kind"] == kind]
        assert steps_of(events, client, run, f"{kind}/train_loss") == (expected, expected), kind
    assert 30 in [r["step"] for r in survivor]  # written before the interruption and again
    assert steps_of(events, client, run, "summary/steps") == ([39], [39])
    assert run.info.status == "FINISHED"


def wandb_churn_run(tmp_path, monkeypatch, churn: str):
    """A 3-epoch run with `churn`, logged to an offline W&B run (every record: log_every 1), its
    peers free threads; (run dir, the offline runs' files oldest first, the order in which the
    peers' trackers released and opened their W&B runs). A leaving peer, once through its part
    of the change, waits (up to 10 s) until another peer has opened the trackers: what a slow
    leaver lets happen, at once."""
    import threading

    import topologies
    from gossip_powersgd import LocalCluster
    from gossip_powersgd.membership.peer import PeerMembership
    from gossip_powersgd.training.trackers import WandbTracker
    from gossip_powersgd.training.trainer import train

    monkeypatch.setenv("WANDB_SILENT", "true")
    order, opened = [], threading.Event()
    for name in ("open", "release"):

        def noted(self, *args, _name=name, _original=getattr(WandbTracker, name)):
            _original(self, *args)  # noted once done: a release has finished its run then
            order.append((_name, self.rank))
            if _name == "open" and len(order) > 1:  # a holder after the first
                opened.set()

        monkeypatch.setattr(WandbTracker, name, noted)
    advance = PeerMembership.advance

    def slow_leaver(self, step, state):
        change = advance(self, step, state)
        if change is not None and self.rank in set(change.previous.live) - set(change.epoch.live):
            opened.wait(timeout=10)
        return change

    monkeypatch.setattr(PeerMembership, "advance", slow_leaver)
    config = tiny(
        tmp_path,
        epochs=3,
        log_every=1,
        on_peer_loss="continue",
        churn=churn,
        loggers=[{"wandb": {"mode": "offline"}}],
    )
    cluster = LocalCluster(topologies.parse(config.topology), timeout=60, cooperative=False)
    cluster.run(train, config)
    run_dir = Path(config.out_dir)
    files = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    return run_dir, sorted(files, key=lambda path: path.stat().st_mtime_ns), order


@pytest.mark.parametrize(
    "churn, holders",
    [("leave:0@2", [0, 1]), ("leave:0@2,join:0@20", [0, 1, 0])],
)
def test_a_wandb_holder_releases_its_run_before_the_next_holder_opens_it(
    tmp_path, monkeypatch, churn, holders
):
    """W&B keeps one active run per process, and in-process peers are threads of one process:
    a new holder whose wandb.init came before the leaving holder's run.finish was handed that
    run back (W&B returns the active run), which the leaving holder then finished: the new
    holder's records and summary failed ("Run ... is finished"). The leaving holder released
    after its part in the change's collective, so the others could open first (a slow leaver,
    as `wandb_churn_run` makes it); it now releases before it. The newest offline run holds
    every record of the run once (W&B resumes no offline run: each holder logs the earlier
    ones again), with the summary, and ends with exit code 0."""
    from tests.training.test_trackers import wandb_items, wandb_records

    run_dir, files, order = wandb_churn_run(tmp_path, monkeypatch, churn)
    expected = [("open", holders[0])]
    for old, new in zip(holders, holders[1:]):
        expected += [("release", old), ("open", new)]
    assert order == expected
    assert len(files) == len(holders)  # one offline run per holder, each its own
    rows = wandb_records(files[-1])
    history = [r for r in rows if r.WhichOneof("record_type") == "history"]
    survivor = records(run_dir, 1)  # a member throughout: every record of the run
    steps = [wandb_items(r.history.item)["_step"] for r in history]
    assert steps == sorted({r["step"] for r in survivor})  # rising: each step once
    summary = json.loads((run_dir / "summary.json").read_text())
    final = {k: v for r in rows for k, v in wandb_items(r.summary.update).items()}
    assert final["summary/final_test_acc_avg_model"] == summary["final_test_acc_avg_model"]
    (exit_record,) = [r.exit for r in rows if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0
