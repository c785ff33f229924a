"""`python -m experiments bandwidth [--quick] [--jobs N] --out experiments/results`: time to a target
accuracy per algorithm, topology and link rate, on hosts emulated on this machine.

Accuracy against steps comes from in-process runs (every peer a thread: the algorithms are
synchronous and deterministic and the transports give bit-identical models); a step's time per
algorithm, topology and rate from the emulated cluster (`gossip_powersgd.cluster`, as root); the
two are composed, and complete runs on the cluster check the composition and the models
(recipe.py: the plan; rows.py: how each run is made, the timing itself by
gossip_powersgd.cluster.step_times and training.timing; compose.py and figures.py: the arithmetic; text.py (the
answer in words too), text_network.py, render.py: the page).

--quick runs the same pipeline, cluster included, on 2 hosts with a tiny model (a minute or two
on a loaded 2-core machine): CI runs as root, so the cluster's code is exercised there end to
end. Where namespaces cannot be made (not root) its cluster rows say why and the page says they
were not run, instead of failing; the full page needs the cluster and stops with one line.
"""

from __future__ import annotations

from experiments.engine import Page
from experiments.pages import register

from .recipe import plan
from .render import render
from .rows import row

PAGE = register(
    Page(
        name="bandwidth",
        title="Time to accuracy under bandwidth limits: step times on emulated hosts x accuracy per step",
        plan=plan,
        row=row,
        render=render,
    )
)
