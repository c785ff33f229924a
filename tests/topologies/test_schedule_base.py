"""Tests for topologies.schedule_base: what every undirected schedule shares (here: the union of
one period's graphs must be connected)."""

from __future__ import annotations

import pytest

import topologies


# --- connected union -----------------------------------------------------------------------------


def test_disconnected_union_of_a_period_is_rejected(tmp_path):
    pair = tmp_path / "pair.txt"
    pair.write_text("0 1\n2 3\n")
    with pytest.raises(ValueError, match=r"over one period \(2 steps\) has 2 components"):
        topologies.parse(f"cyclic:file:{pair},file:{pair}")
