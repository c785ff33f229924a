"""Generated datasets kept on disk, so that the processes of a machine generate one only once.

MNIST-1D is generated, not downloaded: every process of a run used to import the mnist1d package
(with matplotlib and scipy) and generate the same 5,000 signals, about 2.5 s of CPU each, so that
under ``mpiexec -n 8`` on a small machine most of the set-up went to eight copies of one
computation. `cached(name, recipe, generate)` keeps `generate()`'s arrays in
``CACHE_DIR/<name>-<key>.npz``, the key a digest of the recipe and of the versions of the libraries
that generate them (a new version generates again): the first process of the machine generates
and writes the file (atomically, under a file lock that the others wait on), every later one reads
it. Each file holds the digest of its arrays, checked on every read: a damaged or altered file is
generated again, never used. The arrays are exactly what `generate` returned (the peers' own check
that they all loaded the same data still runs).

The folder is ``$GOSSIP_POWERSGD_CACHE``, else ``$XDG_CACHE_HOME/gossip_powersgd``, else
``~/.cache/gossip_powersgd``; ``GOSSIP_POWERSGD_CACHE=off`` generates in every process as before.
A folder that cannot be written is the same as ``off``. Other arrays that cost a computation keep
there the same way (LiRA's gossip-trained references, `privacy.gossip_references`), their recipe
holding `code_digest()` where the library's own code computes them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence

import numpy as np

#: The environment variable naming the folder (or "off").
CACHE_VARIABLE = "GOSSIP_POWERSGD_CACHE"
#: The layout of the files: part of every key, so that a new layout never reads an old file.
FORMAT = 1


def cache_dir() -> Optional[Path]:
    """The cache folder, or None when caching is off."""
    value = os.environ.get(CACHE_VARIABLE)
    if value is not None:
        return None if value.strip().lower() in ("off", "0", "no", "") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gossip_powersgd"


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cache_key(name: str, recipe: Mapping[str, Any], packages: Sequence[str]) -> str:
    """The digest naming a dataset: its recipe and the versions of `packages`."""
    identity = {
        "format": FORMAT,
        "name": name,
        "recipe": dict(recipe),
        "versions": {p: _version(p) for p in ("numpy", *packages)},
    }
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over the arrays' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a lock file) where the system has one (fcntl)."""
    try:
        import fcntl
    except ImportError:  # no flock: each process may generate; the writes are atomic anyway
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path) -> Optional[Dict[str, np.ndarray]]:
    """The arrays of `path` if it is a whole, unaltered cache file, else None."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != "digest"}
            digest = str(data["digest"]) if "digest" in data.files else None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None  # not a whole cache file: generated again
    return arrays if digest == arrays_digest(arrays) else None


def _write(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            np.savez(f, digest=np.array(arrays_digest(arrays)), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 over this library's source (every .py file of gossip_powersgd and topologies, by
    path and bytes): part of the recipe of what the library's code computes, so that a cached
    result of older code is never read as this code's."""
    h = hashlib.sha256()
    for package in ("gossip_powersgd", "topologies"):
        root = Path(importlib.import_module(package).__file__).resolve().parent
        for path in sorted(root.rglob("*.py")):
            h.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:24]


def cache_file(
    name: str, recipe: Mapping[str, Any], packages: Sequence[str] = (), folder=None
) -> Optional[Path]:
    """Where `cached` keeps `name` made by `recipe`: in `folder`, else `cache_dir()`; None when
    caching is off."""
    folder = cache_dir() if folder is None else Path(folder)
    if folder is None:
        return None
    return folder / f"{name}-{cache_key(name, recipe, packages)}.npz"


def cached(
    name: str,
    recipe: Mapping[str, Any],
    generate: Callable[[], Mapping[str, np.ndarray]],
    packages: Sequence[str] = (),
    folder=None,
) -> Dict[str, np.ndarray]:
    """`generate()`'s arrays, from the cache when this machine made them before (see the module
    docstring); `packages` are the libraries whose versions the arrays depend on; `folder`, if
    given, the cache's folder instead of `cache_dir()`."""
    path = cache_file(name, recipe, packages, folder)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            path = None
    if path is None or not os.access(path.parent, os.W_OK):
        return {k: np.asarray(v) for k, v in generate().items()}
    with _locked(path.with_name(path.name + ".lock")):
        arrays = _read(path) if path.exists() else None
        if arrays is None:
            arrays = {k: np.asarray(v) for k, v in generate().items()}
            with contextlib.suppress(OSError):  # a full disk: the run goes on without a cache
                _write(path, arrays)
    return arrays


__all__ = [
    "cached",
    "cache_dir",
    "cache_file",
    "cache_key",
    "code_digest",
    "arrays_digest",
    "CACHE_VARIABLE",
]
