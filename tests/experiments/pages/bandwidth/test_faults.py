"""experiments/pages/bandwidth/faults.py: the fault section, each case and which missed 30 s."""

from __future__ import annotations


def _fault(seconds, named, said=None):
    exits = {"0": seconds, "1": 0.01, "2": seconds}
    return {
        "seconds": seconds,
        "exits": exits,
        "named_after": seconds and seconds - 0.1,
        "named": named,
        "errors": [],
        "lost_says": said,
        "bound": 23.0,
        "left": [],
    }


def test_the_fault_section_shows_each_case_and_says_which_missed_30_s():
    from experiments.pages.bandwidth import faults

    cases = [("torch", "cut"), ("mpi", "kill"), ("mpi", "stop")]
    data = {
        "fault/torch/cut": _fault(12.6, {"0": True, "2": True}, "error (rank 1): this host, h"),
        "fault/mpi/kill": _fault(0.2, {"0": False, "2": False}),
        "fault/mpi/stop": _fault(None, {"0": True, "2": True}),
    }
    text = "\n".join(faults.section(cases, data))
    assert (
        "| torchrun | link cut (`ip link set eth0 down` on the host) | 12.60 | 0: 12.60, 1: "
        in text
    )
    assert "| 0: yes, 2: yes | `this host, h` |" in text
    assert "| mpiexec | its rank SIGKILLed | 0.20 |" in text and "| 0: no, 2: no | — |" in text
    assert "| mpiexec | every process SIGSTOPped | not within 90 s |" in text
    assert "was NOT gone within 30 s in: mpiexec stop" in text
    del data["fault/mpi/stop"]
    assert "was gone within the issue's 30 s in every case" in "\n".join(
        faults.section(cases, data)
    )
    assert faults.section(cases, {}) == []
