"""Small helpers every layer shares: one-line error text, atomic file writes, rank ranges, commits,
tensor work compiled to run without the GIL.

Each lives here once so that the trainer, checkpoints, the transports and the experiments say and do
the same thing (an error's first line, a file that is either old or new, never half-written).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union


def one_line(exc: BaseException, limit: Optional[int] = None) -> str:
    """The first line of an exception's message (its type name if it has none).

    A KeyError's message is the repr of its key; its quotes are dropped so that the line reads as
    text. `limit` cuts the line to that many characters.
    """
    text = str(exc).strip()
    if isinstance(exc, KeyError):
        text = text.strip("'\"")
    text = text.splitlines()[0] if text else type(exc).__name__
    return text[:limit] if limit is not None else text


def escaped(text: str) -> str:
    """`text` on one line: each character Python does not print as itself (a line break, a control
    character, a lone surrogate from undecodable bytes) written as its Python escape."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


class RunWarning(UserWarning):
    """A value the run adjusted (clamped to what it can use) or a doubt about its input: shown as
    one line, ``warning: ...`` (`launch.main_guard`), on the rank that found it."""


def warn(text: str) -> None:
    """Issue `text` as a `RunWarning` (pytest.warns and warnings filters see it like any warning)."""
    warnings.warn(text, RunWarning, stacklevel=2)


def available_memory() -> Optional[int]:
    """Bytes of memory this machine can still give (Linux's MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def write_stderr_line(line: str) -> None:
    """Write `line` and its newline to stderr in one write call.

    `print` writes the text and the newline separately; under mpiexec the ranks share one stderr,
    so another rank's line could land between the two and two error lines would run together.
    A single write of under a pipe buffer (4 KiB) is atomic.
    """
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def atomic_write(
    path: Union[str, Path],
    data: Union[bytes, str],
    mode: Optional[int] = None,
    *,
    sync: bool = True,
) -> None:
    """Write `data` (bytes, or text as UTF-8) to `path` so that `path` is always old or new, whole.

    The data goes to a temporary file in the same directory, is fsynced, and replaces `path` with
    `os.replace` (atomic on POSIX); the directory is fsynced too so the rename survives a crash. The
    parent directory is created if missing; the file gets a normal mode (0666 less the umask), or
    `mode` (e.g. 0o600 for a secret: the temporary file has it from its creation on, so the secret
    is never readable by others, not even for a moment). `sync=False` leaves out both fsyncs: the
    file is still old or new whole after the process is killed, not after the machine goes down
    (for a file rewritten at every step).
    """
    path = Path(path)
    if isinstance(data, str):
        payload = data.encode("utf-8")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        payload = bytes(data)
    else:
        raise TypeError(f"atomic_write takes bytes or str, not {type(data).__name__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # mkstemp makes it 0600
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if sync:
        _fsync_dir(path.parent)


def remove_leftover_temporaries(folder: Union[str, Path], names: str) -> None:
    """Delete what `atomic_write` left in `folder` for the files whose names match the regular
    expression `names`: its temporary files, `.NAME.XXXXXXXX.tmp`, outlive a writer killed between
    mkstemp and os.replace (a kill cannot be caught). For files that one writer writes, called
    where it writes them again: another writer's temporary file might still be in use."""
    pattern = re.compile(rf"\.(?:{names})\.[^.]+\.tmp")
    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if pattern.fullmatch(entry.name):
            entry.unlink(missing_ok=True)


def require_regular_file(path: Union[str, Path], what: str) -> None:
    """Raise a one-line ValueError unless `path` is a regular file (after symlinks), before anything
    opens it: opening a FIFO blocks until a writer comes (forever, and no timeout applies), and a
    device or a directory is no file of ours. `what` names the file ("checkpoint /x/y.pt")."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{what} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{what} cannot be read: {exc.strerror or one_line(exc)}") from None
    if stat.S_ISREG(mode):
        return
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    raise ValueError(f"{what} is {kind}, not a regular file: replace it with the file itself")


def atomic_write_figure(path: Union[str, Path], figure, dpi: int = 110) -> None:
    """Save a matplotlib figure as PNG with `atomic_write`, and close it (also when saving fails)."""
    import io

    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    atomic_write(path, buffer.getvalue())


def check_writable_dir(
    path: Union[str, Path], fix: str = "choose another output directory"
) -> Path:
    """`path` as a directory a file can be written in, created (with its parents) if missing; else a
    one-line ValueError naming it, the reason and `fix`. For the start of a command whose results
    go there, so that an unusable output directory is found before the work, not after it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"cannot write to {path}: it exists and is not a directory; {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        where = "" if exc.filename in (None, str(path)) else f" ({exc.filename})"
        raise ValueError(
            f"cannot write to {path}: {exc.strerror or one_line(exc)}{where}; {fix}"
        ) from None
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks as compact ranges: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    ranks = sorted(set(int(r) for r in ranks))
    if not ranks:
        return ""
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def git_commit(folder: Union[str, Path, None] = None) -> str:
    """The short commit hash of the checkout at `folder` (default: this package's), or "unknown"."""
    folder = Path(folder) if folder is not None else Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def gil_free(fn: Callable) -> Callable:
    """`fn` compiled by TorchScript at its first call, so that its tensor operations run one after
    another in C++ without the GIL (PyTorch takes the GIL back between operations called from
    Python, and with two peers of the in-process cluster running at once, `LocalCluster(lanes=2)`,
    each hand-over of it is a context switch). The operations and their arguments are the Python
    body's, so the bits are the same. Where TorchScript is not there or cannot compile `fn`
    (`PYTORCH_JIT=0` makes `torch.jit.script` return it as is), the Python body runs: same bits,
    slower. `torch.jit.script` is deprecated in recent PyTorch releases; its warning is not passed
    on, since nothing here would change for it. The Python body stays available as `.python`,
    and `.implementation()` says what runs (the tests compare the two)."""
    import torch

    lock = threading.Lock()
    compiled: List[Callable] = []

    def implementation() -> Callable:
        if not compiled:
            with lock:  # peer threads may make the first call at once: compile once
                if not compiled:
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # torch.jit.script's deprecation
                            compiled.append(torch.jit.script(fn))
                    except Exception:  # noqa: BLE001 - whatever stops TorchScript: run the Python body
                        compiled.append(fn)
        return compiled[0]

    @functools.wraps(fn)
    def call(*args):
        return (compiled[0] if compiled else implementation())(*args)

    call.python = fn
    call.implementation = implementation
    return call


def lazy_exports(package: str, homes: Dict[str, str]) -> Tuple[Callable, Callable]:
    """A package's module-level ``__getattr__`` and ``__dir__`` (PEP 562) that import the module
    `homes[name]` (relative to `package`) when `name` is first read, so that importing the package
    imports nothing heavy (torch) until one of its names is used."""
    import importlib

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__


__all__ = [
    "lazy_exports",
    "one_line",
    "escaped",
    "atomic_write",
    "remove_leftover_temporaries",
    "check_writable_dir",
    "require_regular_file",
    "format_ranks",
    "gil_free",
    "git_commit",
]
