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
from weakref import WeakKeyDictionary

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.axis import Axis, XAxis, YAxis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import TICKDOWN, TICKLEFT, MarkerStyle
from matplotlib.text import Text
from matplotlib.ticker import NullFormatter, NullLocator
from matplotlib.transforms import Bbox, ScaledTranslation

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
    metadata; the figure keeps its canvas. Text goes through :mod:`sim.analysis.agg_text` (shared across the figures of a
    :func:`~sim.analysis.agg_text.shared_text` block)."""
    from sim.analysis.agg_text import CachedTextCanvas

    shown_dpi, shown_canvas = fig.get_dpi(), fig.canvas
    fig.set_dpi(dpi)
    try:
        canvas = CachedTextCanvas(fig)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
    finally:
        fig.set_dpi(shown_dpi)
        fig.set_canvas(shown_canvas)  # the figure keeps no reference to the text cache
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
    pixel_rows = rows[:, 1:].reshape(height, width, channels, copy=False)
    for channel in range(channels):  # a plane at a time: 4x faster than copying 3-byte pixels from RGBA
        pixel_rows[..., channel] = pixels[..., channel]
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


# ---------------------------------------------------------------- ticks as three artists per axis

#: Grid lines asked for with :func:`grid`, by axis: their alpha.
_GRIDS: "WeakKeyDictionary[Axis, float]" = WeakKeyDictionary()


def grid(ax: Axes, axis: str = "both", alpha: float = 0.3) -> None:
    """Grid lines at ``ax``'s major ticks (``axis``: ``"x"``, ``"y"`` or ``"both"``), drawn by
    :func:`draw_ticks_once` with the ticks. The same lines as ``ax.grid(axis=axis, alpha=alpha)``, without
    updating matplotlib's tick objects (about 1 ms an axes)."""
    for name, which in (("x", ax.xaxis), ("y", ax.yaxis)):
        if axis in (name, "both"):
            _GRIDS[which] = alpha


class _TicksOnDemand:
    """An axis that builds no tick until one is drawn. Matplotlib builds a first major and minor tick for
    every axis when the axes is made and again when it is cleared (to give them the clip path), about 2 ms
    an axes; the run figures draw their ticks with :class:`AxisMarks` and never use them. A tick built
    later (an axis left to matplotlib) gets the same parameters (the axis keeps them for new ticks) and the
    same clip path."""

    axes: Any
    majorTicks: list[Any]
    minorTicks: list[Any]

    def reset_ticks(self) -> None:
        self.majorTicks = []
        self.minorTicks = []
        patch = getattr(self.axes, "patch", None)
        if patch is not None:
            self.set_clip_path(patch)  # type: ignore[attr-defined]

    def _get_tick(self, major: bool) -> Any:
        tick = super()._get_tick(major)  # type: ignore[misc]
        patch = getattr(self.axes, "patch", None)
        if patch is not None:
            tick.set_clip_path(patch)
        return tick


class _XAxis(_TicksOnDemand, XAxis):
    pass


class _YAxis(_TicksOnDemand, YAxis):
    pass


class RunAxes(Axes):
    """The axes of the run figures (``sim.analysis.plots``): matplotlib's, with axes that build their
    ticks only when drawn (:class:`_TicksOnDemand`)."""

    def clear(self) -> None:
        super().clear()
        # Building a tick places the spines (their default position, and the transform from it); with
        # no tick built, place them here, or the top and right spines are drawn in data coordinates.
        for spine in self.spines.values():
            spine.get_position()

    def _init_axis(self) -> None:
        self.xaxis = _XAxis(self, clear=False)
        self.spines.bottom.register_axis(self.xaxis)
        self.spines.top.register_axis(self.xaxis)
        self.yaxis = _YAxis(self, clear=False)
        self.spines.left.register_axis(self.yaxis)
        self.spines.right.register_axis(self.yaxis)


#: Characters no taller than "l" and no deeper than "p" (matplotlib's line height of a one-line text).
_SHORT_GLYPHS = frozenset("0123456789.,+-\u2212 ")


