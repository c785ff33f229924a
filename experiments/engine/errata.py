"""Faults found in the code after a page's rows were made, told on the page until its rows are
made again: an erratum names the commit that fixed the fault and the pages whose figures it
touched; `render` puts its text under the title of every markdown file of such a page while any of
its rows was made at a commit without the fix (by git's ancestry; where git cannot tell, as in a
shallow clone or for a row of an unknown commit, by the time the row finished against the fix's).
Made again on fixed code, the rows drop the note by themselves."""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
from pathlib import Path
from typing import Iterable, List, Tuple

from .provenance import ROOT


@dataclasses.dataclass(frozen=True)
class Erratum:
    fixed_in: str  #: the commit of the fix (rows of commits that contain it are not flagged)
    fixed_at: str  #: its time, as rows write theirs ("YYYY-MM-DD HH:MM UTC")
    pages: Tuple[str, ...]  #: the pages whose figures the fault touched
    text: str  #: what the page says, one paragraph of markdown


def _read() -> Tuple[Erratum, ...]:
    """The errata of errata.md beside this file (its format: that file's first lines)."""
    text = (Path(__file__).parent / "errata.md").read_text(encoding="utf-8")
    found = re.findall(r"^<!-- (\w+) (.+ UTC): (.+) -->\n(.+)$", text, re.MULTILINE)
    return tuple(Erratum(fix, at, tuple(pages.split()), body) for fix, at, pages, body in found)


ERRATA = _read()


@functools.lru_cache(maxsize=None)
def contains(commit: str, fix: str) -> bool | None:
    """Whether `commit` (a row's: "abc1234", "abc1234 + uncommitted changes", "unknown") holds
    commit `fix`; None where git cannot tell (no checkout, a commit it does not know)."""
    name = commit.split(" ")[0]
    if not name or name == "unknown":
        return None
    try:
        done = subprocess.run(
            ["git", "merge-base", "--is-ancestor", fix, name],
            cwd=ROOT,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(done.returncode)


def predates(commit: str, finished: str, erratum: Erratum) -> bool:
    """Whether a row made at `commit`, finished at `finished`, was made without `erratum`'s fix."""
    holds = contains(commit, erratum.fixed_in)
    return (finished < erratum.fixed_at) if holds is None else not holds


def notes(page: str, made: Iterable[Tuple[str, str]]) -> List[str]:
    """The errata of `page` that any of its rows predates; `made`: each row's (commit, finished)."""
    made = set(made)
    return [e.text for e in ERRATA if page in e.pages and any(predates(*m, e) for m in made)]


def annotated(content: str, texts: List[str]) -> str:
    """A markdown file's text with each of `texts` as a quoted paragraph under its first line."""
    if not texts:
        return content
    first, _, rest = content.partition("\n")
    quoted = "".join(f"\n> {t}\n" for t in texts)
    tail = rest if rest.startswith("\n") else "\n" + rest
    return f"{first}\n{quoted}{tail}"
