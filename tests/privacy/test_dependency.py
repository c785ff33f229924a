"""`privacy.dependency`: Opacus imported on first use — a missing Opacus is the one-line install
hint, and importing the package imports no Opacus."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gossip_powersgd.privacy import MISSING_OPACUS, import_opacus, make_accountant


def test_missing_opacus_is_a_one_line_import_error(monkeypatch):
    # "opacus" blocked whether or not another test imported it already, and every submodule
    # imported so far (an entry of sys.modules is returned without looking at its parent)
    for name in ["opacus"] + [n for n in sys.modules if n.startswith("opacus.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError) as info:
        import_opacus("opacus.accountants")
    assert str(info.value) == MISSING_OPACUS
    with pytest.raises(ImportError, match="pip install 'gossip_powersgd\\[privacy\\]'"):
        make_accountant("rdp")


def test_importing_the_package_does_not_import_opacus():
    code = (
        "import sys, gossip_powersgd.privacy; "
        "sys.exit(any(n.split('.')[0] == 'opacus' for n in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
