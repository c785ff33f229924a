"""The consensus problems: what every peer holds before gossip starts.

Every problem is seeded (`seed`, 0 reproduces the original page's numbers) and built in float64,
then cast to the run's dtype. Names (parsed by `parse_problem`, one-line errors for bad ones):

- `matrix`, `matrix:N`, `matrix:RxC`: one matrix of N(0,1) entries per peer (100x100 by default);
- `cnn`: N(0,1) tensors shaped like the parameters of MNIST-1D's `cnn1d`;
- `spectral:alpha=A[,n=N]`: X_i = kappa * U_i diag(k^-A) V_i^T (k = 1..N, N = 100), U_i, V_i
  orthonormal (QR of Gaussian matrices, per peer), kappa such that ||X_i||^2 = N^2, the expected
  squared norm of an N x N matrix of N(0,1) entries;
- `lowrank:r=R,sigma=S[,n=N]`: X_i = U diag(c_i) V^T / sqrt(R) + S * E_i, U, V (N x R, N(0,1)
  entries) shared by all peers, c_i (R entries, N(0,1)) and E_i (N(0,1)) per peer: the differences
  x_i - x_j have rank <= R when S = 0. No shared matrix A is added (the `offset` problem measures a
  shared component on its own);
- `offset:beta=B`: the `matrix` problem plus B * A, A (N(0,1)) the same on every peer: the
  differences, hence the consensus distance, are the `matrix` problem's;
- `models:epoch=E`: the parameters of the peers' `cnn1d` models after E epochs of D-PSGD training
  (see `models`); they must have been trained first (`models.ensure_models`).
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

SEED_BASE = 42
#: Peer `rank` of seed `seed` draws from generator SEED_BASE + SEED_STRIDE * seed + rank; shared
#: components (the same on every peer) from SHARED_BASE + seed.
SEED_STRIDE = 1000
SHARED_BASE = 7_000_000
#: The `cnn` problem: the parameters of the MNIST-1D model `cnn1d` (40 inputs, 10 classes).
CNN_MODEL, CNN_INPUT_SHAPE, CNN_CLASSES = "cnn1d", (40,), 10
DEFAULT_SIZE = 100
#: The most floats a problem gives each peer (a 2048x2048 matrix, 32 MiB in float64). Every peer
#: holds them several times over (its state, a message per neighbour), every peer of the topology
#: at once on the local backend, so larger ones are refused before anything is allocated.
MAX_FLOATS = 2048 * 2048
#: Options each problem takes, with their defaults (None: required).
_OPTIONS: Dict[str, Dict[str, Optional[float]]] = {
    "spectral": {"alpha": None, "n": DEFAULT_SIZE},
    "lowrank": {"r": None, "sigma": None, "n": DEFAULT_SIZE},
    "offset": {"beta": None},
    "models": {"epoch": None},
}
VALID = (
    "matrix, matrix:N, matrix:RxC, cnn, spectral:alpha=A, lowrank:r=R,sigma=S, offset:beta=B, "
    "models:epoch=E"
)


@functools.lru_cache(maxsize=None)
def cnn1d_shapes() -> Tuple[Tuple[int, ...], ...]:
    """Parameter shapes of MNIST-1D's cnn1d, read from the model the training code builds."""
    from gossip_powersgd.training.models import build_model

    model = build_model(CNN_MODEL, CNN_INPUT_SHAPE, CNN_CLASSES)
    return tuple(tuple(p.shape) for p in model.parameters())


def parse_problem(problem: str) -> Tuple[str, Dict[str, float]]:
    """`name[:options]` -> (name, options); a one-line ValueError naming the valid forms otherwise."""
    name, _, arg = problem.strip().lower().partition(":")
    if name == "matrix":
        if not arg:
            return name, {"rows": DEFAULT_SIZE, "cols": DEFAULT_SIZE}
        match = re.fullmatch(r"(\d+)(?:x(\d+))?", arg)
        if not match:
            raise ValueError(f"problem {problem!r}: expected matrix, matrix:N or matrix:RxC")
        rows, cols = int(match.group(1)), int(match.group(2) or match.group(1))
        if rows < 1 or cols < 1:
            raise ValueError(f"problem {problem!r}: sizes must be >= 1")
        _check_floats(problem, rows * cols)
        return name, {"rows": rows, "cols": cols}
    if name == "cnn" and not arg:
        return name, {}
    if name not in _OPTIONS:
        raise ValueError(f"unknown problem {problem!r}; valid: {VALID}")
    options: Dict[str, float] = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in _OPTIONS[name]:
            raise ValueError(
                f"problem {problem!r}: bad option {part!r}; {name} takes "
                f"{', '.join(k + '=...' for k in _OPTIONS[name])}"
            )
        try:
            options[key] = float(value)
        except ValueError:
            raise ValueError(f"problem {problem!r}: {key}={value!r} is not a number") from None
    for key, default in _OPTIONS[name].items():
        if key not in options:
            if default is None:
                raise ValueError(f"problem {problem!r}: give {key}=..., e.g. {_example(name)}")
            options[key] = default
    for key in ("n", "r", "epoch"):
        if key in options and (options[key] < 1 or options[key] != int(options[key])):
            raise ValueError(f"problem {problem!r}: {key} must be an integer >= 1")
    if name == "lowrank" and options["r"] > options["n"]:
        raise ValueError(f"problem {problem!r}: r must be <= n={options['n']:g}")
    if options.get("sigma", 0) < 0 or not all(math.isfinite(v) for v in options.values()):
        raise ValueError(f"problem {problem!r}: sigma must be >= 0 and every option finite")
    if "n" in options:
        _check_floats(problem, int(options["n"]) ** 2)
    return name, options


