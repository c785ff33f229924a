"""A module that exits while it is imported (tests/privacy/test_views_reliability.py)."""

import sys

sys.exit(0)


def data():  # never reached
    return None
