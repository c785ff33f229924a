"""`python -m experiments training`: six algorithms to (near) convergence on ring:8, iid and
Dirichlet(0.5); the non-IID gap (`noniid`), a wide model, a longer reference run. `design`: the
plan; `state`: the renderer; `markdown`, `plots`, `convergence` (rows at equal bytes): the page."""

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
