"""Where a run came from: the code, the libraries, the command and the machines.

`provenance(comm, config)` is collective (the host names are gathered from every peer) and returns
the same dict on every peer. The trainer puts it under "provenance" in summary.json and as comment
lines at the top of config.yaml (comments, so that `--resume` and `--config` read the file as
before); the trackers (`trackers.py`) tag their runs with it (`provenance_tags`, and
`provenance_table` for TensorBoard's text). Nothing in it depends on a peer's data: it is safe to
gather under differential privacy.

"command" is the command line that started the run as it was typed to the launcher: under mpiexec,
torchrun or srun, the launcher's own (``mpiexec -n 8 python -m gossip_powersgd.cli.train ...``),
found among this process's ancestors (Linux's /proc); else this process's own. Where the launcher
runs where this process cannot see it (another host, or no /proc), "command" is this process's and
"command_note" says so. "launcher" names the launcher (None without one).
"""

from __future__ import annotations

import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from ..utils import escaped
from ..version import __version__

if TYPE_CHECKING:
    from ..comm.base import Comm

#: Libraries whose versions are recorded; one that is not installed is recorded as None.
LIBRARIES = ("torch", "numpy", "networkx", "mpi4py", "opacus", "dp-accounting")
#: Host names longer than this are cut (the all-gather needs one length on every peer).
HOST_BYTES = 64


#: Launcher programs by the name of their executable or script (or the module after ``-m``).
LAUNCHERS = {
    "mpiexec": "mpiexec",
    "mpirun": "mpiexec",
    "mpiexec.hydra": "mpiexec",
    "orterun": "mpiexec",
    "prterun": "mpiexec",
    "srun": "srun",
    "torchrun": "torchrun",
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
}
#: How many ancestors are looked at for the launcher (mpiexec -> proxy -> [supervisor] -> rank).
ANCESTORS = 8


def _cmdline(pid: str) -> Optional[List[str]]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0")]
    return parts[:-1] if parts and parts[-1] == "" else parts or None


def _parent(pid: str) -> Optional[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (name) "
    return fields[1] if len(fields) > 1 and fields[1] not in ("0", "1") else None


def _launcher_line(argv: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(launcher, its command line as typed) when `argv` is a launcher's process, else None. A
    script launcher run through its interpreter (``python .../torchrun ...``, the shebang) is given
    from the script on, as it was typed."""
    name = Path(argv[0]).name
    if name in LAUNCHERS:
        return LAUNCHERS[name], argv
    if name.startswith("python") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2 and argv[2] in LAUNCHERS:
            return LAUNCHERS[argv[2]], argv
        if Path(argv[1]).name in LAUNCHERS:
            return LAUNCHERS[Path(argv[1]).name], argv[1:]
    return None


def launch_command() -> Dict[str, Any]:
    """{"command", "launcher", and "command_note" where the launcher's line is not visible} (see
    the module docstring)."""
    from ..launch import launched_by_mpiexec, launched_by_torchrun

    own = _cmdline("self") or [sys.executable, *sys.argv]
    pid = _parent("self")
    for _ in range(ANCESTORS):
        argv = _cmdline(pid) if pid else None
        if not argv:
            break
        found = _launcher_line(argv)
        if found is not None:
            return {"command": found[1], "launcher": found[0]}
        pid = _parent(pid)
    launcher = (
        "mpiexec" if launched_by_mpiexec() else "torchrun" if launched_by_torchrun() else None
    )
    if launcher is None:
        return {"command": own, "launcher": None}
    return {
        "command": own,
        "launcher": launcher,
        "command_note": f"started by {launcher}, whose command line this process cannot see "
        "(another host, or no /proc): this is the command it ran",
    }


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
        **launch_command(),
        "backend": config.backend,
        "world_size": comm.size,
        "hosts": sorted(set(hosts)),
        "peers_per_host": {h: hosts.count(h) for h in sorted(set(hosts))},
    }


def as_comments(record: Dict[str, Any]) -> str:
    """`record` as YAML comment lines (for the head of config.yaml), one line per field: a
    character a comment cannot hold (the line break of a `python -c` program in the command, a
    control character) is written as its Python escape, so config.yaml stays YAML."""
    libraries = ", ".join(f"{k} {v}" for k, v in record["libraries"].items() if v is not None)
    commit = record["git_commit"] or "not a git checkout"
    if record["git_dirty"]:
        commit += " (with uncommitted changes)"
    texts = (
        f"gossip_powersgd {record['gossip_powersgd']}, commit {commit}",
        f"python {record['python']}; {libraries}",
        f"command: {shlex.join(record['command'])}",
        f"backend {record['backend']}, {record['world_size']} peers on "
        + ", ".join(f"{h} ({n})" for h, n in record["peers_per_host"].items()),
    )
    return "".join(f"# {escaped(text)}\n" for text in texts)


def command_text(origin: Dict[str, Any]) -> str:
    """The provenance's command line as one shell line."""
    return shlex.join(origin.get("command") or [])


#: The characters that are markup inside a table cell of TensorBoard's markdown (Python-Markdown
#: with tables: escapes, code, emphasis, links, cell ends) unless escaped by a backslash, as in
#: CommonMark. A cell holds no block markup (headings, lists), so `#`, `-`, `.` stay as they are.
MARKDOWN_INLINE = frozenset("\\`*_[]|")


def provenance_table(tags: Dict[str, str]) -> str:
    """The tags as a markdown table (TensorBoard's text): a value stays in its cell and reads as
    written: its line breaks escaped (`utils.escaped`), markdown's inline markup characters, `|`
    and `\\` among them (a `python -c` program in the command), escaped by a backslash, `&` as
    ``&amp;``."""

    def cell(text: str) -> str:
        marked = ("\\" + c if c in MARKDOWN_INLINE else c for c in escaped(text))
        return "".join(marked).replace("&", "&amp;")  # an HTML entity is written as typed

    cells = {k: cell(v) for k, v in tags.items()}
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in cells.items())


def provenance_tags(origin: Dict[str, Any]) -> Dict[str, str]:
    """The provenance as flat string tags (MLflow's; the others take what they show of it)."""
    if not origin:
        return {}
    dirty = origin.get("git_dirty")
    tags = {
        "git_commit": origin.get("git_commit") or "not a git checkout",
        "git_dirty": "unknown" if dirty is None else str(bool(dirty)).lower(),
        "gossip_powersgd": str(origin.get("gossip_powersgd")),
        "python": str(origin.get("python")),
        **{name: str(v) for name, v in (origin.get("libraries") or {}).items() if v},
        "backend": str(origin.get("backend")),
        "world_size": str(origin.get("world_size")),
        "hosts": ", ".join(f"{h} ({n})" for h, n in (origin.get("peers_per_host") or {}).items()),
        "launcher": origin.get("launcher") or "none",
        "command": command_text(origin),
    }
    if origin.get("command_note"):
        tags["command_note"] = origin["command_note"]
    return tags


__all__ = [
    "provenance",
    "as_comments",
    "library_versions",
    "source_checkout",
    "launch_command",
    "gather_hosts",
    "LIBRARIES",
    "command_text",
    "provenance_table",
    "provenance_tags",
]
