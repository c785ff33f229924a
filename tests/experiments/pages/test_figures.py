"""experiments/pages/_figures.py: a figure as PNG bytes, closed afterwards, also when saving fails."""

from __future__ import annotations

import pytest

from experiments.pages._figures import png, pyplot


def test_a_figure_becomes_png_bytes_and_is_closed():
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    data = png(fig, dpi=50)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)
    assert png(plt.subplots()[0], tight=True)[:4] == b"\x89PNG"


def test_a_figure_that_cannot_be_saved_is_closed_all_the_same():
    plt = pyplot()
    fig, _ = plt.subplots()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    fig.savefig = broken
    with pytest.raises(OSError, match="disk full"):
        png(fig)
    assert not plt.fignum_exists(fig.number)
