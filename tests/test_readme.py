"""The README's library example runs as printed, and its claims about it hold."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_library_example_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## The library in 20 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 20
    result = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    values = eval(result.stdout.strip())  # a list of (consensus distance, bytes) per peer
    assert len(values) == 8 and len({v for v in values}) == 1
    distance, sent = values[0]
    assert 0 < distance < 1e3 and sent > 0


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
