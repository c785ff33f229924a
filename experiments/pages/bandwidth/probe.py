"""One host's part of a step-time measurement on the emulated cluster, started on every host with
the variables torchrun would set and no agent beside it (`rows.timing_row` launches it):

    python -m experiments.pages.bandwidth.probe SPEC.json OUT_DIR

For each algorithm of SPEC (one torch.distributed communicator for all of them), the trainer's
loop is timed period by period and its communication replayed with compute out of the way
(`gossip_powersgd.training.timing.measure_algorithm`); then one evaluation is timed and
replayed. Writes OUT_DIR/rank-K.json.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    import topologies
    import torch

    from gossip_powersgd.launch import make_communicator
    from gossip_powersgd.utils import atomic_write

    from gossip_powersgd.training.timing import CallRecorder, measure_algorithm, measure_evaluation

    torch.set_num_threads(1)
    topology = topologies.parse(spec["train"]["topology"])
    comm = make_communicator("torch", topology, timeout=spec["timeout"])
    recorder = CallRecorder(comm)
    result = {"rank": comm.rank, "host": socket.gethostname(), "algorithms": {}}
    result["load_before"] = list(os.getloadavg())
    timer = None
    for algorithm in spec["algorithms"]:
        config = dict(spec["train"], algorithm=algorithm["spec"], backend="torch")
        config.update(local_steps=algorithm["local_steps"], comm_timeout=spec["timeout"])
        measured, timer = measure_algorithm(comm, recorder, config, spec["budget"])
        result["algorithms"][algorithm["key"]] = measured
    if spec.get("eval", True):
        result["eval"] = measure_evaluation(comm, recorder, timer, spec["budget"])
    result["load_after"] = list(os.getloadavg())
    result["stats"] = comm.stats.as_dict()
    comm.barrier()
    comm.close()
    atomic_write(out / f"rank-{result['rank']}.json", json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