class AxisMarks(Artist):
    """One axis' major ticks drawn as three artists: the grid lines and the tick marks as one line each
    (segments broken by NaN), and the labels by one text moved from label to label. Matplotlib draws a
    tick as five artists of its own (two marks, a grid line, two labels: about 1.4 ms a tick with its
    label), builds them at draw time and measures every label again to place the axis label: most of a
    run figure's drawing time. The pixels are matplotlib's (the same lines, marks, text and axis label
    position; tests/analysis/test_plots.py compares them).

    Made by :func:`draw_ticks_once` from the axis' locator and formatter once the figure is complete;
    the axis itself is left without ticks (its label stays matplotlib's, placed here). ``locs`` and
    ``labels`` are what the axis shows (``labels`` empty when they are off, as on the upper panels of a
    shared x axis)."""

    def __init__(
        self, ax: Axes, name: str, locs: list[float], labels: list[str], grid_alpha: float | None, marks: bool
    ) -> None:
        super().__init__()
        axis = ax.xaxis if name == "x" else ax.yaxis
        self.set_zorder(axis.get_zorder())
        self.axis_name = name
        self.locs = locs
        self.labels = labels
        self._axis = axis
        self._ax = ax
        fig = ax.get_figure(root=False)
        assert fig is not None
        rc: Any = matplotlib.rcParams  # keys built from the axis name
        size, pad = rc[f"{name}tick.major.size"], rc[f"{name}tick.major.pad"]
        colour = rc[f"{name}tick.color"]
        to_axis = ax.get_xaxis_transform if name == "x" else ax.get_yaxis_transform
        at = np.asarray(locs, dtype=float)
        self._parts: list[Artist] = []
        if grid_alpha is not None and len(at):
            along = np.repeat(at, 3)
            across = np.tile([0.0, 1.0, np.nan], len(at))
            line = Line2D(
                *((along, across) if name == "x" else (across, along)),
                color=rc["grid.color"],
                linewidth=rc["grid.linewidth"],
                linestyle=rc["grid.linestyle"],
                alpha=grid_alpha,
                transform=to_axis("grid"),
            )
            line.set_clip_path(ax.patch)
            self._parts.append(line)
        if marks and len(at):
            zero = np.zeros(len(at))
            self._parts.append(
                Line2D(
                    *((at, zero) if name == "x" else (zero, at)),
                    linestyle="none",
                    marker=MarkerStyle(TICKDOWN if name == "x" else TICKLEFT),
                    markersize=size,
                    markeredgewidth=rc[f"{name}tick.major.width"],
                    color=colour,
                    transform=to_axis("tick1"),
                    clip_on=False,
                )
            )
        gap = size + pad  # matplotlib keeps the marks' room with the marks off too
        shift = (
            ScaledTranslation(0, -gap / 72, fig.dpi_scale_trans)
            if name == "x"
            else ScaledTranslation(-gap / 72, 0, fig.dpi_scale_trans)
        )
        label_colour = rc[f"{name}tick.labelcolor"]
        self._text = Text(
            0.0,
            0.0,
            "",
            fontsize=rc[f"{name}tick.labelsize"],
            color=colour if label_colour == "inherit" else label_colour,
            transform=to_axis("tick1") + shift,
            horizontalalignment=rc["xtick.alignment"] if name == "x" else "right",
            verticalalignment="top" if name == "x" else rc["ytick.alignment"],
        )
        for part in (*self._parts, self._text):
            part.set_figure(fig)

    def set_clip_path(self, path: Any, transform: Any = None) -> None:
        """Not clipped as a whole (``Axes.add_artist`` would build a clip path for nothing): the grid line
        clips itself to the axes, the marks and labels lie outside it."""

    def draw(self, renderer: Any) -> None:
        if not self.get_visible():
            return
        for part in self._parts:
            part.draw(renderer)
        boxes: list[Bbox] = []
        text = self._text
        for loc, label in zip(self.locs, self.labels):
            if not label:
                continue
            text.set_text(label)
            text.set_position((loc, 0.0) if self.axis_name == "x" else (0.0, loc))
            text.draw(renderer)
            if self.axis_name == "y" or not boxes or not set(label) <= _SHORT_GLYPHS:
                # Only the bottom of the x labels matters: one-line labels of digits are all as tall.
                boxes.append(text.get_window_extent(renderer))
        self._place_axis_label(renderer, boxes)
        self.stale = False

    def _place_axis_label(self, renderer: Any, boxes: list[Bbox]) -> None:
        """Where matplotlib puts the axis label: ``labelpad`` points beyond the tick labels and the spine."""
        axis, ax = self._axis, self._ax
        label = axis.label
        if not label.get_text() or axis.get_label_position() not in ("bottom", "left"):
            return
        spine = ax.spines.get("bottom" if self.axis_name == "x" else "left", ax)
        box = Bbox.union([*boxes, spine.get_window_extent(renderer)])
        fig = ax.get_figure(root=True)
        assert fig is not None
        gap = axis.labelpad * fig.dpi / 72
        x, y = label.get_position()
        if self.axis_name == "x":
            axis.set_label_coords(x, box.y0 - gap, transform=label.get_transform())
        else:
            axis.set_label_coords(box.x0 - gap, y, transform=label.get_transform())


