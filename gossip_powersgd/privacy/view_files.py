"""Reading one recorded view file (`views`) back, checked: anything that is not a view file
`ViewRecorder` wrote (empty, truncated, changed after it was written, not a regular file, holding
objects beyond tensors and plain containers, or of the wrong shape) is a one-line ValueError
naming it; nothing in it is unpickled beyond what `weights_only=True` allows."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any, Dict

import torch

from gossip_powersgd.utils import escaped, one_line, require_regular_file

__all__ = ["STEP_FILE", "load_view_file"]

STEP_FILE = re.compile(r"^step-\d+\.pt$")
#: What each kind of view file must hold (key: type), beyond being a dict.
_REQUIRED = {
    "meta": {
        "format": int,
        "observer": int,
        "algorithm": str,
        "neighbors": list,
        "shapes": list,
        "dtype": str,
    },
    "step": {"step": int, "messages": list, "own": list},
}


#: The MS-DOS "directory" bit of a zip member's external attributes: torch's zip reader (miniz)
#: reads a member carrying it as empty and leaves the tensor's memory unwritten.
_DOS_DIRECTORY = 0x10


def _check_crc(path: Path, where: str) -> None:
    """Refuse a view file whose stored CRC-32s do not match its contents: `torch.load` does not
    check them, so a flipped byte in a tensor (or the pickle) would load as a different view. A
    member marked a directory (a flipped bit in its central-directory entry, outside the CRC)
    is refused too: torch would load that tensor as whatever its fresh memory held. A file that
    is not a zip archive at all is left to `torch.load`, whose failure names it."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return
    with archive:
        try:
            bad = archive.testzip()
        except Exception as exc:  # noqa: BLE001 - a damaged header: the archive does not read
            bad = f"(unreadable: {type(exc).__name__})"
        folders = [
            info.filename
            for info in archive.infolist()
            if info.is_dir() or info.external_attr & _DOS_DIRECTORY
        ]
    if bad is not None:
        raise ValueError(
            f"{where} is corrupt (its part {escaped(bad)} fails its CRC-32 check: the file "
            "changed after it was written): record the view again, or remove the file"
        )
    if folders:
        raise ValueError(
            f"{where} is corrupt (its part {escaped(folders[0])} is marked a directory, "
            "which torch.save never writes: the file changed after it was written): record "
            "the view again, or remove the file"
        )


def load_view_file(path: Path, kind: str) -> Dict[str, Any]:
    """One view file (`kind` "meta" or "step"), checked; a ValueError naming it otherwise."""
    where = f"recorded view file {path}"
    require_regular_file(path, where)
    if path.stat().st_size == 0:
        raise ValueError(
            f"{where} is empty (0 bytes; a write that did not finish?): record the "
            "view again, or remove the file"
        )
    _check_crc(path, where)
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse is a damaged or foreign file
        if type(exc).__name__ == "UnpicklingError":  # (the pickle module is never imported here)
            if "unsupported global" in str(exc).lower():  # torch refused a class: no view has one
                raise ValueError(
                    f"{where} holds objects other than tensors, numbers, strings, "
                    "lists and dicts: it was not written by ViewRecorder and was not "
                    "loaded"
                ) from None
            raise ValueError(
                f"{where} is corrupt (not a file torch.save wrote): record the view "
                "again, or remove the file"
            ) from None
        raise ValueError(
            f"{where} is truncated or corrupt ({type(exc).__name__}: "
            f"{one_line(exc, limit=120)}): record the view again, or remove the "
            "file"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{where} holds a {type(value).__name__}, not the dict of a {kind} "
            "record: it was not written by ViewRecorder"
        )
    wrong = [k for k, t in _REQUIRED[kind].items() if not isinstance(value.get(k), t)]
    if wrong:
        raise ValueError(
            f"{where} lacks or mistypes {', '.join(wrong)}: it is not a {kind} "
            "record written by ViewRecorder"
        )
    return value
