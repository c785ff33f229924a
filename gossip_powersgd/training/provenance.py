"""Where a run came from: the code, the libraries, the command and the machines.

`provenance(comm, config)` is collective (the host names are gathered from every peer) and returns
the same dict on every peer. The trainer puts it under "provenance" in summary.json and as comment
lines at the top of config.yaml (comments, so that `--resume` and `--config` read the file as
before). Nothing in it depends on a peer's data: it is safe to gather under differential privacy.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from ..version import __version__

if TYPE_CHECKING:
    from ..comm.base import Comm

#: Libraries whose versions are recorded; one that is not installed is recorded as None.
LIBRARIES = ("torch", "numpy", "networkx", "mpi4py", "opacus", "dp-accounting")
#: Host names longer than this are cut (the all-gather needs one length on every peer).
HOST_BYTES = 64


def library_versions() -> Dict[str, Optional[str]]:
    """Installed versions of `LIBRARIES`, None for one that is not installed."""
    versions: Dict[str, Optional[str]] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git(folder: Path, *args: str) -> Optional[str]:
    try:
        result = subprocess.run(
            ["git", *args], cwd=folder, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def source_checkout(folder: Optional[Path] = None) -> Dict[str, Any]:
    """The git commit of the checkout this package runs from, and whether its tracked files have
    changes (``{"git_commit": None, "git_dirty": None}`` for an installed package). The package
    must be tracked by that checkout: a wheel installed in a virtual environment that happens to
    sit inside some other git work tree is not "run from a checkout"."""
    folder = folder if folder is not None else Path(__file__).resolve().parent.parent
    none = {"git_commit": None, "git_dirty": None}
    if _git(folder, "ls-files", "--error-unmatch", "__init__.py") is None:
        return none
    commit = _git(folder, "rev-parse", "HEAD")
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    if not commit or status is None:
        return none
    return {"git_commit": commit, "git_dirty": bool(status)}


def gather_hosts(comm: Comm) -> List[str]:
    """Every peer's host name, in rank order (an all-gather of fixed-length byte strings)."""
    name = socket.gethostname().encode("utf-8", "replace")[:HOST_BYTES].ljust(HOST_BYTES, b"\0")
    return [raw.rstrip(b"\0").decode("utf-8", "replace") for raw in comm.allgather_bytes(name)]


def provenance(comm: Comm, config) -> Dict[str, Any]:
    """The run's provenance (collective; the same dict on every peer)."""
    hosts = gather_hosts(comm)
    return {
        "gossip_powersgd": __version__,
        **source_checkout(),
        "python": platform.python_version(),
        "libraries": library_versions(),
        "torch_threads": torch.get_num_threads(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else [],
        "backend": config.backend,
        "world_size": comm.size,
        "hosts": sorted(set(hosts)),
        "peers_per_host": {h: hosts.count(h) for h in sorted(set(hosts))},
    }


def as_comments(record: Dict[str, Any]) -> str:
    """`record` as YAML comment lines (for the head of config.yaml)."""
    libraries = ", ".join(f"{k} {v}" for k, v in record["libraries"].items() if v is not None)
    commit = record["git_commit"] or "not a git checkout"
    if record["git_dirty"]:
        commit += " (with uncommitted changes)"
    return "".join(
        f"# {line}\n"
        for line in (
            f"gossip_powersgd {record['gossip_powersgd']}, commit {commit}",
            f"python {record['python']}; {libraries}",
            f"command: {' '.join(record['command'])}",
            f"backend {record['backend']}, {record['world_size']} peers on "
            + ", ".join(f"{h} ({n})" for h, n in record["peers_per_host"].items()),
        )
    )


__all__ = [
    "provenance",
    "as_comments",
    "library_versions",
    "source_checkout",
    "gather_hosts",
    "LIBRARIES",
]
