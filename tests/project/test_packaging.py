"""What `pip install` puts into site-packages: the library and its programs, never `experiments`."""

import configparser
import importlib
import inspect
import subprocess
import sys

import pytest
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
