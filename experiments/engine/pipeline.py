"""A page's sweep: its plan's missing runs made (`pool.run_pool`), each row stored as it finishes
(`rows.RowFile`), then the page drawn from the stored rows (`render`). Also --render-only (the
page from its rows, nothing run) and --merge (rows of several sweeps joined into one file)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

from .errata import annotated, notes
from .plan import Page, Run, checked_plan
from .pool import run_pool
from .provenance import page_commit, utc_now
from .rows import Record, RowFile, Rows


def log(text: str) -> None:
    """A timestamped progress line (stderr: a page's stdout stays clean)."""
    print(f"[experiments {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rows_file(page: Page, out: Path) -> RowFile:
    return RowFile(Path(out) / f"{page.name}.jsonl")


def _work(row: Callable[[Run], Dict[str, Any]], run: Run) -> Tuple[Dict[str, Any], float, str]:
    """One run in a worker: (its row, the seconds it took, when it finished)."""
    started = time.perf_counter()
    data = row(run)
    return data, time.perf_counter() - started, utc_now()


def _difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """ "epochs 60 -> 30, lr 0.1 -> (none)": the first few top-level differences."""
    keys = [k for k in list(old) + [k for k in new if k not in old] if old.get(k) != new.get(k)]
    parts = [
        f"{k} {json.dumps(old.get(k, '(none)'))} -> {json.dumps(new.get(k, '(none)'))}"
        for k in keys[:3]
    ]
    return ", ".join(parts) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def current_plan(page: Page, quick: bool, stored: Mapping[str, Record]) -> List[Run]:
    """The plan given the stored rows; a stored row made from another config than its run's in
    the plan stops everything (it would be shown as that run's)."""
    runs = checked_plan(page, quick, {k: r.row for k, r in stored.items()})
    for run in runs:
        record = stored.get(run.key)
        if record is not None and not record.matches(run):
            identity = run.identity()
            what = _difference(record.config, identity["config"]) or (
                f"seed {record.seed} -> {run.seed}"
            )
            raise ValueError(
                f"{record.where}: run {run.key!r} was made from another config than "
                f"the plan's ({what}): delete that line to make it again, or give another --out"
            )
    return runs


def _mode(stored: Mapping[str, Record], where: Path, quick=None) -> bool:
    """The rows' mode (--quick or not). A file with rows of both, or of the other mode than the
    sweep's (`quick`), is refused: a page shows one kind."""
    name = {True: "--quick", False: "full"}
    modes = {r.quick for r in stored.values()}
    if len(modes) > 1:
        raise ValueError(f"{where} mixes rows of --quick and full runs: keep one kind per file")
    if quick is not None and modes and modes != {quick}:
        raise ValueError(
            f"{where} holds rows of {name[not quick]} runs, and this is a {name[quick]} sweep: "
            "give it another --out"
        )
    return modes.pop() if modes else bool(quick)


def sweep(page: Page, out: Path, quick: bool = False, jobs: int = 1) -> List[Path]:
    """Make the plan's runs that have no row in OUT/PAGE.jsonl yet, then draw the page."""
    store = rows_file(page, out)
    commit = page_commit()  # the code as it is when the sweep starts
    if page.serial and jobs > 1:
        log(f"{page.name} times its runs: one at a time (--jobs {jobs} ignored)")
        jobs = 1
    with store.locked():
        stored = store.read()
        _mode(stored, store.path, quick)
        while True:
            runs = current_plan(page, quick, stored)
            todo = [run for run in runs if run.key not in stored]
            if not todo:
                break
            log(
                f"{page.name}: {len(todo)} run(s) to make, {len(runs) - len(todo)} already in "
                f"{store.path}; {jobs} at a time"
            )

            def done(index: int, result: Tuple[Dict[str, Any], float, str]) -> None:
                run, (row, seconds, finished) = todo[index], result
                try:
                    row = json.loads(json.dumps(row))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"page {page.name}, run {run.key}: row not JSON-able: {exc}")
                made = dict(quick=quick, row=row, commit=commit, finished=finished, seconds=seconds)
                record = Record(key=run.key, **run.identity(), **made)
                store.append(record)
                stored[run.key] = record
                log(f"  {run.key}: {seconds:.1f} s")

            tasks = [(page.row, run) for run in todo]
            run_pool(_work, tasks, jobs, costs=[run.cost for run in todo], done=done)
        stored = store.read()
        _store_in_plan_order(store, stored, runs)
    return render(page, out)


def _store_in_plan_order(store: RowFile, stored: Mapping[str, Record], runs: Sequence[Run]):
    """Rewrite the rows file in the plan's order (rows not in the plan last, kept)."""
    keys = [run.key for run in runs if run.key in stored]
    keys += [key for key in stored if key not in set(keys)]
    if keys != list(stored):
        store.write([stored[key] for key in keys])


def render(page: Page, out: Path) -> List[Path]:
    """Draw the page from OUT/PAGE.jsonl alone (--render-only; also the end of every sweep)."""
    from gossip_powersgd.utils import atomic_write

    store = rows_file(page, out)
    stored = store.read()
    if not stored:
        raise ValueError(
            f"{store.path} has no rows: make them first with `{sweep_command(page.name, out)}`"
        )
    quick = _mode(stored, store.path)
    runs = current_plan(page, quick, stored)
    planned = {run.key for run in runs}
    stale = [key for key in stored if key not in planned]
    if stale:
        shown = ", ".join(stale[:5]) + (" ..." if len(stale) > 5 else "")
        log(f"{len(stale)} row(s) of {store.path} are not in the plan, left off the page: {shown}")
    rows = Rows(page.name, quick, [stored[r.key] for r in runs if r.key in stored], len(runs))
    if not rows.records:  # a page of nothing would replace the page there (or fail to draw)
        raise ValueError(
            f"{store.path} has none of the plan's {len(runs)} run(s), only rows of runs not in it "
            f"(renamed or from another page?): make the plan's with "
            f"`{sweep_command(page.name, out, quick)}`"
        )
    written, errata = [], notes(page.name, ((r.commit, r.finished) for r in rows.records))
    for name, content in page.render(rows).items():
        if name.endswith(".md"):
            content = annotated(content, errata)
        path = Path(out) / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"page {page.name}: its renderer names a file outside --out: {name}")
        atomic_write(path, content)
        written.append(path)
    log(f"{page.name}: wrote {', '.join(str(p) for p in written)}")
    return written


