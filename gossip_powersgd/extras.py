"""The optional extras (setup.cfg's ``extras_require``) a config needs, told from its text alone.

`missing_extra(data, overrides)` reads a config's raw mapping (the YAML as written, and the
``--set key=value`` texts) and names the first package that the config needs and that is not
installed, with the ``pip install`` that brings it. It imports nothing (`importlib.util.find_spec`
only looks), so the training program reports a missing extra right after its first line, before
torch, MPI or the config's keys are loaded; the features check again when they are built, where an
installed package that fails to import keeps its own error.

    extra      needed by                                   packages
    privacy    dp_noise_multiplier / dp_target_epsilon     opacus, dp_accounting, cryptography
    tracking   loggers: [tensorboard | wandb | mlflow]     that tracker's package
    mpi        backend: mpi                                mpi4py
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: Each tracker of `loggers:` (training/extensions.py) and the package it needs.
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: What differential privacy imports (privacy/dependency.py, privacy/seeds.py).
PRIVACY_PACKAGES = ("opacus", "dp_accounting", "cryptography")
#: The config keys that turn differential privacy on (privacy/training.py), flat and nested.
DP_KEYS = ("dp_noise_multiplier", "dp_target_epsilon")


def installed(module: str) -> bool:
    """Whether `module` can be found, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _override(text: str) -> Tuple[str, Any]:
    """``key=value`` as (key with its section's dot made flat, value parsed as YAML or the text)."""
    import yaml

    key, _, value = text.partition("=")
    key = key.strip().replace(".", "_", 1) if key.strip().startswith("dp.") else key.strip()
    try:
        return key, yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        return key, value


def flat_values(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """The keys `missing_extra` reads, from `data` (``dp: {noise_multiplier: ..}`` made flat)
    and then the overrides, each as written (nothing is checked here)."""
    flat: Dict[str, Any] = {}
    for key, value in (data or {}).items():
        if key == "dp" and isinstance(value, Mapping):
            flat.update({f"dp_{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    flat.update(_override(text) for text in overrides)
    return flat


def _logger_names(value: Any) -> List[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    names = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, Mapping) and len(item) == 1:
            names.append(next(iter(item)))
    return names


def needed(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> List[Tuple[str, str, str]]:
    """[(what needs it, package, extra)] for the config `data` with `overrides`."""
    flat = flat_values(data, overrides)
    out = []
    dp = [key for key in DP_KEYS if flat.get(key) is not None]
    if dp:
        out += [(f"differential privacy ({dp[0]})", p, "privacy") for p in PRIVACY_PACKAGES]
    for name in _logger_names(flat.get("loggers") or []):
        if name in TRACKER_PACKAGES:
            out.append((f"loggers: {name}", TRACKER_PACKAGES[name], "tracking"))
    if flat.get("backend") == "mpi":
        out.append(("backend mpi", "mpi4py", "mpi"))
    return out


def missing_extra(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> Optional[str]:
    """The one line for the first package the config needs that is not installed, else None."""
    for what, package, extra in needed(data, overrides):
        if not installed(package):
            return (
                f"{what} needs the {package} package, which is not installed: "
                f"pip install 'gossip_powersgd[{extra}]'"
            )
    return None


__all__ = [
    "TRACKER_PACKAGES",
    "PRIVACY_PACKAGES",
    "DP_KEYS",
    "installed",
    "needed",
    "missing_extra",
]
