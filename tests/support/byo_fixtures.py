"""Bring-your-own dataset and model functions used by tests/training/test_data.py and test_models.py.

Referenced by spec strings such as ``"byo_fixtures:linear_data"``; the tests put this directory on
``sys.path`` so the module imports under that name however pytest is configured.
"""

import numpy as np
import torch
from torch import nn


def linear_data(seed=0):
    """Numpy arrays, seeded: the loader must pass our seed through."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((60, 3))
    y = (x[:, 0] > 0).astype(np.int32)
    return x[:50], y[:50], x[50:], y[50:]


def tensor_data():
    """Tensors, no seed argument, float labels that are whole numbers."""
    x = torch.arange(24, dtype=torch.float64).reshape(12, 2)
    y = torch.tensor([0.0, 1.0, 2.0] * 4)
    return x[:9], y[:9], x[9:], y[9:]


def three_arrays():
    return np.zeros((4, 2)), np.zeros(4), np.zeros((2, 2))


def mismatched_lengths():
    return np.zeros((10, 2)), np.zeros(9, dtype=int), np.zeros((2, 2)), np.zeros(2, dtype=int)


def fractional_labels():
    return np.zeros((4, 2)), np.array([0, 0.5, 1, 1]), np.zeros((2, 2)), np.zeros(2, dtype=int)


def broken():
    raise RuntimeError("disk on fire")


NOT_CALLABLE = 42


def small_net(input_shape, num_classes):
    """Draws its initial weights from the global RNG, like most user code."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 7), nn.ReLU(), nn.Linear(7, num_classes)
    )


def fixed_net():
    return nn.Linear(40, 10)


def not_a_module(input_shape, num_classes):
    return "a string"


def options_net(input_shape, num_classes, width=4, bias=True, act="relu"):
    """A constructor with keyword options, torchvision style ("byo_fixtures:options_net:width=8")."""
    activation = {"relu": nn.ReLU(), "tanh": nn.Tanh()}[act]
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(int(np.prod(input_shape)), width, bias=bias),
        activation,
        nn.Linear(width, num_classes),
    )
