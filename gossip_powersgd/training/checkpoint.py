"""Per-rank checkpoints (atomic, self-checking, loadable with `torch.load(weights_only=True)`) and
the run directory they live in.

Each rank K writes `RUN_DIR/checkpoints/rank-K-epoch-E.pt` and keeps its two newest, so that a job
killed while some ranks had written epoch E and others had not can still resume from epoch E-1, the
newest epoch every rank holds (`resume.agree_resume_epoch`). A resumed run removes each rank's
files of epochs after the one it resumed from (`drop_newer`): they are of the attempt that ended,
held by some ranks only, and kept they would count among a rank's two newest, so that a second
interruption could leave no epoch every rank holds, or pair one rank's stale file with another's
new one of the same epoch. A file is written with `utils.atomic_write`
(a temporary name in the same directory, fsynced, then renamed over the final name), so a reader
sees either the old file or the complete new one.

File layout (only tensors and primitive containers, so `weights_only=True` loads it)::

    {"header":  {"format", "rank", "world_size", "topology", "topology_fingerprint",
                 "config_hash", "config", "epoch", "step", "data"},
     "sha256":  hex digest of the payload bytes,
     "payload": uint8 tensor: torch.save of the state (model, optimizer, algorithm, RNG states,
                data iterator position, comm stats, timers, metric history, hooks' state;
                the trainer's `RunState` decides its keys)}

A checkpoint is its peer's own: it holds the peer's model and metric history (its training loss,
under private statistics) and, under differential privacy, its accountant's history (its sampling
rate, so its shard size) and, with `dp_secret: run_dir`, the key its noise is drawn from
(`privacy.seeds`; DECOR's pair keys stay in the peer's secrets folder): whoever reads it can
remove that peer's noise. Share a run directory, or a checkpoint, only as far as you would share
the peer's data. Beside its checkpoints, a private peer with a secret key rewrites
`rank-K-dp-releases.json` at every step: the accountant history of every private step it has
sent, which a resumed run adds to its epsilon where the checkpoint does not hold them
(`privacy.releases`).

The digest catches corruption that a zip reader would not; the header is checked against the
resuming run (`resume.check_header`: world size, topology, config, and the sha256 of each data file
this peer read, so that data changed under the same spec is refused naming the file) before the
state is used. Every problem is a one-line `ValueError` naming the file.

The run directory: one run at a time holds it (`take_run_lock`: RUN_DIR/.lock names the holder's
host and pid; a lock of a process that has ended is replaced). A new run never writes into a
non-empty directory (`check_run_dir`); a resumed
one cuts its JSONL metrics back to the checkpoint's step (`open_metrics`, `truncate_jsonl`) so that
the records written again after it are not duplicated.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np
import torch

from ..utils import atomic_write, one_line, require_regular_file
from .rundir import LOCK_NAME, RunLock, check_run_dir, take_run_lock  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from topologies import Topology

FORMAT = 1
KEEP = 2  # checkpoints kept per rank
_NAME = re.compile(r"rank-(\d+)-epoch-(\d+)\.pt$")


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir, rank: int, epoch: int) -> Path:
    return checkpoint_dir(run_dir) / f"rank-{rank}-epoch-{epoch}.pt"


def available_epochs(run_dir, rank: int) -> List[int]:
    """Epochs for which `rank` has a checkpoint file (not yet verified), ascending."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    epochs = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match and int(match.group(1)) == rank:
            epochs.append(int(match.group(2)))
    return sorted(epochs)


# ---- RNG states as tensors -------------------------------------------------------------------------


