"""Figures for renderers: a matplotlib figure as PNG bytes (a renderer returns bytes, not files)."""

from __future__ import annotations


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig, dpi: int = 110, tight: bool = False) -> bytes:
    """`fig` as PNG bytes, closed afterwards (also when saving fails); `tight`: bbox_inches="tight"."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    finally:
        plt.close(fig)
    return buffer.getvalue()
