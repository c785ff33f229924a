"""Bring-your-own datasets and models that exit the process (tests/privacy/test_views_reliability.py)."""

import sys


def data_exit0(seed=0):
    sys.exit(0)


def data_exit1():
    sys.exit(1)


def local_data_exit(rank, num_peers):
    sys.exit("no data here")


def model_exit_in_forward(input_shape, num_classes):
    import torch

    class Quitter(torch.nn.Linear):
        def forward(self, x):
            exit()

    return Quitter(input_shape[0], num_classes)
