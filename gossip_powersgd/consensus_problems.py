"""The consensus problems of the PowerGossip paper's averaging experiment (sec. 5, and the
consensus page's added ones): what every peer holds before gossip starts (seeded per peer;
built in float64, cast to the run's dtype), for `metrics.consensus_curve` to average:
`matrix[:N|:RxC]` N(0,1) entries (100x100); `cnn` N(0,1) tensors shaped like MNIST-1D's `cnn1d`;
`spectral:alpha=A[,n=N]` X_i = kappa U_i diag(k^-A) V_i^T, U_i, V_i orthonormal per peer,
||X_i||^2 = N^2; `lowrank:r=R,sigma=S[,n=N]` X_i = U diag(c_i) V^T / sqrt(R) + S E_i, U, V shared
(x_i - x_j of rank <= R when S = 0); `offset:beta=B` `matrix` + B A, A shared; `models:epoch=E`
the peers' parameters after E epochs of training, read from a file of
{"epochs": {E: {rank: [tensors]}}} (experiments/pages/consensus/instance.py makes one). A size
whose building needs more than MAX_BUILD_BYTES (4 GiB) per peer is refused when it is parsed.

    tensors = make_problem("spectral:alpha=1", comm.rank, torch.float64, seed=0)
    curve = consensus_curve(comm, "exact", tensors, max_steps=1000, max_bits=1e7)  # metrics
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

#: Peer `rank` of seed `seed` draws from generator SEED_BASE + SEED_STRIDE * seed + rank; shared
#: components (the same on every peer) from SHARED_BASE + seed.
SEED_BASE, SEED_STRIDE, SHARED_BASE = 42, 1000, 7_000_000
DEFAULT_SIZE = 100
#: Options each problem takes, with their defaults (None: required).
OPTIONS: Dict[str, Dict[str, Optional[float]]] = {
    "spectral": {"alpha": None, "n": DEFAULT_SIZE},
    "lowrank": {"r": None, "sigma": None, "n": DEFAULT_SIZE},
    "offset": {"beta": None},
    "models": {"epoch": None},
}
#: The most bytes a peer may allocate to build its problem (4 GiB): the experiments use n <= 100;
#: a size above it (n=100000: 5 x 80 GB) is refused at parsing rather than killed by the kernel.
MAX_BUILD_BYTES = 4 * 2**30
#: At most how many float64 matrices of the problem's shape each one holds at once while it is
#: built (`make_problem`): matrix, the draw and its cast; offset, the offset, the draw and their sum;
#: spectral, U, a QR's input and its two factors, and the signed copy; lowrank, the noise, the
#: low-rank product, its scaled copy, the scaled noise and the sum (peaks measured at n=3000 cast to
#: float32: 1.5, 3.0, 4.4 and 4.1 matrices).
MATRICES_AT_ONCE = {"matrix": 2, "offset": 3, "spectral": 5, "lowrank": 5}
VALID = "matrix, matrix:N, matrix:RxC, cnn, spectral:alpha=..., lowrank:r=...,sigma=..., "
VALID += "offset:beta=..., models:epoch=..."


@functools.lru_cache(maxsize=None)
def cnn1d_shapes() -> Tuple[Tuple[int, ...], ...]:
    """Parameter shapes of MNIST-1D's cnn1d (40 inputs, 10 classes), read from the model."""
    from gossip_powersgd.training.models import build_model

    return tuple(tuple(p.shape) for p in build_model("cnn1d", (40,), 10).parameters())


def parse_problem(problem: str) -> Tuple[str, Dict[str, float]]:
    """`name[:options]` -> (name, options); a one-line ValueError naming the valid forms."""
    name, _, arg = problem.strip().lower().partition(":")
    if name == "matrix":
        match = re.fullmatch(r"(\d+)(?:x(\d+))?", arg or str(DEFAULT_SIZE))
        if not match or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise ValueError(f"problem {problem!r}: expected matrix, matrix:N or matrix:RxC")
        rows, cols = int(match.group(1)), int(match.group(2) or match.group(1))
        check_build_bytes(problem, name, rows, cols)
        return name, {"rows": rows, "cols": cols}
    if name == "cnn" and not arg:
        return name, {}
    if name not in OPTIONS:
        raise ValueError(f"unknown problem {problem!r}; valid: {VALID}")
    options: Dict[str, float] = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in OPTIONS[name]:
            takes = ", ".join(k + "=..." for k in OPTIONS[name])
            raise ValueError(f"problem {problem!r}: bad option {part!r}; {name} takes {takes}")
        if key in options:
            raise ValueError(f"problem {problem!r}: {key} is given twice; give it once")
        try:
            options[key] = float(value)
        except ValueError:
            raise ValueError(f"problem {problem!r}: {key}={value!r} is not a number") from None
        if not math.isfinite(options[key]):  # before the integer checks: int(inf) overflows
            raise ValueError(f"problem {problem!r}: {key}={value!r} must be a finite number")
    for key, default in OPTIONS[name].items():
        if key not in options and default is None:
            raise ValueError(f"problem {problem!r}: give {key}=..., e.g. the forms {VALID}")
        options.setdefault(key, default)
    for key in ("n", "r", "epoch"):
        if key in options and (options[key] < 1 or options[key] != int(options[key])):
            raise ValueError(f"problem {problem!r}: {key} must be an integer >= 1")
    if name == "lowrank" and options["r"] > options["n"]:
        raise ValueError(f"problem {problem!r}: r must be <= n={options['n']:g}")
    if options.get("sigma", 0) < 0:
        raise ValueError(f"problem {problem!r}: sigma must be >= 0")
    if "n" in options:
        check_build_bytes(problem, name, int(options["n"]), int(options["n"]))
    return name, options


