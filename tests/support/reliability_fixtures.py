"""Bring-your-own datasets and models that go wrong, for the reliability cases beside each module.

Referenced by spec strings such as ``"reliability_fixtures:unseeded_data"`` (tests/support/ is on
sys.path)."""

import itertools
import threading

import numpy as np
import torch
from torch import nn

_CALLS = itertools.count()
_CALLS_LOCK = threading.Lock()


def _arrays(rng):
    x = rng.standard_normal((400, 5))
    y = (x[:, 0] > 0).astype(np.int64)
    return x[:320], y[:320], x[320:], y[320:]


def per_call_data(seed=0):
    """Different data on every call, as if each peer's process drew its own."""
    with _CALLS_LOCK:
        call = next(_CALLS)
    return _arrays(np.random.default_rng([seed, call]))


def unseeded_data():
    """Draws from numpy's global random state: different data on every MPI rank."""
    x = np.random.standard_normal((400, 5))
    y = (x[:, 0] > 0).astype(np.int64)
    return x[:320], y[:320], x[320:], y[320:]


class _Labelled(torch.utils.data.Dataset):
    """A map-style Dataset with a ``targets`` attribute, its records read only by ``[i]``."""

    def __init__(self, x, y):
        self.x, self.targets = torch.as_tensor(x, dtype=torch.float32), list(map(int, y))

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.x[i], self.targets[i]


def _torch_pair(train_rng, labelled: bool):
    """(train, test) torch Datasets: the training records drawn from `train_rng`, the test set
    always the same (only the training set differs between calls)."""
    x, y, _, _ = _arrays(train_rng)
    _, _, x_test, y_test = _arrays(np.random.default_rng(0))
    test = torch.utils.data.TensorDataset(torch.as_tensor(x_test), torch.as_tensor(y_test))
    if labelled:
        return _Labelled(x, y), test
    return torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), test


def per_call_tensor_datasets(seed=0):
    """TensorDatasets whose training records differ on every call (the test set does not)."""
    with _CALLS_LOCK:
        call = next(_CALLS)
    return _torch_pair(np.random.default_rng([seed, call]), labelled=False)


def per_call_labelled_datasets(seed=0):
    """Datasets with ``targets`` whose training records differ on every call."""
    with _CALLS_LOCK:
        call = next(_CALLS)
    return _torch_pair(np.random.default_rng([seed, call]), labelled=True)


#: Which training set `variant_tensor_datasets` returns (a test changes it between two runs).
VARIANT = [0]


def variant_tensor_datasets(seed=0):
    """TensorDatasets whose training records are those of `VARIANT` (data changed under a spec)."""
    return _torch_pair(np.random.default_rng([seed, 1000 + VARIANT[0]]), labelled=False)


def empty_test_set(seed=0):
    x_train, y_train, _, _ = _arrays(np.random.default_rng(seed))
    return x_train, y_train, np.zeros((0, 5)), np.zeros(0, dtype=np.int64)


def huge_label(seed=0):
    x_train, y_train, x_test, y_test = _arrays(np.random.default_rng(seed))
    y_train = y_train.copy()
    y_train[7] = 10**9
    return x_train, y_train, x_test, y_test


def frozen_net(input_shape, num_classes):
    net = nn.Linear(int(np.prod(input_shape)), num_classes)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def meta_net(input_shape, num_classes):
    return nn.Linear(int(np.prod(input_shape)), num_classes, device="meta")


def double_net(input_shape, num_classes):
    return nn.Linear(int(np.prod(input_shape)), num_classes).to(torch.float64)


def wrong_input_net(input_shape, num_classes):
    return nn.Linear(int(np.prod(input_shape)) + 3, num_classes)


def batch_norm_net(input_shape, num_classes):
    width = int(np.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(width, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_classes)
    )
