"""A new algorithm is one file plus one registry line: this file is the file, `register(HalfGossip)`
(in the fixture, so that the registry other tests see stays as shipped) the line. The class
describes itself; the CLI trains with it, observers record it and reconstruction decodes it through
its declared layout, with nothing else in the package told about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gossip_powersgd.algorithms import (
    REGISTRY,
    GossipAlgorithm,
    MessageLayout,
    Option,
    Part,
    register,
)
from gossip_powersgd.algorithms.base import FlatParams, require_undirected, step_weights
from gossip_powersgd.algorithms.exact import resolve_gamma
from gossip_powersgd.algorithms.layout import unflatten
from gossip_powersgd.specs import parse_optional_float

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


class HalfModel(MessageLayout):
    """A message is the sender's model rounded to float16: an estimate of it, to half precision."""

    def decode(self, message):
        values = unflatten(message["tensor"].to(self.dtype), self.shapes)
        return [Part("estimate", list(range(len(self.shapes))), values)]


class HalfGossip(GossipAlgorithm):
    """Gossip of the models rounded to half precision: x_i += γ Σ_j W_ij (h(x_j) - h(x_i)),
    h rounding to float16 and back. Each edge adds opposite terms at its ends, so the average is
    preserved (W symmetric); half the bytes of exact gossip in float32."""

    name = "halfgossip"
    summary = "exact gossip of the models rounded to float16 (the README's example algorithm)"
    options = {"gamma": Option("gamma", parse_optional_float, "consensus step")}
    gamma_source = "topology"
    directed = False
    layout = HalfModel

    @classmethod
    def label(cls, options):
        return "half-precision gossip"

    def __init__(self, params, comm, gamma=None):
        require_undirected("HalfGossip", comm)
        super().__init__(params, comm)
        self.gamma = resolve_gamma(gamma, comm)
        self._flat = FlatParams(self.params)
        self._send = torch.empty(self._flat.buffer.numel(), dtype=torch.float16)
        self._recv = {j: torch.empty_like(self._send) for j in comm.neighbors}

    def _step(self):
        neighbors, weights = step_weights(self.comm, self.steps)
        if not neighbors:
            return
        x = self._flat.pack()
        self._send.copy_(x)
        self._exchange(
            {j: self._send for j in neighbors},
            {j: self._recv[j] for j in neighbors},
            None if self.comm.is_static else self.steps,
        )
        own = self._send.to(x.dtype)
        for j, w in zip(neighbors, weights):
            x.add_(self._recv[j].to(x.dtype) - own, alpha=self.gamma * w)
        self._flat.unpack()

    def bytes_per_step(self):
        return len(step_weights(self.comm, self.steps)[0]) * self._send.numel() * 2


@pytest.fixture(scope="module")
def registered():
    register(HalfGossip)
    yield HalfGossip
    REGISTRY.pop(HalfGossip.name)


def test_the_example_trains_through_the_cli_and_is_observed_and_reconstructed(registered, tmp_path):
    from gossip_powersgd.cli.train import main
    from gossip_powersgd.privacy import load_view, observed_dir, reconstruct

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "--config",
                str(TINY),
                "--quiet",
                "--set",
                "algorithm=halfgossip",
                "--set",
                "epochs=1",
                "--set",
                "checkpoint_every=0",
                "--set",
                "observers=[0, 1]",
                "--set",
                f"out_dir={out}",
            ]
        )
    assert info.value.code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "halfgossip" and summary["observed_bytes"][1] > 0
    # The transport counted half of exact gossip's float32 bytes, and the model learned (4 classes:
    # chance is 0.25).
    assert summary["compression_ratio"] == 2.0 and summary["final_test_acc_avg_model"] > 0.5
    views = {k: load_view(observed_dir(out, k)) for k in (0, 1)}
    truth = views[0].own_trajectory()
    estimates = reconstruct(views[1], 0)
    assert sorted(estimates) == views[1].steps == sorted(truth)
    for step, estimate in estimates.items():  # the estimate is rank 0's model rounded, bit for bit
        assert all(torch.equal(e, t.half().to(t.dtype)) for e, t in zip(estimate, truth[step]))


def test_the_registry_describes_the_example_from_its_class_alone(registered):
    from gossip_powersgd.algorithms import (
        algorithm_label,
        describe_algorithms,
        gamma_kind,
        make_algorithm,
    )

    assert (
        "halfgossip:gamma  exact gossip of the models rounded to float16" in describe_algorithms()
    )
    assert algorithm_label("halfgossip:gamma=0.5") == "half-precision gossip"
    assert gamma_kind("halfgossip") == "topology"
    with pytest.raises(
        ValueError, match="algorithm spec 'halfgossip:rank=2': unknown option 'rank'; valid: gamma"
    ):
        make_algorithm("halfgossip:rank=2", [], None)
