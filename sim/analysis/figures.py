"""The one way hybridsim saves a figure (run plots, explain's block map, sweep and study figures).

Figures are built on :class:`matplotlib.figure.Figure` directly: no pyplot, no global backend switch, so
drawing never touches process-wide state (a notebook's backend stays the user's). Saving is deterministic:
the same figure gives the same bytes (no software or date metadata, a fixed SVG hash salt, paths for text).
The file is written by :func:`sim.trace.output.write_file` (no link followed, no foreign file replaced
without ``force``, atomic, stamped as hybridsim's).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
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
    fast zlib level and no row filters (:func:`encode_png`). ``force`` replaces a file hybridsim
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
    a white face: the alpha channel is all 255), else RGBA. The same pixels as ``savefig``; no software
    metadata."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    shown_dpi = fig.get_dpi()
    fig.set_dpi(dpi)
    try:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
    finally:
        fig.set_dpi(shown_dpi)
    buffer.write(encode_png(rgba[..., :3] if bool((rgba[..., 3] == 255).all()) else rgba, dpi))


#: zlib level of the PNGs: 3 gives files about as small as Pillow's level 1 with adaptive row filters.
PNG_ZLIB_LEVEL = 3


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(pixels: np.ndarray, dpi: int) -> bytes:
    """An 8-bit PNG of ``pixels`` (height x width x 3 for RGB, x 4 for RGBA, ``uint8``) with its resolution
    (``pHYs``) and nothing else. Every row is stored unfiltered (filter type 0) and deflated at
    :data:`PNG_ZLIB_LEVEL`: a plot is mostly runs of equal pixels, which deflate finds without a filter,
    and choosing a filter per row was most of Pillow's encoding time. The same pixels give the same bytes."""
    height, width, channels = pixels.shape
    if pixels.dtype != np.uint8 or channels not in (3, 4):
        raise ValueError(f"encode_png takes uint8 RGB or RGBA pixels, got {pixels.dtype} x {channels}")
    rows = np.empty((height, width * channels + 1), dtype=np.uint8)
    rows[:, 0] = 0  # filter type: none
    rows[:, 1:].reshape(height, width, channels, copy=False)[...] = pixels  # one copy, strided input too
    per_metre = round(dpi / 0.0254)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 6, 0, 0, 0)),
            _chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
            _chunk(b"IDAT", zlib.compress(rows.data, PNG_ZLIB_LEVEL)),
            _chunk(b"IEND", b""),
        )
    )