def check_build_bytes(problem: str, name: str, rows: int, cols: int) -> None:
    """Refuse, in one line, a size whose building needs more than MAX_BUILD_BYTES per peer
    (MATRICES_AT_ONCE float64 rows x cols matrices), naming that memory and the largest size."""
    at_once = MATRICES_AT_ONCE[name]
    need = at_once * rows * cols * 8
    if need <= MAX_BUILD_BYTES:
        return
    side = math.isqrt(MAX_BUILD_BYTES // (8 * at_once))  # the largest square one under the bound
    size = f"n <= {side}" if name != "matrix" else f"rows x cols <= {side * side} (matrix:{side})"
    raise ValueError(
        f"problem {problem!r}: building it needs about {need / 2**30:.3g} GiB per peer ({at_once} "
        f"float64 {rows}x{cols} matrices at once), above the bound of "
        f"{MAX_BUILD_BYTES / 2**30:g} GiB: use {size}"
    )


def problem_shapes(problem: str) -> List[Tuple[int, ...]]:
    """The shapes of the tensors every peer holds."""
    name, options = parse_problem(problem)
    if name == "matrix":
        return [(int(options["rows"]), int(options["cols"]))]
    if name in ("cnn", "models"):
        return list(cnn1d_shapes())
    n = int(options.get("n", DEFAULT_SIZE))
    return [(n, n)]


def _orthonormal(n: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # a fixed sign convention: Haar-distributed Q


def spectral_values(alpha: float, n: int) -> torch.Tensor:
    """kappa * k^-alpha (k = 1..n), kappa such that their squares sum to n^2."""
    import torch

    decay = torch.arange(1, n + 1, dtype=torch.float64) ** (-alpha)
    return decay * (n / decay.square().sum().sqrt())


def make_problem(
    problem: str, rank: int, dtype=None, seed: int = 0, models_file: Optional[Path] = None
) -> List[torch.Tensor]:
    """Peer `rank`'s tensors for `problem` and `seed`, cast to `dtype` (default float32)."""
    import torch

    name, options = parse_problem(problem)
    own = torch.Generator().manual_seed(SEED_BASE + SEED_STRIDE * seed + rank)
    shared = torch.Generator().manual_seed(SHARED_BASE + seed)
    shapes, f64 = problem_shapes(problem), dict(dtype=torch.float64)
    if name in ("matrix", "cnn"):
        tensors = [torch.randn(shape, generator=own, **f64) for shape in shapes]
    elif name == "offset":
        offset = options["beta"] * torch.randn(shapes[0], generator=shared, **f64)
        tensors = [torch.randn(shapes[0], generator=own, **f64) + offset]
    elif name == "spectral":
        n = int(options["n"])
        u, v = _orthonormal(n, own), _orthonormal(n, own)
        tensors = [(u * spectral_values(options["alpha"], n)) @ v.T]
    elif name == "lowrank":
        n, r = int(options["n"]), int(options["r"])
        u, v = (torch.randn(n, r, generator=shared, **f64) for _ in range(2))
        c, noise = torch.randn(r, generator=own, **f64), torch.randn(n, n, generator=own, **f64)
        tensors = [(u * c) @ v.T / math.sqrt(r) + options["sigma"] * noise]
    else:  # models
        if models_file is None or not Path(models_file).exists():
            raise ValueError(
                f"problem {problem!r}: no trained models at {models_file}: give models_file, a "
                "torch file of {'epochs': {E: {rank: [tensors]}}}"
            )
        saved = torch.load(models_file, map_location="cpu", weights_only=True)["epochs"]
        if int(options["epoch"]) not in saved:
            raise ValueError(f"problem {problem!r}: models were saved at epochs {sorted(saved)}")
        tensors = [t.to(torch.float64) for t in saved[int(options["epoch"])][rank]]
    return [t.to(dtype or torch.float32).contiguous() for t in tensors]
