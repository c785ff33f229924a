"""experiments/pages/bench_startup.py: the verdict on when the first line comes under a launcher
(median over the launches, against the launcher alone and against `import torch`), and none where
a measurement is missing. The page end to end: tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

from experiments.pages.bench_startup import _verdict


def _launches(mark, *seconds):
    return [{"marks": {mark: s}} for s in seconds] + [{"marks": {}}]  # one launch without it


def test_the_first_line_is_placed_against_the_launcher_alone_and_import_torch():
    train, alone = _launches("start:", 0.4, 0.6, 0.5), _launches("line", 0.2, 0.1, 0.3)
    (line,) = _verdict("mpiexec -n 4", train, _launches("imported", 2.0, 1.0, 3.0), alone)
    assert line.startswith("- mpiexec -n 4: the first line comes 0.50 s after the launch")
    assert "(the launcher alone prints at 0.20 s)" in line
    assert line.endswith("before `import torch` ends in any process (2.00 s; 0.25x of it).")
    (late,) = _verdict("torchrun", _launches("start:", 3.0), _launches("imported", 2.0), alone)
    assert late.endswith("after `import torch` ends in the first process (2.00 s).")
    assert _verdict("torchrun", train, [], alone) == [] == _verdict("x", [], train, alone)
