"""The rows of the training suite's pages (training, gamma): a run is one whole training config,
measured by `experiments.suite.runs.attempt_config` (a run that fails or diverges: a row saying so)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.engine import Run


def suite_run(
    key: str,
    label: str,
    train: Dict[str, Any],
    seed: int,
    kind: str = "main",
    gamma: Optional[float] = None,
    cost: float = 1.0,
) -> Run:
    """A plan's run: `train` (a training config without `seed`) under `label` in the page's
    `kind` of rows. `gamma` (None: the spec's own) goes into the spec's "{gamma}" when the run is
    made, so that the stored config holds it as a number (compared to 1e-9 relative)."""
    config = {"label": label, "kind": kind, "gamma": gamma, "train": dict(train)}
    return Run(key=key, config=config, seed=seed, cost=cost)


def suite_row(run: Run) -> Dict[str, Any]:
    """One run's row: `attempt_config`'s, without what the renderers derive (γ's text, the curve)."""
    from experiments.suite.runs import attempt_config

    c = run.config
    train = dict(c["train"], seed=run.seed)
    train["algorithm"] = spec_of(train["algorithm"], c["gamma"])
    row = attempt_config(c["label"], train, c["gamma"], c["kind"])
    row.pop("gamma_text", None)
    row.pop("curve", None)
    return row


def spec_of(template: str, gamma: Optional[float]) -> str:
    """The algorithm spec of a run: `template` with its "{gamma}" replaced by `gamma`'s repr."""
    return template.replace("{gamma}", repr(gamma)) if "{gamma}" in template else template


def with_curves(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Copies of stored rows with their (MB, averaged-model accuracy) curve from their evals."""
    return [dict(r, curve=[(e["mb"], e["acc_avg"]) for e in r.get("evals") or []]) for r in rows]
