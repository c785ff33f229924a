"""The training loop's extension points (`TrainingHooks`): order, set-up wrappers, eval keys, and
hook state that survives a checkpoint and a resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import TrainConfig, load_config
from gossip_powersgd.training.hooks import HookList, TrainingHooks
from gossip_powersgd.training.trainer import TIMING_KEYS, train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
PEERS = 4


def tiny(**changes) -> TrainConfig:
    base = load_config(TINY, deep=False).replace(quiet=True, checkpoint_every=0, log_every=0)
    return base.replace(**changes)


def run_with_hooks(config: TrainConfig, make_hooks, resume=False, stop_at=None):
    """Train on every peer with `make_hooks()`'s hooks; returns (summaries, {rank: hooks})."""
    made = {}

    def peer(comm):
        made[comm.rank] = make_hooks()

        def on_step(step):
            if stop_at is not None and step == stop_at:
                raise Interrupted(f"interrupted at step {step}")

        return train(comm, config, resume=resume, on_step=on_step, hooks=made[comm.rank])

    summaries = LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    return summaries, made


class Interrupted(RuntimeError):
    pass


class Recorder(TrainingHooks):
    """Logs every extension point it sees, with the step."""

    def __init__(self):
        self.events = []

    def setup(self, context):
        self.events.append(("setup", None))

    def before_backward(self, step, loss):
        self.events.append(("before_backward", step))

    def after_backward(self, step):
        self.events.append(("after_backward", step))

    def after_optimizer_step(self, step):
        self.events.append(("after_optimizer_step", step))

    def after_gossip(self, step):
        self.events.append(("after_gossip", step))

    def on_evaluation(self, record):
        self.events.append(("on_evaluation", record["step"]))


@pytest.mark.parametrize(
    "algorithm, step_order",
    [
        (
            "powergossip:rank=1",  # parameter gossip: after the optimizer step
            ["before_backward", "after_backward", "after_optimizer_step", "after_gossip"],
        ),
        (
            "powersgd:rank=1",  # a gradient averager: between backward and the optimizer step
            ["before_backward", "after_backward", "after_gossip", "after_optimizer_step"],
        ),
    ],
)
def test_each_point_runs_once_per_step_in_the_d_psgd_order(algorithm, step_order):
    config = tiny(algorithm=algorithm, epochs=2)
    summaries, made = run_with_hooks(config, lambda: [Recorder()])
    steps_per_epoch = summaries[0]["steps_per_epoch"]
    expected = [("setup", None)]
    for epoch in range(config.epochs):
        for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            expected += [(point, step) for point in step_order]
        expected.append(("on_evaluation", (epoch + 1) * steps_per_epoch))
    for rank in range(PEERS):
        assert made[rank][0].events == expected


def test_hooks_run_in_list_order():
    calls = []

    class Named(TrainingHooks):
        def __init__(self, name):
            self.name = name

        def after_gossip(self, step):
            calls.append(self.name)

    HookList([Named("a"), Named("b")]).after_gossip(0)
    assert calls == ["a", "b"]


class CountingOptimizer:
    """Wraps an optimizer and counts its steps; everything else is the wrapped optimizer's."""

    def __init__(self, inner):
        self.inner = inner
        self.steps = 0

    def step(self):
        self.steps += 1
        return self.inner.step()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class WrapOptimizer(TrainingHooks):
    def setup(self, context):
        self.wrapper = context.optimizer = CountingOptimizer(context.optimizer)


def test_a_setup_hook_that_wraps_the_optimizer_is_used():
    config = tiny(epochs=2)
    plain = LocalCluster(topologies.parse(config.topology), timeout=30).run(train, config)
    summaries, made = run_with_hooks(config, lambda: [WrapOptimizer()])
    for rank in range(PEERS):
        assert made[rank][0].wrapper.steps == summaries[rank]["steps"]
    assert summaries[0]["steps"] == 2 * summaries[0]["steps_per_epoch"]
    # the wrapper delegates: the run is the same run
    assert summaries[0]["model_sha256"] == plain[0]["model_sha256"]


class ZeroLoss(TrainingHooks):
    def before_backward(self, step, loss):
        return loss * 0.0


def test_before_backward_may_replace_the_loss_that_is_back_propagated():
    config = tiny(epochs=1)
    summaries, _ = run_with_hooks(config, lambda: [ZeroLoss()])
    # zero gradients, plain SGD: no peer moves from the common initial model
    assert len(set(summaries[0]["model_sha256"])) == 1
    assert summaries[0]["final_consensus_distance"] == 0.0
    assert summaries[0]["final_train_loss"] > 0  # the recorded loss is still the cross-entropy


