"""User-facing text names no commit that is not in this repository's history, and none of the
project's internal names.

User-facing text: README.md, docs/ (its pages and tutorial scripts), the committed result pages
(experiments/results/**/*.md), and what a user reads of the package: the docstrings of every public
name of `gossip_powersgd`, `gossip_powersgd.training` and `gossip_powersgd.comm` (and of their
public methods), the programs' module docstrings and `gossip-train --help-config`.

A commit is any token of 7 to 40 hex digits with a digit and a letter (a sha256 digest, 64 digits,
is none); it must be a prefix of a commit that `git log --all` lists: a commit that was rebased
away, or never pushed, is a citation nobody can check. Outside a git checkout, or in a shallow
clone (whose history is cut), the history is not there to check against and the test skips.

Both lists below are ratchets: what the text holds today that has to go (pages to re-make from the
current code, wording for the README's rewrite). A new occurrence fails, and so does an entry no
longer found, so that each list only shrinks.
"""

from __future__ import annotations

import inspect
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Commits cited by a page and missing from the history: the page must be made again.
MISSING_COMMITS: set = set()

#: The project's internal names, as patterns. `lanes` is also the name of a public parameter,
#: `LocalCluster(lanes=...)`, so the docstring that declares it, and the one guide that explains
#: it, may use the word.
TERMS = {
    "Architecture II": re.compile(r"\bArchitecture II\b"),
    "half-step": re.compile(r"\bhalf-steps?\b", re.IGNORECASE),
    "null band": re.compile(r"\bnull band\b", re.IGNORECASE),
    "lanes": re.compile(r"\blanes?\b", re.IGNORECASE),
    "issue number": re.compile(r"\bissues? #?\d+\b", re.IGNORECASE),
}
EXEMPT = {
    "lanes": {
        "gossip_powersgd.LocalCluster",
        "gossip_powersgd.comm.LocalCluster",
        "docs/guides/performance.md",
    }
}

#: Where the internal names are today, and how often: (place, term) -> count.
KNOWN_TERMS = {
    ("experiments/results/bench_gossip.md", "half-step"): 24,
    ("experiments/results/bench_sim.md", "lanes"): 19,
    ("experiments/results/privacy_attacks.md", "null band"): 18,  # re-made in the cnn1d regime
    ("experiments/results/privacy_attacks_overfit.md", "null band"): 16,
    ("experiments/results/privacy_dp_subspace.md", "half-step"): 1,
    ("gossip_powersgd.PowerGossip", "half-step"): 2,
    ("gossip_powersgd.PowerGossip.bytes_per_step", "half-step"): 1,
    ("gossip_powersgd.PowerGossip.edge_side", "half-step"): 1,
    ("gossip_powersgd.PowerGossip.edge_state", "half-step"): 1,
    ("gossip_powersgd.PowerGossip.layout", "half-step"): 5,
    ("gossip_powersgd.PowerGossip.next_exchange", "half-step"): 2,
}

HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")


def _documents() -> Iterator[Tuple[str, str]]:
    """(place, text) of the files a user reads."""
    paths = [ROOT / "README.md"]
    for folder in ("docs", "experiments/results"):
        if (ROOT / folder).is_dir():
            paths += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".md", ".rst"))
    # the tutorials' sources (each a page of the site); what `make docs` generates from them
    # (docs/tutorials/, docs/_build/) is a copy, not read twice
    paths += sorted((ROOT / "docs" / "examples").glob("*.py"))
    generated = [ROOT / "docs" / "tutorials", ROOT / "docs" / "_build"]
    paths = [p for p in paths if not any(g in p.parents for g in generated)]
    for path in paths:
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def _docstrings() -> Iterator[Tuple[str, str]]:
    """(place, text) of the docstrings and the help a user reads."""
    import importlib

    import gossip_powersgd
    from gossip_powersgd.training.keydocs import describe_keys

    for package in ("gossip_powersgd", "gossip_powersgd.training", "gossip_powersgd.comm"):
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            place = f"{gossip_powersgd.__name__}.{name}" if module is gossip_powersgd else None
            place = place or f"{package}.{name}"
            yield place, inspect.getdoc(value) or ""
            if inspect.isclass(value):
                for attribute, member in vars(value).items():
                    if not attribute.startswith("_") and getattr(member, "__doc__", None):
                        yield f"{place}.{attribute}", inspect.getdoc(member) or ""
    for program in ("gossip_powersgd", "gossip_powersgd.cli.train", "gossip_powersgd.cli.plot"):
        yield program, importlib.import_module(program).__doc__ or ""
    yield "gossip-train --help-config", describe_keys()


def _texts() -> Dict[str, str]:
    texts = dict(_documents())
    for place, text in _docstrings():
        texts[place] = texts.get(place, "") + "\n" + text
    return texts


def _history() -> set:
    """Every commit `git log --all` lists (full hashes); skips outside a full git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    try:
        inside = git("rev-parse", "--is-inside-work-tree")
    except OSError:
        pytest.skip("git is not installed: no history to check commits against")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: no history to check commits against")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: its history is cut, so older commits cannot be checked")
    return set(git("log", "--all", "--format=%H").stdout.split())


def cited_commits(text: str):
    """The tokens of `text` that read as commit hashes (7-40 hex digits, a digit and a letter)."""
    return {
        m.group()
        for m in HEX.finditer(text)
        if re.search(r"\d", m.group()) and re.search(r"[a-f]", m.group())
    }


def test_the_commit_pattern_finds_short_and_full_hashes_only():
    text = "commit 24dae66, 6df8d52's code, sha256 " + "ab12" * 16 + ", 1234567, deadbeef, x9124abb"
    assert cited_commits(text) == {"24dae66", "6df8d52"}


def test_every_commit_named_in_user_facing_text_is_in_the_history():
    history = _history()
    missing = set()
    for place, text in _texts().items():
        for token in cited_commits(text):
            if not any(commit.startswith(token) for commit in history):
                missing.add((place, token))
    new = sorted(missing - MISSING_COMMITS)
    assert not new, f"commits that are not in this repository's history: {new}"
    made_again = sorted(MISSING_COMMITS - missing)
    assert not made_again, f"found no more, drop them from MISSING_COMMITS: {made_again}"


def test_no_internal_names_in_user_facing_text():
    found: Counter = Counter()
    for place, text in _texts().items():
        for term, pattern in TERMS.items():
            if place not in EXEMPT.get(term, ()):
                found[(place, term)] += len(pattern.findall(text))
    found = Counter({k: v for k, v in found.items() if v})
    grown = sorted(
        (k, v, KNOWN_TERMS.get(k, 0)) for k, v in found.items() if v > KNOWN_TERMS.get(k, 0)
    )
    assert not grown, f"internal names in user-facing text ((place, term), count, allowed): {grown}"
    shrunk = sorted((k, found.get(k, 0), v) for k, v in KNOWN_TERMS.items() if found.get(k, 0) < v)
    assert not shrunk, f"fewer than KNOWN_TERMS says: lower it there: {shrunk}"
