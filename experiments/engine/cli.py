"""`python -m experiments PAGE [--quick] [--jobs N] [--render-only] [--out DIR]`: the one command
that makes every results page (`python -m experiments` or --list: the pages, one line each).

Pages go to runs/experiments/ (runs/experiments-quick/ with --quick), which git ignores; the
committed pages are made with `--out experiments/results`. Bad input is one line on stderr and a
non-zero exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Mapping, Optional

from .plan import Page
from .pool import MAX_JOBS, WorkerDied

#: Exit status of bad command-line input (argparse's), and of an error during the sweep.
USAGE_EXIT, ERROR_EXIT = 2, 1


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block before them)."""

    def error(self, message: str):
        sys.stderr.write(f"error: {message} (python -m experiments --help)\n")
        sys.exit(USAGE_EXIT)


def jobs_count(text: str) -> int:
    """--jobs: a whole number of worker processes, 1 to MAX_JOBS."""
    if not text.strip().isdecimal() or not 1 <= int(text) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(
            f"give a whole number of worker processes from 1 to {MAX_JOBS}, got {text!r}"
        )
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m experiments",
        description="Make a results page: run its plan (resuming from its stored rows) and draw it.",
    )
    add = parser.add_argument
    add("page", nargs="?", help="the page to make (none, or --list: list them)")
    add("--list", action="store_true", help="list the pages, one line each")
    add("--quick", action="store_true", help="the page's smoke-test plan (seconds; for CI)")
    jobs = "runs at once, each in its own worker process (the costliest first; default 1: one "
    jobs += "after another in this process)"
    add("--jobs", type=jobs_count, default=1, metavar="N", help=jobs)
    render = "draw the page from its stored rows (OUT/PAGE.jsonl) without running anything"
    add("--render-only", action="store_true", help=render)
    merge = "join these PAGE.jsonl files (sweeps made apart) into OUT/PAGE.jsonl, then draw"
    add("--merge", nargs="+", type=Path, metavar="ROWS", help=merge)
    out = "where the rows and the page go (default runs/experiments, or runs/experiments-quick "
    out += "with --quick; the committed pages: experiments/results)"
    add("--out", type=Path, default=None, metavar="DIR", help=out)
    return parser


def writable_folder(path: Path) -> Path:
    """`path`, created if missing; a one-line ValueError if it is not a folder one can write."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file, not a folder: give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"--out {path} is not a folder this process can write ({exc.strerror or exc}): "
            "give another --out"
        ) from None
    return path


def listing(pages: Mapping[str, Page]) -> str:
    width = max((len(name) for name in pages), default=0)
    lines = "".join(f"  {name.ljust(width)}  {p.title}\n" for name, p in sorted(pages.items()))
    return "pages (python -m experiments PAGE [--quick] [--jobs N] [--render-only]):\n" + lines


def _dispatch(args: argparse.Namespace, page: Page) -> None:
    from .pipeline import default_out, merge, render, sweep

    out = writable_folder(args.out if args.out is not None else default_out(args.quick))
    if args.render_only and args.merge:
        raise ValueError("give --render-only or --merge, not both")
    if args.render_only:
        render(page, out)
    elif args.merge:
        merge(page, out, args.merge)
    else:
        sweep(page, out, quick=args.quick, jobs=args.jobs)


def main(argv: Optional[List[str]], pages: Callable[[], Mapping[str, Page]]) -> int:
    """Parse `argv` and make the page; `pages()` is the registry (`experiments.pages.pages`).
    Returns the exit status; errors are one line on stderr."""
    args = build_parser().parse_args(argv)
    try:
        registry = pages()
        if args.list and args.page is not None:
            raise ValueError(
                f"--list takes no page (got {args.page!r}): run `python -m experiments --list`, "
                f"or `python -m experiments {args.page}` to make it"
            )
        if args.list or args.page is None:
            sys.stdout.write(listing(registry))
            return 0
        if args.page not in registry:
            raise ValueError(
                f"unknown page {args.page!r}; pages: {', '.join(sorted(registry))} "
                "(python -m experiments --list)"
            )
        _dispatch(args, registry[args.page])
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (Ctrl-C): the rows already finished are stored\n")
        return 130
    except (ValueError, OSError, WorkerDied) as exc:
        if os.environ.get("GOSSIP_TRACEBACK"):
            raise
        text = " ".join(str(exc).split()) or type(exc).__name__
        sys.stderr.write(f"error: {text}\n")
        return ERROR_EXIT
    return 0
