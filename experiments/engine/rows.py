"""Resumable rows: PAGE.jsonl under --out, one JSON object a finished run (`FIELDS`, and
`origin` where a row was converted from an older program's files). Every append rewrites the
file atomically: a killed sweep leaves its finished rows whole, and a rerun runs only the others
(a sweep killed inside a write leaves a hidden `.PAGE.jsonl.XXXXXXXX.tmp`, never read; the next
write of that page removes it).
A line that is not such an object is refused with its file and line number, never skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

from .plan import Run

#: The fields every stored line has, and their JSON types.
FIELDS = dict(key=str, config=dict, seed=int, quick=bool, row=dict, commit=str, finished=str)
FIELDS["seconds"] = (int, float)


@dataclasses.dataclass
class Record:
    """One stored row: the run's identity, its row, and when and by what code it was made."""

    key: str
    config: Dict[str, Any]
    seed: int
    quick: bool
    row: Dict[str, Any]
    commit: str
    finished: str
    seconds: float
    origin: Optional[Dict[str, Any]] = None
    where: str = ""  #: "file:line" it was read from ("" when not read from a file)

    def to_line(self) -> str:
        data = dataclasses.asdict(self)
        data.pop("where")
        if data["origin"] is None:
            data.pop("origin")
        return json.dumps(data, sort_keys=False, ensure_ascii=False) + "\n"

    @classmethod
    def parse(cls, text: str, where: str) -> "Record":
        """The record of one line; ValueError naming `where` (file:line) if it is not one."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(
                f"{where}: not a JSON row ({exc.msg}, column {exc.colno}; a partial line from "
                "a killed write?): delete or fix that line"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a row must be a JSON object, got {type(data).__name__}")
        for name, kind in FIELDS.items():
            if name not in data:
                raise ValueError(f"{where}: the row has no {name!r}: delete or fix that line")
            if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
                raise ValueError(f"{where}: the row's {name!r} is {data[name]!r}: not a {kind}")
        extra = set(data) - set(FIELDS) - {"origin"}
        if extra:
            raise ValueError(f"{where}: the row has unknown fields {sorted(extra)}")
        return cls(**data)

    def matches(self, run: Run) -> bool:
        """Whether this row was made from `run`'s config and seed (floats to `FLOAT_RTOL`)."""
        return same({"config": self.config, "seed": self.seed}, run.identity())


#: Floats of two configs are the same to this relative precision (a γ computed from eigenvalues
#: differs in its last bits between numpy builds).
FLOAT_RTOL = 1e-9


def same(a: Any, b: Any) -> bool:
    """`a == b` for JSON values, with floats equal to `FLOAT_RTOL` (relative)."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
        return numbers and math.isclose(a, b, rel_tol=FLOAT_RTOL, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


class RowFile:
    """PAGE.jsonl: read, append (atomically), rewrite in plan order; `locked()` around a sweep."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._swept = False  # this page's leftover temporary files removed

    def read(self) -> Dict[str, Record]:
        """{key: record} in file order; {} when the file does not exist."""
        if not self.path.exists():
            return {}
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.path} is not UTF-8 text (byte {exc.start}): not a rows file; give "
                "another, or delete it to make its rows again"
            ) from None
        out: Dict[str, Record] = {}
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            record = Record.parse(text, f"{self.path}:{number}")
            record.where = f"{self.path}:{number}"
            if record.key in out:
                raise ValueError(
                    f"{record.where}: run {record.key!r} is already at "
                    f"{out[record.key].where}: keep one of the two lines"
                )
            out[record.key] = record
        return out

    def write(self, records: List[Record]) -> None:
        """Replace the file with `records` (atomic)."""
        self._replace("".join(r.to_line() for r in records).encode("utf-8"))

    def append(self, record: Record) -> None:
        """Add one line: the file is rewritten whole and renamed into place (atomic)."""
        old = self.path.read_bytes() if self.path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        self._replace(old + record.to_line().encode("utf-8"))

    def _replace(self, data: bytes) -> None:
        """Write the file (atomic); the first write also removes the temporary files a writer of
        this page killed inside a write left (only this page's: the sweep holds its lock, so no
        other writer of it is running; other pages' writers may be)."""
        from gossip_powersgd.utils import atomic_write, remove_leftover_temporaries

        atomic_write(self.path, data)
        if not self._swept:
            remove_leftover_temporaries(self.path.parent, re.escape(self.path.name))
            self._swept = True

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this file's lock (one in the temporary directory, named after the file's path):
        a second sweep of the same rows stops at once instead of mixing its appends in."""
        import fcntl

        name = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:16]
        lock = Path(tempfile.gettempdir()) / f"experiments-rows-{name}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(
                    f"another sweep is writing {self.path}: wait for it to finish, or give "
                    "another --out"
                ) from None
            yield
        finally:
            os.close(fd)


@dataclasses.dataclass
class Rows:
    """What a renderer gets: the page's stored rows in plan order (only runs of the plan)."""

    page: str
    quick: bool
    records: List[Record]
    planned: int  #: runs in the plan; more than len(records) while a sweep is unfinished

    @property
    def data(self) -> List[Dict[str, Any]]:
        """The rows (each run's dict from the page's row function), in plan order."""
        return [r.row for r in self.records]

    @property
    def by_key(self) -> Mapping[str, Dict[str, Any]]:
        return {r.key: r.row for r in self.records}

    @property
    def command(self) -> str:
        """The command that makes this page (written into pages): `python -m experiments PAGE`."""
        return f"python -m experiments {self.page}" + (" --quick" if self.quick else "")

    @property
    def complete(self) -> bool:
        return len(self.records) == self.planned
