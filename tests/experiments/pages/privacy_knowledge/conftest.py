"""The privacy_knowledge page's --quick attack rows, made once for the package's test files."""

from __future__ import annotations

import pytest

from experiments.pages.privacy_knowledge import plan, row


@pytest.fixture(scope="package")  # once for the package's test files, as once per file before
def attack_rows():
    runs = [r for r in plan(True, {}) if r.config["kind"] == "attack"]
    return {r.key: row(r) for r in runs}