def rng_state(include_global: bool = True) -> Dict[str, Any]:
    """The global RNG states (torch CPU and CUDA, numpy, python `random`) as tensors."""
    if not include_global:
        return {}
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy_meta": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_cached": torch.tensor([cached], dtype=torch.float64),
        "python": torch.tensor(list(internal), dtype=torch.int64),
        "python_meta": torch.tensor([version], dtype=torch.int64),
        "python_gauss": torch.tensor(
            [0.0 if gauss_next is None else gauss_next], dtype=torch.float64
        ),
        "python_has_gauss": torch.tensor([gauss_next is not None]),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    pos, has_gauss = (int(v) for v in state["numpy_meta"].tolist())
    np.random.set_state(
        (
            "MT19937",
            state["numpy_keys"].numpy().astype(np.uint32),
            pos,
            has_gauss,
            float(state["numpy_cached"][0]),
        )
    )
    gauss = float(state["python_gauss"][0]) if bool(state["python_has_gauss"][0]) else None
    random.setstate(
        (int(state["python_meta"][0]), tuple(int(v) for v in state["python"].tolist()), gauss)
    )
    if "cuda" in state and torch.cuda.is_available():
        states = list(state["cuda"])
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


# ---- save / load ----------------------------------------------------------------------------------

_ALLOWED = (torch.Tensor, str, int, float, bool, type(None))


