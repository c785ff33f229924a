"""`python -m experiments bandwidth [--quick] [--jobs N] --out experiments/results`: time to a target
accuracy per algorithm, topology and link rate, on hosts emulated on this machine (page.md says
how). recipe.py: the plan; rows.py: how each run is made; compose.py and figures.py: the
arithmetic; text.py, text_network.py, faults.py and render.py: the page. --quick runs the same
pipeline, cluster included, on 2 hosts with a tiny model (CI runs it as root); where namespaces
cannot be made its cluster rows say why instead of failing, and the full page stops with one line."""

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