def draw_ticks_once(fig: Figure) -> None:
    """Replace the major ticks of every linear, ticked axis of ``fig`` by one :class:`AxisMarks` (the same
    locations, labels, grid lines and marks, from the axis' own locator and formatter) and its minor ticks
    by none (none are shown on a linear axis); call it when the figure is complete (view limits final).
    An axis matplotlib would draw otherwise keeps matplotlib's ticks (and its :func:`grid` lines): another
    scale, ticks not pointing out, minor ticks shown, ticks or labels on the other side, ticks restyled with
    ``tick_params``, matplotlib's own grid lines, a formatter offset (``1e6``)."""
    plans = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            plan = _tick_plan(ax, name, axis) if ax.axison else None
            if plan is not None:
                plans.append((ax, name, axis, plan))
            elif axis in _GRIDS:
                axis.grid(True, alpha=_GRIDS[axis])
    # Shared axes share their locator: read every axis before emptying any.
    for ax, name, axis, (locs, labels, marks) in plans:
        ax.add_artist(AxisMarks(ax, name, locs, labels, _GRIDS.get(axis), marks))
    for _ax, _name, axis, _ in plans:
        axis.set_major_locator(NullLocator())
        axis.set_major_formatter(NullFormatter())
        axis.set_minor_locator(NullLocator())


def _tick_plan(ax: Axes, name: str, axis: Axis) -> tuple[list[float], list[str], bool] | None:
    """What :class:`AxisMarks` would draw for ``axis`` (locations, labels, marks shown), or ``None`` where
    matplotlib's ticks must stay."""
    rc: Any = matplotlib.rcParams  # keys built from the axis name
    locator, formatter = axis.get_major_locator(), axis.get_major_formatter()
    if isinstance(locator, NullLocator) or not axis.get_visible():
        return None
    if axis.get_scale() != "linear" or rc[f"{name}tick.direction"] != "out" or rc[f"{name}tick.minor.visible"]:
        return None
    params = axis.get_tick_params(which="major")
    near, far = ("bottom", "top") if name == "x" else ("left", "right")
    if set(params) - {near, far, f"label{near}", f"label{far}", "gridOn"} or params.get(far):
        return None  # restyled ticks (tick_params), matplotlib's grid lines, ticks on the far side
    if params.get(f"label{far}") or params.get("gridOn"):
        return None
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-10 * (hi - lo)
    locs = [float(v) for v in locator() if lo - slack <= v <= hi + slack]
    labels = list(formatter.format_ticks(locs)) if params.get(f"label{near}", True) else []
    if hasattr(formatter, "get_offset") and formatter.get_offset():
        return None
    return locs, labels, bool(params.get(near, True))


def axis_ticks(ax: Axes, name: str) -> tuple[list[float], list[str]]:
    """The major tick locations and labels ``ax``'s ``"x"`` or ``"y"`` axis shows, whether drawn by
    :class:`AxisMarks` or by matplotlib (labels: the visible, non-empty ones)."""
    for artist in ax.artists:
        if isinstance(artist, AxisMarks) and artist.axis_name == name:
            return list(artist.locs), [s for s in artist.labels if s]
    axis = ax.xaxis if name == "x" else ax.yaxis
    shown = [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]
    return [float(v) for v in axis.get_majorticklocs()], [s for s in shown if s]
