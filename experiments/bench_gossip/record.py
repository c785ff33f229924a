"""The benchmark's raw results as compact JSON, and a description of the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from experiments.engine.provenance import page_commit


def _rounded(obj: Any, digits: int = 5) -> Any:
    """`obj` with every float rounded to `digits` significant digits (compact raw files)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    return obj


def _columnar(obj: Any) -> Any:
    """Lists of same-keyed dicts (the per-step records) as dicts of lists: a third of the size."""
    if isinstance(obj, dict):
        return {k: _columnar(v) for k, v in obj.items()}
    if isinstance(obj, list):
        if (
            len(obj) > 1
            and all(isinstance(x, dict) for x in obj)
            and len({tuple(x) for x in obj}) == 1
            and "steps" not in obj[0]
        ):
            return {k: [_columnar(x[k]) for x in obj] for k in obj[0]}
        return [_columnar(x) for x in obj]
    return obj


def raw_json(obj: Any) -> str:
    """Compact JSON of the raw results: floats to 5 significant digits, per-step records columnar."""
    return json.dumps(_columnar(_rounded(obj)), separators=(",", ":")) + "\n"


def machine_description() -> Dict[str, Any]:
    """CPU, cores, memory, load, Python, torch and MPI versions (for the page's header)."""
    import torch

    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = next(
            line.split()[1]
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f"{int(mem) / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        memory = "unknown"
    mpi = "MPI: unknown"
    try:  # without initialising MPI in this process
        if "mpi4py.MPI" in sys.modules:
            mpi = sys.modules["mpi4py.MPI"].Get_library_version().strip().splitlines()[0]
        elif (Path(sys.executable).parent / "mpichversion").exists():
            text = subprocess.run(
                [str(Path(sys.executable).parent / "mpichversion")],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            mpi = " ".join(text.strip().splitlines()[0].split())
    except Exception:  # noqa: BLE001 - description only
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory": memory,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "mpi": mpi,
        "platform": platform.platform(),
        "commit": page_commit(),
    }
