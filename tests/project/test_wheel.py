"""The built wheel, installed (not editable) outside the checkout: it holds the LICENSE and the
example configs, and its `gossip-train --config tiny` trains from them with no checkout around."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "gossip_powersgd" / "examples").glob("*.yaml"))


def _source_copy(dest: Path) -> Path:
    """The working tree's files (tracked and untracked, not ignored) copied to `dest`, so that the
    build's own build/ and *.egg-info never land in the checkout."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if not (source.exists() or source.is_symlink()):
            continue  # deleted in the working tree
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), dest / name)
        else:
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
def test_wheel_installs_and_trains_from_its_bundled_example(tmp_path):
    source = _source_copy(tmp_path / "src")
    offline = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONPATH": "",
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        env=offline,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("gossip_powersgd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert (
        sorted(Path(n).name for n in names if n.startswith("gossip_powersgd/examples/")) == EXAMPLES
    )
    assert not any(n.startswith("experiments/") for n in names)

    site = tmp_path / "site"  # a plain install (no editable link) with the venv's torch & co.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        env=offline,
        timeout=300,
        capture_output=True,
    )
    work = tmp_path / "elsewhere"  # no checkout here or above
    work.mkdir()
    env = {**offline, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import gossip_powersgd; print(gossip_powersgd.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(site), where  # the wheel's copy, not the checkout's
    script = [str(site / "bin" / "gossip-train")]
    help_text = subprocess.run(
        script + ["--help"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    ).stdout
    assert "usage: gossip-train" in help_text and "tiny" in help_text
    done = subprocess.run(
        script + ["--config", "tiny", "--set", "epochs=1", "--quiet"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((work / "runs" / "tiny" / "summary.json").read_text())
    assert summary["epochs_done"] == 1 and summary["provenance"]["gossip_powersgd"] == "0.1.0"
    assert summary["provenance"]["git_commit"] is None  # an installed package: no checkout
    # The checkout's own tiny.yaml through the checkout's code: the very same model, bit for bit.
    mine = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            str(ROOT / "experiments" / "configs" / "tiny.yaml"),
            "--set",
            "epochs=1",
            "--set",
            f"out_dir={tmp_path / 'checkout-run'}",
            "--quiet",
        ],
        cwd=work,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert mine.returncode == 0, mine.stderr[-2000:]
    theirs = json.loads((tmp_path / "checkout-run" / "summary.json").read_text())
    assert theirs["model_sha256"] == summary["model_sha256"]
    missing = subprocess.run(
        script + ["--config", "tinyy"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0
    assert "config file tinyy not found" in missing.stderr and "tiny" in missing.stderr
