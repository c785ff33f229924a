"""Helpers of the privacy_mechanisms page's test files (tests/experiments/pages/privacy_mechanisms/):
where the committed pages and rows are."""

from __future__ import annotations

from pathlib import Path


RESULTS = Path(__file__).resolve().parents[4] / "experiments" / "results"
