"""Reading recorded view files (privacy/view_files.py): a damaged file (empty, corrupt, a
bit-flipped byte, foreign objects, a FIFO or a directory) is one line naming it and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gossip_powersgd.privacy import load_view, observed_dir
from tests.privacy.test_views_reliability import tiny, train_everywhere


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A complete recorded view (rank 1 of a tiny run)."""
    out = tmp_path_factory.mktemp("recorded") / "run"
    train_everywhere(tiny(f"out_dir={out}", "observers=[1]", "checkpoint_every=0"))
    return observed_dir(out, 1)


def damaged_copy(recorded, tmp_path, name, damage):
    import shutil

    folder = tmp_path / "view"
    shutil.copytree(recorded, folder)
    path = folder / name
    damage(path)
    return folder, path


def pickled_object(path):
    import pickle

    path.write_bytes(pickle.dumps(Path("/"), protocol=2))  # a class: torch must refuse it


def fifo(path):
    path.unlink()
    os.mkfifo(path)
    unblock_later(path)


def unblock_later(path, seconds=20.0):
    """Should a reader open the FIFO `path` (which would block it for good), open its writing end
    after `seconds` so that the reader gets an empty file: the test then fails instead of hanging."""
    import threading

    def release():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader is waiting (ENXIO) or the FIFO is gone: nothing to release

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()


def directory(path):
    path.unlink()
    path.mkdir()


def flip_a_message_byte(path):
    """One bit-flipped byte in the first message's tensor: torch.load alone reads it silently as
    another message; the zip member's CRC-32 no longer matches."""
    data = bytearray(path.read_bytes())
    tensor = torch.load(path, weights_only=True)["messages"][0]["tensor"]
    at = bytes(data).index(tensor.numpy().tobytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


def mark_a_tensor_a_directory(path):
    """The MS-DOS directory bit set in a tensor member's central-directory entry (outside every
    CRC-32): torch reads that member as empty and loads the tensor as uninitialised memory."""
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")  # the first central-directory entry
    while True:
        name_length = int.from_bytes(data[at + 28 : at + 30], "little")
        if data[at + 46 : at + 46 + name_length].split(b"/")[-2:-1] == [b"data"]:
            break
        at = data.index(b"PK\x01\x02", at + 4)
    data[at + 38] |= 0x10  # the low byte of the external attributes
    path.write_bytes(bytes(data))


VIEW_DAMAGES = [
    (
        "meta.pt",
        lambda p: p.write_bytes(b""),
        "is empty (0 bytes; a write that did not finish?): "
        "record the view again, or remove the file",
    ),
    (
        "meta.pt",
        lambda p: p.write_bytes(b"\x80\x02garbage"),
        "is corrupt (not a file torch.save wrote): record the view again, or remove the file",
    ),
    (
        "meta.pt",
        pickled_object,
        "holds objects other than tensors, numbers, strings, lists and "
        "dicts: it was not written by ViewRecorder and was not loaded",
    ),
    (
        "step-00000002.pt",
        lambda p: p.write_bytes(p.read_bytes()[:300]),
        "is truncated or corrupt (",
    ),
    (
        "meta.pt",
        lambda p: torch.save([1, 2], p),
        "holds a list, not the dict of a meta record: it was not written by ViewRecorder",
    ),
    (
        "step-00000002.pt",
        lambda p: torch.save({"step": 2}, p),
        "lacks or mistypes messages, own: it is not a step record written by ViewRecorder",
    ),
    (
        "meta.pt",
        fifo,
        "is a FIFO (named pipe), not a regular file: replace it with the file itself",
    ),
    (
        "step-00000002.pt",
        flip_a_message_byte,
        "is corrupt (its part archive/data/",
    ),
    (
        "step-00000002.pt",
        mark_a_tensor_a_directory,
        "is corrupt (its part archive/data/",
    ),
    (
        "step-00000002.pt",
        directory,
        "is a directory, not a regular file: replace it with the file itself",
    ),
]


@pytest.mark.parametrize(
    "name, damage, expected",
    VIEW_DAMAGES,
    ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(VIEW_DAMAGES)],
)
def test_a_damaged_view_file_is_one_line_naming_it(recorded, tmp_path, name, damage, expected):
    folder, path = damaged_copy(recorded, tmp_path, name, damage)
    with pytest.raises(ValueError) as info:
        load_view(folder)
    message = str(info.value)
    assert message.startswith(f"recorded view file {path} {expected}")
    assert "\n" not in message and "weights_only" not in message
