"""What every results page says about the code that made it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gossip_powersgd.utils import git_commit

ROOT = Path(__file__).resolve().parents[1]


def page_commit() -> str:
    """The checkout's short commit, "+ uncommitted changes" when tracked files other than the
    result pages differ from it (a page run rewrites its own page), "unknown" outside git."""
    try:
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)experiments/results",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return git_commit(ROOT) + (" + uncommitted changes" if dirty else "")
