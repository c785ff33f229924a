"""`python -m experiments bandwidth [--quick] [--jobs N] --out experiments/results`: time to a target
accuracy per algorithm, topology and link rate, on hosts emulated on this machine (page.md says
how). recipe.py: the plan; rows.py: the runs; figures.py: the arithmetic; text.py and render.py:
the page. --quick: the same pipeline on 2 hosts with a tiny model (where namespaces cannot be made
its cluster rows say why; the full page stops with one line)."""

from __future__ import annotations

from experiments.engine import Page
from experiments.pages import register

from .recipe import plan
from .render import render
from .rows import row

TITLE = "Time to accuracy under bandwidth limits: step times on emulated hosts x accuracy per step"
PAGE = register(Page(name="bandwidth", title=TITLE, plan=plan, row=row, render=render))
