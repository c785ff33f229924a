"""The experiment engine: a page's plan -> a process pool -> resumable rows -> a pure renderer.

    from experiments.engine import Page, Run
    PAGE = register(Page("gamma", "one line for --list", plan, row, render))

`plan` (`plan.Page`) lists the runs (`Run`: key, config, seed, cost); `row(run)` makes one run's
JSON-able row (worker processes with --jobs, `pool.run_pool`); each row is stored as a line of
OUT/PAGE.jsonl as it finishes (`rows.RowFile`: atomic, resumed by key); `render(rows)` returns the
page's files from the rows alone (`rows.Rows`). `pipeline` ties them together; `cli` is
`python -m experiments`. Pages live in `experiments.pages` (their registry).
"""

from .plan import Outputs, Page, Run, checked_plan
from .pool import MAX_JOBS, run_pool
from .provenance import ROOT, made_by, page_commit, utc_now
from .rows import Record, RowFile, Rows
from .pipeline import merge, render, sweep

__all__ = ["MAX_JOBS", "Outputs", "Page", "ROOT", "Record", "RowFile", "Rows", "Run"]
__all__ += ["checked_plan", "made_by", "merge", "page_commit", "render", "run_pool", "sweep"]
__all__ += ["utc_now"]