class Accountant(TrainingHooks):
    """Counts the steps it has seen; its count is checkpointed and added to every eval record."""

    name = "accountant"

    def __init__(self):
        self.steps = 0
        self.loaded = None

    def after_gossip(self, step):
        self.steps += 1

    def on_evaluation(self, record):
        return {"accountant_steps": self.steps}

    def state_dict(self):
        return {"steps": self.steps, "marker": torch.tensor([7.0])}

    def load_state_dict(self, state):
        self.loaded = dict(state)
        self.steps = int(state["steps"])


def test_a_key_a_hook_adds_to_eval_records_shows_in_history():
    config = tiny(epochs=2)
    summaries, _ = run_with_hooks(config, lambda: [Accountant()])
    steps_per_epoch = summaries[0]["steps_per_epoch"]
    for summary in summaries:
        evals = [r for r in summary["history"] if r["kind"] == "eval"]
        assert [r["accountant_steps"] for r in evals] == [steps_per_epoch, 2 * steps_per_epoch]


def comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def test_a_hooks_state_is_checkpointed_and_comes_back_on_resume(tmp_path):
    reference, _ = run_with_hooks(
        tiny(out_dir=str(tmp_path / "reference"), checkpoint_every=1), lambda: [Accountant()]
    )
    steps_per_epoch = reference[0]["steps_per_epoch"]
    out = tmp_path / "run"
    config = tiny(out_dir=str(out), checkpoint_every=1)
    with pytest.raises(Interrupted):
        run_with_hooks(config, lambda: [Accountant()], stop_at=2 * steps_per_epoch + 3)
    saved = ckpt.read_checkpoint(ckpt.checkpoint_path(out, 1, 2))["state"]["hooks"]
    assert saved["accountant"]["steps"] == 2 * steps_per_epoch

    resumed, made = run_with_hooks(config, lambda: [Accountant()], resume=True)
    for rank in range(PEERS):
        hook = made[rank][0]
        assert hook.loaded["steps"] == 2 * steps_per_epoch
        assert torch.equal(hook.loaded["marker"], torch.tensor([7.0]))
        assert hook.steps == 3 * steps_per_epoch
        assert comparable(resumed[rank]["history"]) == comparable(reference[rank]["history"])
        assert resumed[rank]["model_sha256"] == reference[rank]["model_sha256"]


def test_resume_needs_the_hooks_the_run_was_started_with(tmp_path):
    config = tiny(out_dir=str(tmp_path / "run"), checkpoint_every=1, epochs=1)
    run_with_hooks(config, lambda: [Accountant()])
    for name in ("summary.json", "summary.md"):
        (tmp_path / "run" / name).unlink()
    with pytest.raises(
        ValueError,
        match=r"holds state for hooks \['accountant'\] but this run has "
        r"\[\]; resume with the hooks",
    ) as info:
        run_with_hooks(config, lambda: [], resume=True)
    assert "\n" not in str(info.value)


def test_bad_hook_lists_are_one_line_errors():
    with pytest.raises(ValueError, match="hooks must subclass TrainingHooks"):
        HookList([object()])
    with pytest.raises(ValueError, match="two hooks are named 'accountant'; give each a distinct"):
        HookList([Accountant(), Accountant()])

    class Clobber(TrainingHooks):
        def on_evaluation(self, record):
            return {"step": -1}

    with pytest.raises(ValueError, match="returned eval key 'step', which the record already has"):
        HookList([Clobber()]).on_evaluation({"kind": "eval", "step": 3})


@pytest.mark.parametrize(
    "value, kind",
    [(torch.tensor(1.5), "Tensor"), (np.float32(1.5), "float32"), ({"a": {1, 2}}, "dict")],
)
def test_an_eval_key_that_is_not_a_json_value_is_refused_naming_the_hook_and_key(value, kind):
    """Such a value failed at the first evaluation of a run with a run directory, with torch's
    'Object of type Tensor is not JSON serializable' naming neither hook nor key, and passed
    unnoticed in a run without one; now every run refuses it in one line that names both."""

    class Norm(TrainingHooks):
        name = "norm"

        def on_evaluation(self, record):
            return {"grad_norm": value}

    with pytest.raises(ValueError) as refused:
        HookList([Norm()]).on_evaluation({"kind": "eval", "step": 3})
    assert str(refused.value) == (
        f"hook 'norm' returned eval key 'grad_norm' as a {kind}, which is not a JSON value; "
        "return a number, string, bool, None or a list or dict of them (e.g. float(value) for "
        "a tensor or numpy scalar)"
    )
    # JSON values pass, numpy's float64 (a float) among them
    fine = {"a": 1, "b": [1.5, None], "c": {"d": "e"}, "f": np.float64(0.25), "g": float("nan")}

    class Fine(TrainingHooks):
        def on_evaluation(self, record):
            return fine

    assert HookList([Fine()]).on_evaluation({"kind": "eval"}) == {"kind": "eval", **fine}