def _check_safe(obj: Any, where: str) -> None:
    """Only what `torch.load(weights_only=True)` accepts; fail at save time, not at resume time."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"checkpoint: key {key!r} in {where} is a {type(key).__name__}")
            _check_safe(value, f"{where}.{key}")
    elif isinstance(obj, (list, tuple)):
        for k, value in enumerate(obj):
            _check_safe(value, f"{where}[{k}]")
    elif not isinstance(obj, _ALLOWED):
        raise TypeError(
            f"checkpoint: {where} is a {type(obj).__name__}; store tensors or "
            "primitive values only (torch.load weights_only=True)"
        )


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu").clone()
    if isinstance(obj, dict):
        return type(obj)((k, _to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    return obj


def make_header(
    *,
    rank: int,
    world_size: int,
    topology: Topology,
    topology_spec: str,
    config_hash: str,
    config_json: str,
    epoch: int,
    step: int,
    data: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    return {
        "format": FORMAT,
        "rank": int(rank),
        "world_size": int(world_size),
        "topology": str(topology_spec),
        "topology_fingerprint": str(topology.fingerprint),
        "config_hash": config_hash,
        "config": config_json,
        "epoch": int(epoch),
        "step": int(step),
        "data": dict(data or {}),
    }


def encode_record(header: Dict[str, Any], state: Dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file: `header`, the payload's digest and the payload (`state`)."""
    state = _to_cpu(state)
    _check_safe(state, "state")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    record = {
        "header": dict(header),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    out = io.BytesIO()
    torch.save(record, out)
    return out.getvalue()


def save_checkpoint(run_dir, header: Dict[str, Any], state: Dict[str, Any]) -> Path:
    """Write this rank's checkpoint for `header['epoch']` atomically; keep the newest `KEEP`."""
    rank, epoch = header["rank"], header["epoch"]
    path = checkpoint_path(run_dir, rank, epoch)
    atomic_write(path, encode_record(header, state))
    for old in available_epochs(run_dir, rank)[:-KEEP]:
        try:
            checkpoint_path(run_dir, rank, old).unlink()
        except FileNotFoundError:
            pass
    # A writer killed mid-write (e.g. SIGKILL) leaves its temporary file behind; this rank has just
    # written a complete checkpoint, so any temporary file of its own is such a leftover.
    for leftover in _leftover_temporaries(run_dir, rank):
        try:
            leftover.unlink()
        except FileNotFoundError:
            pass
    return path


def drop_newer(run_dir, rank: int, epoch: int) -> List[int]:
    """Remove `rank`'s checkpoints of epochs after `epoch`, the one the run has resumed from (module
    docstring); returns those epochs. Called once every rank has loaded `epoch`."""
    newer = [e for e in available_epochs(run_dir, rank) if e > epoch]
    for old in newer:
        checkpoint_path(run_dir, rank, old).unlink(missing_ok=True)
    return newer


def _leftover_temporaries(run_dir, rank: int) -> List[Path]:
    """`rank`'s temporary checkpoint files: `utils.atomic_write` names them
    `.rank-K-epoch-E.pt.XXXXXXXX.tmp` (mkstemp); earlier versions wrote `.rank-K-epoch-E.pt.tmp-*`,
    which a run directory resumed from such a version may still hold."""
    pattern = re.compile(rf"\.rank-{int(rank)}-epoch-\d+\.pt\.(?:[^.]+\.tmp|tmp-.*)$")
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return [entry for entry in folder.iterdir() if pattern.match(entry.name)]


def _not_ours(path: Path, what: str) -> ValueError:
    return ValueError(
        f"checkpoint {path} is not a weights-only checkpoint of this project: {what}, "
        "which is never loaded; it was not written by gossip_powersgd (or was "
        "replaced): restore the file, or delete it to resume from the previous epoch"
    )


def _load_weights_only(data, path: Path, what: str) -> Any:
    """`torch.load(weights_only=True)` of a file or of bytes, every failure in our own one line.

    Our checkpoints are torch's zip format; a plain (or legacy torch) pickle is refused before
    any unpickler sees it. torch's text for a refused unpickling spans lines, carries terminal
    escapes and advises `weights_only=False`, which would run whatever the file holds: it is never
    quoted."""
    if isinstance(data, bytes):
        head, source = data[:1], io.BytesIO(data)
    else:
        try:
            with open(data, "rb") as f:
                head = f.read(1)
        except FileNotFoundError:
            raise ValueError(f"checkpoint {path} does not exist") from None
        except OSError:
            head = b""  # torch.load reports it below
        source = data
    if head == b"\x80":  # how pickle protocols 2+ begin; a zip begins with PK
        raise _not_ours(path, f"{what} is a pickle, not torch's zip format")
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse is a corrupt file
        if type(exc).__name__ == "UnpicklingError":  # pickle's, named so as not to import it
            if "global" in str(exc):  # the unpickler met a class or function it does not allow
                raise _not_ours(path, f"{what} holds pickled Python objects") from None
            raise ValueError(
                f"checkpoint {path} is corrupt or truncated ({what} is not a torch file)"
            ) from None
        raise ValueError(
            f"checkpoint {path} is corrupt or truncated ({one_line(exc, limit=200)})"
        ) from None


def read_checkpoint(path) -> Dict[str, Any]:
    """Load and verify one file: returns {"header": ..., "state": ...}; ValueError if unreadable."""
    path = Path(path)
    require_regular_file(path, f"checkpoint {path}")  # a FIFO would block open() for good
    record = _load_weights_only(path, path, "the file")
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("header"), dict)
        or not isinstance(record.get("payload"), torch.Tensor)
        or "sha256" not in record
    ):
        raise ValueError(
            f"checkpoint {path} is not a gossip_powersgd checkpoint (no header/payload)"
        )
    header = record["header"]
    if header.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {path} has format {header.get('format')!r}; this version reads "
            f"format {FORMAT}"
        )
    payload = record["payload"].numpy().tobytes()
    if hashlib.sha256(payload).hexdigest() != record["sha256"]:
        raise ValueError(f"checkpoint {path} is corrupt (its checksum does not match its contents)")
    # a valid header and digest may still wrap a foreign payload
    state = _load_weights_only(payload, path, "its payload")
    return {"header": header, "state": state}


def truncate_jsonl(path, last_step: int) -> None:
    """Keep the records up to `last_step` (what the checkpoint holds); drop the rest.

    A resumed run writes the records after its checkpoint again, so those the interrupted run had
    already written would otherwise appear twice.
    """
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break  # a half-written last line
        if record.get("step", 0) > last_step:
            break
        kept.append(line)
    atomic_write(path, "".join(k + "\n" for k in kept))


def metrics_path(run_dir, rank: int) -> Path:
    return Path(run_dir) / "metrics" / f"rank-{rank}.jsonl"


def open_metrics(run_dir, rank: int, resume_step: Optional[int] = None):
    """`rank`'s JSONL metrics file, opened for appending; on resume first cut to `resume_step`."""
    path = metrics_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    if resume_step is not None:
        truncate_jsonl(path, resume_step)
    return open(path, "a")


__all__ = [
    "FORMAT",
    "KEEP",
    "LOCK_NAME",
    "RunLock",
    "take_run_lock",
    "available_epochs",
    "check_run_dir",
    "checkpoint_dir",
    "checkpoint_path",
    "drop_newer",
    "make_header",
    "metrics_path",
    "open_metrics",
    "read_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "truncate_jsonl",
]
