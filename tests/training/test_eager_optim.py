"""training/eager_optim.py: torch optimizers that build and step without importing torch's compiler,
with the same numbers (a fresh process, since the property is what a process has imported)."""

import subprocess
import sys
import textwrap

import torch

from gossip_powersgd.training import eager_optim
from tests.conftest import ROOT


def test_a_step_runs_in_the_optimizers_grad_mode_and_gives_the_callers_back(monkeypatch):
    """Without the compiler, a rebuilt step sets the grad mode torch's wrapper sets (the
    optimizer's `differentiable`) and restores the caller's, also when the step raises."""
    monkeypatch.setattr(eager_optim, "_compiler_loaded", lambda: False)
    seen = []

    def raw(optimizer, fail=False):
        seen.append(torch.is_grad_enabled())
        if fail:
            raise RuntimeError("step failed")
        return "stepped"

    step = eager_optim._eager_step(lambda *a, **k: "torch's own", raw)

    class Optimizer:
        defaults = {"differentiable": False}

    assert step(Optimizer()) == "stepped" and seen == [False] and torch.is_grad_enabled()
    try:
        step(Optimizer(), fail=True)
    except RuntimeError:
        pass
    assert torch.is_grad_enabled()
    monkeypatch.setattr(eager_optim, "_compiler_loaded", lambda: True)
    assert step(Optimizer()) == "torch's own"  # once the compiler is there, torch's wrapper


def test_a_step_that_is_not_torchs_wrapper_is_left_alone_and_patching_is_idempotent():
    class Plain(torch.optim.Optimizer):
        def step(self, closure=None):
            return None

    original = Plain.step
    eager_optim.defer_compiler_import(Plain)
    assert Plain.step is original
    eager_optim.defer_compiler_import(torch.optim.SGD)
    patched = torch.optim.SGD.step
    eager_optim.defer_compiler_import(torch.optim.SGD)
    assert torch.optim.SGD.step is patched


#: A child that steps SGD (momentum, Nesterov, weight decay), Adam and AdamW as the trainer builds
#: them, before and after torch's compiler is imported, and prints whether it was imported early.
OPTIMIZERS = textwrap.dedent(
    """
    import sys, torch
    from gossip_powersgd.training.config import TrainConfig
    from gossip_powersgd.training.setup import make_optimizer

    def trained(name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
        config = TrainConfig(optimizer=name, momentum=0.9, nesterov=name == "sgd",
                             weight_decay=1e-3, lr=0.05)
        optimizer = make_optimizer(config, model.parameters())
        x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
        for _ in range(5):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        optimizer.load_state_dict(optimizer.state_dict())
        optimizer.step()  # once more, from the reloaded state
        assert torch.is_grad_enabled()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    names = ("sgd", "adam", "adamw")
    before = [trained(n) for n in names]
    print("compiler imported before:", "torch._dynamo" in sys.modules)
    import torch._dynamo  # now torch's own wrappers run
    after = [trained(n) for n in names]
    print("equal:", all(torch.equal(a, b) for a, b in zip(before, after)))
    """
)


def test_optimizers_step_without_importing_the_compiler_and_give_the_same_numbers():
    result = subprocess.run(
        [sys.executable, "-c", OPTIMIZERS], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["compiler imported before: False", "equal: True"]