def _check_floats(problem: str, floats: int) -> None:
    """A one-line ValueError when a problem gives each peer more than MAX_FLOATS floats."""
    if floats > MAX_FLOATS:
        raise ValueError(
            f"problem {problem!r} gives every peer {floats:.3g} floats ({8 * floats / 2**30:.3g} "
            f"GiB in float64), above the maximum of {MAX_FLOATS} (2048x2048): every peer "
            "holds them several times over; use e.g. matrix:1000 or n=1000"
        )


def _example(name: str) -> str:
    return {
        "spectral": "spectral:alpha=1",
        "lowrank": "lowrank:r=4,sigma=0.1",
        "offset": "offset:beta=10",
        "models": "models:epoch=10",
    }[name]


def problem_shapes(problem: str) -> List[Tuple[int, ...]]:
    """The list of tensor shapes every peer holds."""
    name, options = parse_problem(problem)
    if name == "matrix":
        return [(int(options["rows"]), int(options["cols"]))]
    if name in ("cnn", "models"):
        return list(cnn1d_shapes())
    if name == "offset":
        return [(DEFAULT_SIZE, DEFAULT_SIZE)]
    n = int(options["n"])
    return [(n, n)]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _orthonormal(n: int, generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # a fixed sign convention: Haar-distributed Q


def spectral_values(alpha: float, n: int) -> torch.Tensor:
    """The singular values kappa * k^-alpha (k = 1..n), kappa such that their squares sum to n^2."""
    decay = torch.arange(1, n + 1, dtype=torch.float64) ** (-alpha)
    return decay * (n / decay.square().sum().sqrt())


def make_problem(
    problem: str, rank: int, dtype=torch.float32, seed: int = 0, models_file: Optional[Path] = None
) -> List[torch.Tensor]:
    """Peer `rank`'s tensors for `problem` and `seed` (see the module docstring), cast to `dtype`."""
    name, options = parse_problem(problem)
    own = _generator(SEED_BASE + SEED_STRIDE * seed + rank)
    if name in ("matrix", "cnn"):
        tensors = [
            torch.randn(shape, generator=own, dtype=torch.float64)
            for shape in problem_shapes(problem)
        ]
    elif name == "offset":
        (shape,) = problem_shapes(problem)
        shared = torch.randn(shape, generator=_generator(SHARED_BASE + seed), dtype=torch.float64)
        tensors = [
            torch.randn(shape, generator=own, dtype=torch.float64) + options["beta"] * shared
        ]
    elif name == "spectral":
        n = int(options["n"])
        u, v = _orthonormal(n, own), _orthonormal(n, own)
        tensors = [(u * spectral_values(options["alpha"], n)) @ v.T]
    elif name == "lowrank":
        n, r = int(options["n"]), int(options["r"])
        shared = _generator(SHARED_BASE + seed)
        u = torch.randn(n, r, generator=shared, dtype=torch.float64)
        v = torch.randn(n, r, generator=shared, dtype=torch.float64)
        c = torch.randn(r, generator=own, dtype=torch.float64)
        noise = torch.randn(n, n, generator=own, dtype=torch.float64)
        tensors = [(u * c) @ v.T / math.sqrt(r) + options["sigma"] * noise]
    else:  # models
        if models_file is None or not Path(models_file).exists():
            raise ValueError(
                f"problem {problem!r}: no trained models; run it through "
                "`python -m experiments.consensus`, which trains them first"
            )
        saved = torch.load(models_file, map_location="cpu", weights_only=True)
        epoch = int(options["epoch"])
        if epoch not in saved["epochs"]:
            raise ValueError(
                f"problem {problem!r}: models were saved at epochs {sorted(saved['epochs'])}; "
                "pick one of them"
            )
        tensors = [t.to(torch.float64) for t in saved["epochs"][epoch][rank]]
    return [t.to(dtype).contiguous() for t in tensors]


__all__ = [
    "CNN_CLASSES",
    "CNN_INPUT_SHAPE",
    "CNN_MODEL",
    "MAX_FLOATS",
    "SEED_BASE",
    "VALID",
    "cnn1d_shapes",
    "make_problem",
    "parse_problem",
    "problem_shapes",
    "spectral_values",
]
