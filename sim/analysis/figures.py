"""The one way hybridsim saves a figure (run plots, explain's block map, sweep and study figures).

Figures are built on :class:`matplotlib.figure.Figure` directly: no pyplot, no global backend switch, so
drawing never touches process-wide state (a notebook's backend stays the user's). Saving is deterministic:
the same figure gives the same bytes (no software or date metadata, a fixed SVG hash salt, paths for text).
The file is written by :func:`sim.trace.output.write_file` (no link followed, no foreign file replaced
without ``force``, atomic, stamped as hybridsim's).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

#: The formats a figure may be saved in (by the path's suffix).
PLOT_FORMATS = ("png", "svg")


def save_figure(
    fig: Figure,
    path: str | Path,
    *,
    dpi: int = 100,
    tight: bool = False,
    force: bool = False,
    notes: list[str] | None = None,
) -> Path:
    """Save ``fig`` to ``path`` (format from the suffix: ``.png`` or ``.svg``), creating the folder.

    ``tight`` crops to the drawn content (it draws the figure twice: for small figures only). PNGs use a
    fast zlib level (compression was a third of the plotting time). ``force`` replaces a file hybridsim
    did not write (kept aside, a line in ``notes``)."""
    from sim.trace.output import write_file

    out = Path(path)
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"plot path {out} must end in one of {', '.join('.' + f for f in PLOT_FORMATS)}")
    buffer = io.BytesIO()
    if fmt == "png" and not tight:
        _write_png(fig, buffer, dpi)
    else:
        metadata = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
        extra: dict[str, Any] = {"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {}
        if tight:
            extra["bbox_inches"] = "tight"
        with matplotlib.rc_context({"svg.hashsalt": "hybridsim", "svg.fonttype": "path"}):
            fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata, **extra)
    write_file(out, buffer.getvalue(), force=force, notes=notes)
    return out


def _write_png(fig: Figure, buffer: io.BytesIO, dpi: int) -> None:
    """``fig`` rendered by Agg at ``dpi`` and encoded as an RGB PNG when it is opaque (every figure here has
    a white face: the alpha channel is all 255, a quarter of the bytes the encoder filters), else RGBA.
    The same pixels as ``savefig``; no software metadata."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    shown_dpi = fig.get_dpi()
    fig.set_dpi(dpi)
    try:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
    finally:
        fig.set_dpi(shown_dpi)
    pixels = rgba[..., :3] if bool((rgba[..., 3] == 255).all()) else rgba
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="png", compress_level=1, dpi=(dpi, dpi))
