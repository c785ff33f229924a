"""`python -m experiments training`: six algorithms trained to (near) convergence on ring:8, iid
(several seeds) and Dirichlet(0.5); the non-IID gap of PowerGossip's ranks and iterations; a wide
model where compression matters; a longer reference run for the epoch budget. Writes
training.md, training.csv (every run), training_curves.csv (every evaluation) and two plots.

Modules: `design` (the rows compared, the stages, the plan), `state` (the page's state from its
rows, the targets, the renderer), `markdown` and `plots` (the page and its pictures),
`convergence` (rows compared at equal bytes), `noniid` (the non-IID gap). Rows: `_suite_rows`.
"""

from experiments.engine import Page
from experiments.pages import register
from experiments.pages._suite_rows import suite_row

from .design import plan
from .state import render

PAGE = register(
    Page(
        name="training",
        title="accuracy vs bytes to convergence: 6 algorithms, ring:8 iid and Dirichlet, wide model",
        plan=plan,
        row=suite_row,
        render=render,
    )
)
