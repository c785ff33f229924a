"""`python -m experiments training`: six algorithms to (near) convergence on ring:8, iid and
Dirichlet(0.5), the non-IID gap, a wide model, a longer reference run. `design`: the plan;
`convergence`: rows compared at equal bytes and the non-IID gap; `state`: the renderer."""

from experiments.engine import Page
from experiments.pages import register
from experiments.pages._suite_rows import suite_row

from .design import plan
from .state import render

TITLE = "accuracy vs bytes to convergence: 6 algorithms, ring:8 iid and Dirichlet, wide model"
PAGE = register(Page(name="training", title=TITLE, plan=plan, row=suite_row, render=render))
