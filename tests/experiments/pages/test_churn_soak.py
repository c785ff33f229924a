"""The churn soak's quick variant (`experiments.pages.churn.soak.soak`): 4 hosts of the
emulated cluster, one training process each, a kill, a stop and a link cut of single hosts, each
host brought back with --rejoin. Opt-in (GOSSIP_TEST_CHURN_SOAK=1): it runs three trainings (a
probe for the step rate, the run without faults, the soak) for several minutes, past the suite's
budget; it needs root for the network namespaces."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gossip_powersgd.cluster import network

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("GOSSIP_TEST_CHURN_SOAK") != "1",
        reason="opt-in (GOSSIP_TEST_CHURN_SOAK=1): several minutes on the emulated cluster",
    ),
    pytest.mark.skipif(
        bool(network.missing_privileges()),
        reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
    ),
]


def test_the_quick_soak_brings_every_host_back_and_every_process_finishes(tmp_path):
    sys.path.insert(0, str(ROOT / "experiments" / "pages" / "churn"))
    import soak

    out = tmp_path / "soak.jsonl"
    soak.soak(1.5, 3, 0, out, hosts=4, kinds=soak.KINDS)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    faults, final = rows[:-1], rows[-1]
    assert [r["kind"] for r in faults] == list(soak.KINDS[: len(faults)]) and len(faults) >= 2
    for row in faults:
        # the survivors removed the faulted host's peer, then admitted it back
        assert row["right_peer"], row
        assert 0 < row["to_membership_line_s"] < row["to_readmission_s"]
    assert final["members_at_end"] == [0, 1, 2, 3]
    assert final["membership_changes"] == 2 * len(faults)
    # each host's last process (its restart after its last fault, else the first) ends with 0
    last = {str(k): str(k) for k in range(4)}
    for row in faults:
        last[str(row["host"])] = f"{row['host']}-rejoin{row['fault']}"
    assert {k: final["exit_codes"][name] for k, name in last.items()} == {
        str(k): 0 for k in range(4)
    }
    assert final["final_test_acc_avg_model"] > 0.8  # far above chance (4 classes)
    assert not [ns for ns in network.namespaces() if ns.startswith("cr")]