def merge(page: Page, out: Path, sources: Sequence[Path]) -> List[Path]:
    """Join the rows of `sources` (and OUT/PAGE.jsonl's, if any) into OUT/PAGE.jsonl, then draw
    the page. A run in two files is refused (keep it in one); a file named twice (OUT/PAGE.jsonl
    among `sources` too) is read once."""
    store = rows_file(page, out)
    with store.locked():
        joined: Dict[str, Record] = {}
        for path in _merged_files(page, store.path, sources):
            for key, record in RowFile(path).read().items():
                if key in joined:
                    raise ValueError(
                        f"run {key!r} is in {joined[key].where} and in {record.where}: keep it "
                        "in one of them"
                    )
                joined[key] = record
        quick = _mode(joined, store.path)
        runs = current_plan(page, quick, joined)
        store.write(list(joined.values()))
        _store_in_plan_order(store, joined, runs)
    return render(page, out)


def _merged_files(page: Page, store: Path, sources: Sequence[Path]) -> List[Path]:
    """OUT/PAGE.jsonl (if it exists) and `sources`, each file once."""
    files: List[Path] = []
    for path in ([store] if store.exists() else []) + [Path(s) for s in sources]:
        if path.is_dir():
            raise ValueError(
                f"--merge {path} is a folder: give its rows file ({path / page.name}.jsonl)"
            )
        if not path.is_file():
            raise ValueError(f"--merge {path}: no such rows file")
        if path.resolve() not in {f.resolve() for f in files}:
            files.append(path)
    return files


def sweep_command(name: str, out: Path, quick: bool = False) -> str:
    """The command that makes page `name`'s rows in `out`: --quick where `out` is the quick
    sweeps' default folder (a bare command would make full rows elsewhere) or `quick` (the rows
    there are --quick ones), --out where `out` is no default folder."""
    where, command = Path(out).resolve(), f"python -m experiments {name}"
    if where in (default_out(False), default_out(True)):
        return command + " --quick" * (where == default_out(True))
    return f"{command}{' --quick' * quick} --out {out}"


def default_out(quick: bool) -> Path:
    """Where a sweep's rows and page go without --out (git-ignored)."""
    from .provenance import ROOT

    return (ROOT / "runs" / ("experiments-quick" if quick else "experiments")).resolve()
