"""The bandwidth page's faults across hosts (a link cut, a rank killed, processes stopped or all
killed), mid-run on 3 emulated hosts under torchrun and mpiexec: each row runs the scenario of
tests/faults/test_liveness_hosts.py (tests/support/host_faults.py) and keeps when every rank
ended and what each said; the section shows them against the design's bound and the issue's 30 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import ROOT, Run
from experiments.pages._markdown import fill, snippets

#: The scenario, written once for the test and the page.
SCENARIO = ROOT / "tests" / "support" / "host_faults.py"
#: (launcher, fault) of the full page: the three faults under both launchers, and every process
#: of a host killed under torchrun (its agent too).
CASES = tuple((lc, f) for lc in ("torch", "mpi") for f in ("cut", "kill", "stop"))
CASES += (("torch", "kill-all"),)
#: The issue's bound on a host fault: every rank gone within 30 s, naming the host.
ISSUE_SECONDS = 30.0
#: The longest one scenario may take (start, the fault, the end) before it counts as a hang.
LIMIT = 600.0
WHAT = {
    "cut": "link cut (`ip link set eth0 down` on the host)",
    "kill": "its rank SIGKILLed",
    "stop": "every process SIGSTOPped",
    "kill-all": "every process SIGKILLed (agent too)",
}
LAUNCHERS = {"torch": "torchrun", "mpi": "mpiexec"}
TEXT = snippets(__file__, "page.md")


def runs(cases: Sequence[Tuple[str, str]], quick: bool) -> List[Run]:
    """The plan's fault runs, one per (launcher, fault)."""
    config = {"kind": "fault", "quick": quick}
    return [Run(f"fault/{lc}/{f}", dict(config, launcher=lc, fault=f)) for lc, f in cases]


def row(run: Run, prefix: str) -> Dict[str, Any]:
    """One scenario on cluster `prefix` (made and removed by the scenario itself)."""
    c = run.config
    with tempfile.TemporaryDirectory(prefix="bandwidth-fault-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "log.txt"
        argv = [sys.executable, str(SCENARIO), prefix, c["launcher"], c["fault"], str(out)]
        with open(log, "w") as sink:  # a file, not a pipe: the launchers' children inherit it
            process = subprocess.Popen(
                argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            status = process.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = None
        if status != 0 or not out.is_file():
            what = "ran past its limit" if status is None else f"exited with status {status}"
            tail = log.read_text()[-1500:]
            raise RuntimeError(f"fault scenario {c['launcher']}/{c['fault']} {what}: {tail}")
        result = json.loads(out.read_text())
    result.pop("pids", None)
    return result


def _seconds(value: Optional[float], none: str = "—") -> str:
    return none if value is None else f"{value:.2f}"


def _row(launcher: str, fault: str, r: Mapping[str, Any]) -> str:
    """A case's line of the section's table."""
    lost = r.get("lost_says")
    exits = ", ".join(f"{k}: {_seconds(v, 'not ended')}" for k, v in r["exits"].items())
    fields = dict(launcher=LAUNCHERS[launcher], what=WHAT[fault], exits=exits)
    fields["gone"] = _seconds(r["seconds"], "not within 90 s")
    fields["named_after"] = _seconds(r["named_after"])
    fields["named"] = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in r["named"].items())
    fields["said"] = "—" if lost is None else "`" + lost.split(": ", 1)[1][:140] + "`"
    return fill(TEXT["fault row"], **fields)


def section(cases: Sequence[Tuple[str, str]], data: Mapping[str, Dict[str, Any]]) -> List[str]:
    """ "Faults across hosts": a line per case that has a row, against the issue's 30 s."""
    found = [(lc, f, data[f"fault/{lc}/{f}"]) for lc, f in cases if f"fault/{lc}/{f}" in data]
    skipped = [r["skipped"] for _, _, r in found if "skipped" in r]
    ran = [x for x in found if "skipped" not in x[2]]
    if not found:
        return []
    lines = ["## Faults across hosts", ""] + ([f"Not run: {skipped[0]}", ""] if skipped else [])
    if not ran:
        return lines
    late = [
        f"{LAUNCHERS[lc]} {f}"
        for lc, f, r in ran
        if r["seconds"] is None or r["seconds"] > ISSUE_SECONDS
    ]
    verdict = f"was gone within the issue's {ISSUE_SECONDS:g} s in every case"
    if late:
        verdict = f"was NOT gone within {ISSUE_SECONDS:g} s in: {', '.join(late)}"
    bound = ", ".join(f"{b:g}" for b in sorted({r["bound"] for _, _, r in ran}))
    text = fill(TEXT["faults"], verdict=verdict, bound=bound)
    return lines + [TEXT["fault table"], *(_row(*x) for x in ran), "", text, ""]
