"""The README's library example runs as printed, and its claims about it hold; the source layout
(the extending guide's "Layout" section, moved there from the README) names what exists."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import run_bounded

ROOT = Path(__file__).resolve().parents[2]
#: The documentation page that holds the source layout and where things are.
LAYOUT_PAGE = ROOT / "docs" / "guides" / "extending.md"


def test_readme_library_example_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## The library in 20 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 20
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    values = eval(result.stdout.strip())  # a list of (consensus distance, bytes) per peer
    assert len(values) == 8 and len({v for v in values}) == 1
    distance, sent = values[0]
    assert 0 < distance < 1e3 and sent > 0


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text


def test_readme_is_short_and_points_into_the_documentation():
    """At most 200 lines: the long material lives in docs/, and every page the README links to
    exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(((?:docs|experiments)/[^)#]*)\)", text)
    assert len(links) >= 8
    missing = sorted(link for link in links if not (ROOT / link).exists())
    assert not missing, f"the README links to files that do not exist: {missing}"


def layout_section(text: str) -> str:
    return re.search(r"## Layout\n(.*?)(?:\n## |\Z)", text, re.S).group(1)


def test_readme_layout_names_only_paths_that_exist():
    layout = layout_section(LAYOUT_PAGE.read_text())
    block = re.search(r"```\n(.*?)```", layout, re.S).group(1)
    paths = set(re.findall(r"^([\w./]+/?)\s", block, re.M))
    paths |= set(re.findall(r"`((?:gossip_powersgd|experiments|topologies)/[\w./]*)`", layout))
    experiments_rows = re.search(r"^experiments/(.*?)^tests/", layout, re.S | re.M).group(1)
    paths |= {f"experiments/{name}" for name in re.findall(r"\b(\w+\.py|\w+/)", experiments_rows)}
    # a module a folder's row names by its file name alone is in that folder
    rows = re.findall(r"^(\S+/)\s+(.*?)(?=^\S|\Z)", block, re.S | re.M)
    paths |= {
        folder + name
        for folder, text in rows
        for name in re.findall(r"(?<![\w./])(\w+\.py)\b", text)
    }
    assert len(paths) >= 50
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"the Layout section names paths that do not exist: {missing}"


def test_readme_layout_points_at_the_functions_it_names():
    """One hop each: the D-PSGD loop, the checkpoint writer, the algorithm registry, the programs
    (the page's Layout, and its Algorithms section for the registry, which Layout points to)."""
    page = LAYOUT_PAGE.read_text()
    layout = layout_section(page) + re.search(r"## Algorithms\n(.*?)\n## ", page, re.S).group(1)
    claims = [
        ("train()", "gossip_powersgd/training/trainer.py", r"^def train\("),
        ("save_checkpoint", "gossip_powersgd/training/checkpoint.py", r"^def save_checkpoint\("),
        ("register(MyAlgorithm)", "gossip_powersgd/algorithms/registry.py", r"^ALGORITHMS = \["),
        ("gossip-train", "gossip_powersgd/cli/", None),
    ]
    for name, path, definition in claims:
        assert name in layout and path in layout, (name, path)
        if definition is not None:
            assert re.search(definition, (ROOT / path).read_text(), re.M), (name, path)
    from gossip_powersgd.algorithms import GossipAlgorithm
    from gossip_powersgd.algorithms.registry import declaration_problems

    # every declaration the paragraph names is one GossipAlgorithm has, and the registry checks
    declared = ["name", "summary", "options", "gamma_source", "directed", "label", "layout"]
    assert all(f"`{attr}`" in layout and hasattr(GossipAlgorithm, attr) for attr in declared)
    assert "`check_config`" in layout and hasattr(GossipAlgorithm, "check_config")
    missing = " ".join(declaration_problems(type("Bare", (GossipAlgorithm,), {})))
    assert all(f"`{attr}`" in missing for attr in declared)
    setup = (ROOT / "setup.cfg").read_text()
    assert "gossip-train = gossip_powersgd.cli.train:main" in setup
    assert "gossip-plot = gossip_powersgd.cli.plot:main" in setup


@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.slow  # about a minute on 2 shared cores: four launches of 4 processes each
def test_readme_comparison_recipe_runs_as_printed(tmp_path):
    """The README's "Compare algorithms" block, run as printed (its .venv/bin/ is this venv's, in
    a fresh directory): every run writes its summary, the plots are drawn, and PowerGossip under
    mpiexec and under torchrun ends with the same model, bit for bit."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Compare algorithms") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    script = block.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_bounded(
        ["bash", "-e", "-c", script], 900, "the README's recipe", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = tmp_path / "runs"
    summaries = {
        name: json.loads((runs / name / "summary.json").read_text())
        for name in ("cmp-exact", "cmp-powergossip", "cmp-choco", "cmp-torch")
    }
    assert summaries["cmp-powergossip"]["model_sha256"] == summaries["cmp-torch"]["model_sha256"]
    assert (
        summaries["cmp-powergossip"]["mb_sent_per_peer"]
        < summaries["cmp-exact"]["mb_sent_per_peer"]
    )
    assert sorted(p.name for p in (runs / "cmp-plots").glob("*.png"))
