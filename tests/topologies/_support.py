"""Helpers shared by the tests of the topologies package (tests/topologies/test_*.py): the
invariants of a valid mixing matrix, the product of a schedule's steps, and a `python` subprocess
run from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from topologies import Topology

REPO = Path(__file__).resolve().parents[2]


def assert_valid_mixing(t: Topology) -> None:
    """The invariants every topology must satisfy, checked from scratch."""
    W = t.W
    assert W.dtype == np.float64 and W.shape == (t.size, t.size)
    np.testing.assert_allclose(W, W.T, atol=1e-12)
    np.testing.assert_allclose(W.sum(axis=0), 1.0, atol=1e-9)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-9)
    off = W - np.diag(np.diag(W))
    assert off.min() >= 0
    lam = np.linalg.eigvalsh(W)
    assert lam.max() == pytest.approx(1.0, abs=1e-9)
    assert lam.min() >= -1 - 1e-9
    for i in range(t.size):
        assert t.neighbors(i) == tuple(j for j in range(t.size) if j != i and W[i, j] > 0)


def product(schedule, steps: int) -> np.ndarray:
    out = np.eye(schedule.size)
    for t in range(steps):
        step = schedule.at(t)
        out = (step.P if schedule.is_directed else step.W) @ out
    return out


def _run(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
