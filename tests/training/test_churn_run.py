"""training/churn_run.py: the state a joiner is handed (`TrainingState`) carries the model, the
optimizer's momentum, the step and the membership counters, and refuses the state of another step.
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
        changes, shift_total = 2, 0.5

    sender = TrainingState(*make(0), RunState(step=7), Driver())
    fresh_model = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.1, momentum=0.9)
    joiner_driver = Driver()
    joiner_driver.changes, joiner_driver.shift_total = 0, 0.0
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
    with pytest.raises(ValueError, match="at step 8 but was handed the state of step 7"):
        TrainingState(fresh_model, fresh_optimizer, RunState(step=8), joiner_driver).unpack(
            sender.pack()
        )
