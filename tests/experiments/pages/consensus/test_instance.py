"""experiments/pages/consensus/instance.py: the trained-models problem reads the epochs the
training saved."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd import consensus_problems as problems

torch.set_num_threads(1)


def test_models_problem_reads_the_saved_epochs(tmp_path):
    from experiments.pages.consensus.instance import SaveAtEpochs

    model = torch.nn.Linear(3, 2)
    hook = SaveAtEpochs((1, 3))
    hook.setup(type("Context", (), {"model": model, "steps_per_epoch": 2})())
    snapshots = {}
    for step in range(6):
        with torch.no_grad():
            model.weight.add_(1.0)
        hook.after_gossip(step)
        snapshots[step] = model.weight.detach().clone()
    assert sorted(hook.saved) == [1, 3]
    assert torch.equal(hook.saved[1][0], snapshots[1]) and torch.equal(
        hook.saved[3][0], snapshots[5]
    )
    path = tmp_path / "models.pt"
    torch.save({"epochs": {1: {0: hook.saved[1], 1: hook.saved[3]}}}, path)
    peer = problems.make_problem("models:epoch=1", 1, torch.float64, models_file=path)
    assert peer[0].dtype == torch.float64 and torch.equal(peer[0], snapshots[5].double())
    with pytest.raises(ValueError, match="saved at epochs"):
        problems.make_problem("models:epoch=3", 0, models_file=path)
    with pytest.raises(ValueError, match="no trained models"):
        problems.make_problem("models:epoch=1", 0, models_file=tmp_path / "missing.pt")
