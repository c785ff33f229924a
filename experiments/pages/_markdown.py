"""Markdown for renderers, written once: a table from its header and rows, or from a list of
(column, cell) pairs, so that a page states its columns instead of building lines by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

#: How a cell is made from one item of the rows; a column is its title and its cell.
Cell = Callable[[Any], str]
Column = Tuple[str, Cell]


def table(header, rows: Iterable[Sequence[str]], end: Optional[str] = "") -> List[str]:
    """The lines of a markdown table (header, rule, a line a row), then `end` (a blank line;
    None: nothing). `header`: the titles, or one string of them joined by " | "."""
    header = header.split(" | ") if isinstance(header, str) else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *table_rows(rows)]
    return lines if end is None else lines + [end]


def table_rows(rows: Iterable[Sequence[str]]) -> List[str]:
    """A table's lines, a row a line, without header and rule (those in a page's template)."""
    return ["| " + " | ".join(r) + " |" for r in rows]


def columns(spec: Sequence[Column], items: Iterable[Any], end: Optional[str] = "") -> List[str]:
    """`table` from (title, cell) pairs: a row an item, a cell `cell(item)` a column."""
    return table([title for title, _ in spec], ([f(x) for _, f in spec] for x in items), end)


def template(page_file: str, name: str = "page.md") -> str:
    """The markdown template `name` beside a page's module (`page_file`: its `__file__`)."""
    return (Path(page_file).parent / name).read_text(encoding="utf-8")


def snippets(page_file: str, name: str) -> Dict[str, str]:
    """The named pieces of the markdown file `name` beside a page's module, for text a page shows
    only where its rows call for it: each piece starts after a line `<!-- NAME -->` and runs to
    the next such line (blank lines at its end dropped), to be `str.format`ted."""
    pieces: Dict[str, List[str]] = {}
    lines: List[str] = []
    for line in template(page_file, name).split("\n"):
        if line.startswith("<!-- ") and line.endswith(" -->"):
            if line[5:-4] in pieces:
                raise ValueError(f"{name} beside {page_file}: two pieces named {line[5:-4]!r}")
            lines = pieces.setdefault(line[5:-4], [])
        else:
            lines.append(line)
    return {key: "\n".join(lines).rstrip("\n") for key, lines in pieces.items()}


def fill(text: str, **fields: Any) -> str:
    """A template filled in: a line that is only `{name}` of a list field stands for that list's
    lines (none for an empty list); every other line is `str.format`ted with the fields."""
    out: List[str] = []
    for line in text.split("\n"):
        value = fields.get(line[1:-1]) if line[:1] + line[-1:] == "{}" else None
        if isinstance(value, list):
            out += value
        else:
            out.append(line.format(**fields))
    return "\n".join(out)


def block(text: str) -> List[str]:
    """Text that ends in a newline (or "") as a template's list of lines: `fill` puts them back
    exactly as the text was."""
    return text.split("\n")[:-1]


def csv_text(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """CSV text (lines ending in "\\n") of a header row and the rows, cells as `csv` writes them."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def grid_end(value: float, grid: Sequence[float]) -> str:
    """ "largest" or "smallest" where a value chosen from a grid of two or more is at its end (a
    better one may lie beyond it), else ""."""
    if len(grid) < 2 or value not in (min(grid), max(grid)):
        return ""
    return "largest" if value == max(grid) else "smallest"


# --- exp-misc: shared by the churn and privacy pages (mean ± sd cells, aligned tables) ---------


def mean_sd(values: Iterable[float]) -> Tuple[float, Optional[float]]:
    """The mean and the sample standard deviation of `values` (None for a single value)."""
    import statistics

    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def pm(
    mean: float, sd: Optional[float], fmt: str = ".2f", scale: float = 1.0, unit: str = ""
) -> str:
    """ "mean ± sd" then `unit`, each `format`ted with `fmt` after multiplying by `scale`; the
    mean alone where `sd` is None."""
    text = format(mean * scale, fmt)
    return (text if sd is None else f"{text} ± {format(sd * scale, fmt)}") + unit


def text_table(header, rows: Iterable[Sequence[str]], rule: str = "") -> str:
    """`table` as text ending in a newline (no blank line after it); `rule`: the rule line's
    alignment per column ("l": "---", "r": "---:"; empty: every column "---")."""
    lines = table(header, rows, end=None)
    if rule:
        lines[1] = "|" + "".join("---:|" if r == "r" else "---|" for r in rule)
    return "\n".join(lines) + "\n"
