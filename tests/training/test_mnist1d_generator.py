"""training/mnist1d_generator.py: the mnist1d package's generator, run without touching the global
random streams and muting only the generating thread's output."""

import io
import random
import threading

import numpy as np
import torch

from gossip_powersgd.training.data import clear_dataset_cache, load_dataset
from gossip_powersgd.training.mnist1d_generator import _MuteThread


def test_only_the_generating_threads_writes_are_dropped():
    real = io.StringIO()
    muted = _MuteThread(real, threading.get_ident())
    muted.write("from the generator\n")
    other = threading.Thread(target=muted.write, args=("another peer's log line\n",))
    other.start()
    other.join()
    assert real.getvalue() == "another peer's log line\n"
    assert muted.getvalue() == real.getvalue()  # anything else is the real stream's


def test_mnist1d_deterministic_per_seed_and_leaves_global_rngs_alone(monkeypatch):
    monkeypatch.setenv("GOSSIP_POWERSGD_CACHE", "off")  # generated here, not read from disk
    clear_dataset_cache()
    np.random.seed(123)
    random.seed(123)
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    a = load_dataset("mnist1d:num_samples=500,seed=1")
    assert np.array_equal(np.random.get_state()[1], np_before) and random.getstate() == py_before
    assert a.x_train.shape == (400, 40) and a.x_test.shape == (100, 40)
    clear_dataset_cache()
    b = load_dataset("mnist1d:num_samples=500,seed=1")
    assert a is not b and torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    c = load_dataset("mnist1d:num_samples=500,seed=2")
    assert not torch.equal(a.x_train, c.x_train)
