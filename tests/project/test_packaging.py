"""What `pip install` puts into site-packages: the library and its programs, never `experiments`."""

import configparser
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
from typing import List

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

from tests.conftest import ROOT


def read_setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def installed_packages():
    """The packages setuptools would install, found the way setup.cfg tells it to find them."""
    include = read_setup_cfg()["options.packages.find"]["include"].split()
    return find_packages(where=str(ROOT), include=include)


def console_scripts():
    lines = read_setup_cfg()["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines)


def test_only_the_library_and_the_topologies_are_installed():
    packages = installed_packages()
    assert {p.split(".")[0] for p in packages} == {"gossip_powersgd", "topologies"}
    # every subpackage of the library ships, the programs included
    assert "gossip_powersgd.cli" in packages
    for name in ("comm", "algorithms", "training"):
        assert f"gossip_powersgd.{name}" in packages


def test_console_scripts_point_into_the_library_and_run_without_arguments():
    scripts = console_scripts()
    assert scripts == {
        "gossip-train": "gossip_powersgd.cli.train:main",
        "gossip-plot": "gossip_powersgd.cli.plot:main",
        "gossip-cluster-ssh": "gossip_powersgd.cluster.enter:ssh_main",
    }
    for target in scripts.values():
        module_name, function_name = target.split(":")
        assert module_name.split(".")[0] in {p.split(".")[0] for p in installed_packages()}
        function = getattr(importlib.import_module(module_name), function_name)
        # a console script calls main() with no arguments: every parameter needs a default
        parameters = inspect.signature(function).parameters.values()
        assert all(p.default is not inspect.Parameter.empty for p in parameters), target


def test_the_library_programs_run_as_modules():
    for module in (
        "gossip_powersgd.cli.train",
        "gossip_powersgd.cli.plot",
        "gossip_powersgd.cluster",
    ):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: python -m {module} ")


def test_the_checkout_wrappers_name_the_command_the_user_typed(tmp_path):
    """`python -m experiments.train` runs the library's program, but its hints name the wrapper."""
    from experiments.train import run

    tiny = ROOT / "experiments" / "configs" / "tiny.yaml"
    with pytest.raises(ValueError, match=r"mpiexec -n 4 \S+ -m experiments\.train \.\.\., or use"):
        run(["--config", str(tiny), "--set", "backend=mpi", "--set", f"out_dir={tmp_path / 'x'}"])
    for module in ("experiments.train", "experiments.plot"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: python -m {module} ")


def test_the_console_scripts_name_themselves_in_their_help():
    from pathlib import Path

    for script in ("gossip-train", "gossip-plot"):
        path = Path(sys.executable).parent / script  # installed by make's editable install
        result = subprocess.run(
            [str(path), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {script} "), result.stdout.splitlines()[0]


def pins() -> dict:
    """constraints.txt as {normalized name: version}."""
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            out[canonicalize_name(name)] = version
    return out


def makefile_extras() -> List[str]:
    """The extras `make install` installs, read from its pip line."""
    match = re.search(r"-e '\.\[([a-z,]+)\]'", (ROOT / "Makefile").read_text())
    assert match, "the Makefile's install line (-e '.[extras]') was not found"
    return match.group(1).split(",")


def direct_requirements(extras: List[str]) -> List[Requirement]:
    """setup.cfg's install_requires and the requirements of `extras`."""
    options = read_setup_cfg()
    lines = options["options"]["install_requires"].split()
    for extra in extras:
        lines += [r for r in options["options.extras_require"][extra].splitlines() if r.strip()]
    return [Requirement(line) for line in lines]


def test_constraints_pin_every_package_that_make_install_brings_in():
    """CI installs from a clean clone: a package without a pin there is whatever the index has that
    day (a new mpich decides what a job does when a rank dies; a new ruff what `make lint` accepts).
    Every requirement of the package and its extras is pinned, and so is every requirement of a
    pinned package installed here at its pinned version (on another machine, or another version,
    only what can be read is followed)."""
    pinned, extras = pins(), makefile_extras()
    missing, seen = [], set()
    todo = [(r, "setup.cfg") for r in direct_requirements(extras)]
    while todo:
        requirement, wanted_by = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        if name not in pinned:
            missing.append(f"{name} (wanted by {wanted_by})")
            continue
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if installed.version.split("+")[0] != pinned[name].split("+")[0]:
            continue
        for line in installed.requires or ():
            sub = Requirement(line)
            # only what pip installs for the extras asked for (markers on python and platform too)
            wanted = [{"extra": e} for e in sorted(requirement.extras)] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(w) for w in wanted):
                todo.append((sub, name))
    assert not missing, f"constraints.txt has no pin for: {', '.join(sorted(missing))}"
    assert {"torch", "mpich", "ruff", "opacus"} <= seen
