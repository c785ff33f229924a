"""`python -m experiments bandwidth`: time to accuracy under bandwidth limits (see recipe.py)."""

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
