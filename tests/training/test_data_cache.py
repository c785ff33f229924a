"""Generated datasets kept on disk (`training/data_cache.py`): the arrays are generate()'s, bit for
bit; a machine generates each once, also when its processes start together (a file lock); a
damaged or altered file is generated again, never used; `off` keeps nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gossip_powersgd.training.data_cache import CACHE_VARIABLE, arrays_digest, cache_key, cached

ROOT = Path(__file__).resolve().parents[2]


def arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((20, 3)).astype(np.float32), "y": rng.integers(0, 4, 20)}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_dataset_is_generated_once_and_read_back_bit_for_bit(folder):
    calls = []

    def generate():
        calls.append(1)
        return arrays()

    first = cached("toy", {"n": 20}, generate)
    second = cached("toy", {"n": 20}, generate)
    assert len(calls) == 1
    for key, value in arrays().items():
        assert first[key].dtype == value.dtype and np.array_equal(first[key], value)
        assert np.array_equal(second[key], value) and second[key].dtype == value.dtype
    assert [p.suffix for p in folder.glob("toy-*.npz")] == [".npz"]
    cached("toy", {"n": 21}, generate)  # another recipe: another file
    assert len(calls) == 2 and len(list(folder.glob("toy-*.npz"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap"])
def test_a_damaged_or_altered_file_is_generated_again(folder, damage):
    calls = []

    def generate():
        calls.append(1)
        return arrays()

    cached("toy", {}, generate)
    (path,) = folder.glob("toy-*.npz")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:  # whole, but other arrays under the stored digest
        other = arrays(1)
        np.savez(path, digest=np.array(arrays_digest(arrays())), **other)
    again = cached("toy", {}, generate)
    assert len(calls) == 2
    assert all(np.array_equal(again[k], v) for k, v in arrays().items())
    assert len(cached("toy", {}, generate)) == 2 and len(calls) == 2  # repaired: read back


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    cached("toy", {}, lambda: calls.append(1) or arrays())
    cached("toy", {}, lambda: calls.append(1) or arrays())
    assert len(calls) == 2 and not list(tmp_path.rglob("*.npz"))


def test_the_key_names_the_recipe_and_the_versions():
    assert cache_key("toy", {"seed": 1}, ()) != cache_key("toy", {"seed": 2}, ())
    assert cache_key("toy", {"seed": 1}, ()) == cache_key("toy", {"seed": 1}, ())
    assert cache_key("toy", {}, ("numpy",)) != cache_key("toy", {}, ("no-such-package",))


#: A process that asks for the same dataset as the others, generating slowly (so that processes
#: started together overlap), and leaves a file for each time it generated.
WORKER = textwrap.dedent(
    """
    import sys, time, uuid
    from pathlib import Path
    import numpy as np
    from gossip_powersgd.training.data_cache import cached

    def generate():
        (Path(sys.argv[1]) / uuid.uuid4().hex).touch()
        time.sleep(0.5)
        return {"x": np.arange(10.0)}

    print(cached("shared", {}, generate)["x"].sum())
    """
)


def test_processes_started_together_generate_once(folder, tmp_path):
    marks = tmp_path / "generated"
    marks.mkdir()
    env = dict(os.environ, **{CACHE_VARIABLE: str(folder)})
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(marks)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(4)
    ]
    outputs = [w.communicate(timeout=300)[0].strip() for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert outputs == ["45.0"] * 4
    assert len(list(marks.iterdir())) == 1


def test_mnist1d_from_the_cache_is_the_generated_one_and_needs_no_mnist1d_import(folder):
    code = textwrap.dedent(
        """
        import sys
        from gossip_powersgd.training.data import dataset_digest, load_dataset
        print(dataset_digest(load_dataset("mnist1d:num_samples=600", 0), ("train", "test")))
        print("mnist1d" in sys.modules)
        """
    )

    def run(cache: str):
        env = dict(os.environ, **{CACHE_VARIABLE: cache})
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    generated = run("off")
    assert generated[1] == "True"
    assert run(str(folder)) == generated  # the first process with the cache generates
    assert run(str(folder)) == [generated[0], "False"]  # a later one reads: no mnist1d, matplotlib
