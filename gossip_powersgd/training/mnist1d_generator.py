"""MNIST-1D from the mnist1d package's own generator (Greydanus & Steinbach), quietly and without
touching anyone's random streams; `data.py` names it `mnist1d`, `data_cache.py` keeps what it
generates on disk."""

from __future__ import annotations

import contextlib
import random
import sys
import threading

import numpy as np

#: The mnist1d package's own default seed: the data set its paper's published figures are about.
STANDARD_SEED = 42


class _MuteThread:
    """A stdout stand-in that drops writes from one thread and forwards everyone else's.

    ``contextlib.redirect_stdout`` swaps ``sys.stdout`` for the whole process; muting only the
    generating thread keeps other peers' log lines while the dataset is being built.
    """

    def __init__(self, real, thread_id: int):
        self._real, self._thread_id = real, thread_id

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread_id:
            return len(text)
        return self._real.write(text)

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


def generate(recipe) -> dict:
    """mnist1d's own generator (only the local one: get_dataset would try to download a pickle)
    with the `recipe`'s arguments: its x, y, x_test, y_test."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    for key, value in recipe.items():
        setattr(args, key, value)
    # make_dataset seeds and draws from the *global* numpy and random RNGs; put them back so that
    # loading data never changes anyone else's random stream.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with contextlib.redirect_stdout(_MuteThread(sys.stdout, threading.get_ident())):
            raw = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {k: raw[k] for k in ("x", "y", "x_test", "y_test")}


__all__ = ["generate", "STANDARD_SEED"]
