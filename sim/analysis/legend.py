"""A light legend for the run figures: a frame, one sample and one text per entry, an optional title.

Matplotlib's legend packs every entry in nested offset boxes and lays them out twice per draw (once to size
the frame, once to draw), measuring each text again each time: about a tenth of a run figure's plotting
time. :class:`RunLegend` measures each text once per draw and places everything by matplotlib's legend
settings (``legend.borderpad``, ``labelspacing``, ``handlelength``, ``handleheight``, ``handletextpad``,
``borderaxespad``, the frame's colours, alpha and rounded corners), its upper left corner where
``loc="upper left", bbox_to_anchor=anchor`` puts matplotlib's. It looks like matplotlib's legend, and is
not pixel-identical to it (a sample sits level with the middle of its label's first line).

Samples by the kind of artist drawn: a line (its colour, style, width and marker; one marker in the middle
when it has no line), a scatter (one marker of its path, colours and edge, at the collection's median
area times ``markerscale`` squared), a filled area or a patch such as bars (a rectangle of its face, edge
and alpha).
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.collections import Collection, PathCollection
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox, IdentityTransform, Transform


class RunLegend(Artist):
    """Entries ``(artist, label)`` (a label may span lines) with an optional ``title``, its upper left corner
    ``legend.borderaxespad`` font sizes right of and below ``anchor`` (in ``transform``'s coordinates).
    Not clipped: it lies beside the axes. ``get_texts`` and ``get_window_extent`` answer as a
    matplotlib legend's do."""

    def __init__(
        self,
        entries: Sequence[tuple[Artist, str]],
        anchor: tuple[float, float],
        transform: Transform,
        *,
        fontsize: float = 8.0,
        title: str | None = None,
        title_fontsize: float | None = None,
        markerscale: float = 1.0,
    ) -> None:
        super().__init__()
        rc: Any = matplotlib.rcParams
        self.set_zorder(5)  # matplotlib's legend's
        self.entries = list(entries)
        self.anchor = anchor
        self.anchor_transform = transform
        self.fontsize = fontsize
        self.markerscale = markerscale
        pixels = IdentityTransform()
        self._texts = [Text(0, 0, label, fontsize=fontsize, va="top", transform=pixels) for _, label in entries]
        self._line = Text(0, 0, "lp", fontsize=fontsize, va="top", transform=pixels)  # one line's height
        self._title = (
            Text(0, 0, title, fontsize=title_fontsize or fontsize, va="top", ha="center", transform=pixels)
            if title
            else None
        )
        face = rc["legend.facecolor"]
        self._frame = FancyBboxPatch(
            (0, 0),
            1,
            1,
            boxstyle="round,pad=0,rounding_size=0.2",
            mutation_scale=fontsize,
            facecolor=rc["axes.facecolor"] if face == "inherit" else face,
            edgecolor=rc["legend.edgecolor"],
            alpha=rc["legend.framealpha"],
            linewidth=rc["legend.linewidth"] or rc["patch.linewidth"],
            snap=True,
            transform=pixels,
        )

    def _parts(self) -> list[Artist]:
        return [self._frame, self._line, *self._texts, *([self._title] if self._title else [])]

    def set_figure(self, fig: Any) -> None:
        super().set_figure(fig)
        for part in self._parts():
            part.set_figure(fig)

    def set_clip_path(self, path: Any, transform: Any = None) -> None:
        """Never clipped (``Axes.add_artist`` would clip it to the axes it lies beside)."""

    def get_texts(self) -> list[Text]:
        """The entries' texts, in order."""
        return list(self._texts)

    def _layout(self, renderer: Any) -> tuple[Bbox, list[Bbox], float]:
        """The frame, each entry's text box and one line's height, in pixels (each text measured once)."""
        rc: Any = matplotlib.rcParams
        fs = renderer.points_to_pixels(self.fontsize)
        pad, spacing = rc["legend.borderpad"] * fs, rc["legend.labelspacing"] * fs
        handle_w, handle_h = rc["legend.handlelength"] * fs, rc["legend.handleheight"] * fs
        text_x = rc["legend.handletextpad"] * fs + handle_w
        x, y = self.anchor_transform.transform(self.anchor)
        left, top = x + rc["legend.borderaxespad"] * fs, y - rc["legend.borderaxespad"] * fs
        y, width = top - pad, 0.0
        if self._title is not None:
            box = self._title.get_window_extent(renderer)
            width, y = box.width, y - box.height - spacing
        boxes = []
        for text in self._texts:
            box = text.get_window_extent(renderer)
            boxes.append(Bbox.from_bounds(left + pad + text_x, y - box.height, box.width, box.height))
            width = max(width, text_x + box.width)
            y -= max(box.height, handle_h) + spacing
        frame = Bbox.from_extents(left, y + spacing - pad, left + width + 2 * pad, top)
        return frame, boxes, self._line.get_window_extent(renderer).height

    def get_window_extent(self, renderer: Any = None) -> Bbox:
        fig: Any = self.get_figure(root=True)
        assert fig is not None, "a legend is measured once it is in a figure"
        return self._layout(renderer if renderer is not None else fig._get_renderer())[0]

    def draw(self, renderer: Any) -> None:
        if not self.get_visible():
            return
        rc: Any = matplotlib.rcParams
        fs = renderer.points_to_pixels(self.fontsize)
        frame, boxes, line = self._layout(renderer)
        fig = self.get_figure(root=False)
        assert fig is not None
        self._frame.set_bounds(frame.x0, frame.y0, frame.width, frame.height)
        self._frame.draw(renderer)
        if self._title is not None:
            self._title.set_position(((frame.x0 + frame.x1) / 2, frame.y1 - rc["legend.borderpad"] * fs))
            self._title.draw(renderer)
        handle_w, handle_h = rc["legend.handlelength"] * fs, rc["legend.handleheight"] * fs
        for (handle, _), text, box in zip(self.entries, self._texts, boxes):
            text.set_position((box.x0, box.y1))
            text.draw(renderer)
            start = box.x0 - rc["legend.handletextpad"] * fs - handle_w
            for sample in _samples(handle, start, box.y1 - line / 2, handle_w, handle_h, self.markerscale):
                sample.set_figure(fig)
                sample.draw(renderer)
        self.stale = False


def _samples(handle: Artist, x: float, middle: float, width: float, height: float, markerscale: float) -> list[Artist]:
    """What stands for ``handle`` in a ``width`` x ``height`` slot from ``x``, centred on ``middle``
    (pixels)."""
    pixels = IdentityTransform()
    if isinstance(handle, Line2D):
        lined = handle.get_linestyle() not in ("None", "none", "", " ")
        xs = [x, x + width] if lined else [x + width / 2]
        return [
            Line2D(
                xs,
                [middle] * len(xs),
                color=handle.get_color(),
                linestyle=handle.get_linestyle(),
                linewidth=handle.get_linewidth(),
                marker=handle.get_marker(),
                markersize=handle.get_markersize() * markerscale,
                markeredgewidth=handle.get_markeredgewidth(),
                alpha=handle.get_alpha(),
                transform=pixels,
            )
        ]
    if isinstance(handle, PathCollection):
        sizes = handle.get_sizes()
        sample = PathCollection(
            handle.get_paths()[:1],
            sizes=[float(np.median(sizes)) * markerscale**2 if len(sizes) else 36.0],
            offsets=[(x + width / 2, middle)],
            offset_transform=pixels,
            facecolors=handle.get_facecolor()[:1],
            edgecolors=handle.get_edgecolor()[:1],
            linewidths=np.atleast_1d(handle.get_linewidth())[:1],
            alpha=handle.get_alpha(),
        )
        sample.set_transform(IdentityTransform())
        return [sample]
    if isinstance(handle, (Patch, Collection)):
        if isinstance(handle, Collection):
            faces, edges = handle.get_facecolor(), handle.get_edgecolor()
            widths = np.atleast_1d(handle.get_linewidth())
            face = faces[0] if len(faces) else "none"
            edge = edges[0] if len(edges) else "none"
            linewidth = float(widths[0]) if len(widths) else 0.0
        else:
            face, edge, linewidth = handle.get_facecolor(), handle.get_edgecolor(), handle.get_linewidth()
        return [
            Rectangle(
                (x, middle - height / 2),
                width,
                height,
                facecolor=face,
                edgecolor=edge,
                linewidth=linewidth,
                alpha=handle.get_alpha(),
                transform=pixels,
            )
        ]
    return []
