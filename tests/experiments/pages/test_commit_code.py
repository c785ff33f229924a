"""experiments/pages/_commit_code.py: an earlier commit's modules imported under private names
point at one another: their relative imports of the loaded modules are rewritten, the others kept.
Loading a real commit (git show, import): the bench pages' `before` tests
(tests/experiments/pages/bench_gossip/test_bench_gossip.py)."""

from __future__ import annotations

from experiments.pages._commit_code import _relative_imports, _rewire, _suffix

SOURCE = """from .powergossip_layout import Layout
from .base import GossipAlgorithm
from . import powergossip_plan as plan
from . import registry
x = 1  # from .elsewhere import nothing (a comment is text too)
"""


def test_relative_imports_of_loaded_modules_point_at_their_private_names():
    assert _relative_imports(SOURCE) == {
        "powergossip_layout",
        "base",
        "powergossip_plan",
        "registry",
        "elsewhere",
    }
    loaded = {"powergossip_layout", "powergossip_plan"}
    out = _rewire(SOURCE, loaded, "abc123").splitlines()
    assert out[0] == "from ._powergossip_layout_abc123 import Layout"
    assert out[1] == "from .base import GossipAlgorithm"  # not loaded: this tree's
    assert out[2] == "from . import _powergossip_plan_abc123 as plan"
    assert out[3] == "from . import registry"


def test_a_commits_names_differ_with_the_helpers_it_uses():
    assert _suffix("abc1234", True) == "abc1234" and _suffix("abc1234", False) == "abc1234_tree"
    assert _suffix("v1.0~2", True) == "v1_0_2"  # a name Python can import
