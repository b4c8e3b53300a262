"""Agg text for hybridsim's PNGs, laid out and rendered once per figure set.

Matplotlib 3.11's Agg renderer shapes every string twice (once to measure it, once to draw it), looks its
font up again each time, and renders a glyph at a time, rebuilding the glyph's transform for each: text
was most of a run figure's drawing time. :class:`TextCache` keeps, for the figures drawn while it is
current (:func:`shared_text`: one ``plot_all``), each string's layout per font and size (shaped once, for
its measure and its drawing), each font lookup, each glyph's metrics and each rendered glyph bitmap per
sub-pixel offset; :class:`CachedTextCanvas` draws with it.

Invariant: the pixels are matplotlib's own. A string measures what ``FT2Font.set_text`` gives (the same
glyph positions, advances and hinted control boxes); a glyph is rendered by FreeType exactly as matplotlib
renders it (same size, transform, load flags and render mode); a cached bitmap is reused only at the same
1/64 pixel phase, shifted by whole pixels, which is where FreeType would have put it (the outline is moved
by whole pixels). ``tests/analysis/test_plots.py`` compares the PNGs with ``savefig``'s. A cache assumes the
rc font settings (families, hinting) stay as they are while it is current.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.font_manager import fontManager, get_font
from matplotlib.ft2font import RenderMode


class TextCache:
    """What text drawing learns, kept across figures: font per font properties, layout per string (its
    measure and its drawing share it), metrics per glyph (control box, advance), bitmap per glyph and
    sub-pixel phase, line heights per font and size. Holds references to the FreeType fonts it used
    (keys), so an entry never outlives its font."""

    def __init__(self) -> None:
        self.fonts: dict[int, Any] = {}
        self.metrics: dict[tuple, tuple[int, int, int]] = {}
        self.layouts: dict[tuple, list[tuple[Any, int, float, float]]] = {}
        self.glyphs: dict[tuple, tuple[Any, int, int]] = {}
        self.heights: dict[tuple, tuple[float | None, float | None, float | None]] = {}


_CURRENT: ContextVar[TextCache | None] = ContextVar("hybridsim_text_cache", default=None)


@contextmanager
def shared_text() -> Iterator[TextCache]:
    """Figures saved inside share one :class:`TextCache` (a figure saved outside gets its own); inside
    another ``shared_text`` block, the enclosing one's."""
    cache = _CURRENT.get() or TextCache()
    token = _CURRENT.set(cache)
    try:
        yield cache
    finally:
        _CURRENT.reset(token)


class CachedTextRenderer(RendererAgg):
    """:class:`RendererAgg` drawing and measuring plain text through a :class:`TextCache`; math text and
    everything else is matplotlib's."""

    def __init__(self, width: float, height: float, dpi: float, cache: TextCache) -> None:
        super().__init__(width, height, dpi)
        self._cache = cache

    def _font_files(self, font_prop: Any) -> Any:
        # FontProperties compare by hash (matplotlib's own text-metrics cache keys them so).
        key = hash(font_prop)
        files = self._cache.fonts.get(key)
        if files is None:
            files = self._cache.fonts[key] = fontManager._find_fonts_by_props(font_prop)
        return files

    def _prepare_font(self, font_prop: Any) -> Any:
        font = get_font(self._font_files(font_prop))
        font.clear()
        font.set_size(font_prop.get_size_in_points(), self.dpi)
        return font

    def _get_font_height_metrics(self, prop: Any) -> tuple[float | None, float | None, float | None]:
        """The font's ascent, descent and line gap at its size (``Text._get_layout`` asks the renderer
        first): matplotlib's own reading of the font's ``OS/2`` table, else ``hhea``, once per font and
        size instead of a font lookup for every text laid out."""
        key = (hash(prop), self.dpi)
        heights = self._cache.heights.get(key)
        if heights is None:
            heights = self._cache.heights[key] = self._font_heights(prop)
        return heights

    def _font_heights(self, prop: Any) -> tuple[float | None, float | None, float | None]:
        font: Any = get_font(self._font_files(prop))  # its tables read by name, as matplotlib reads them
        for table_name, gap_key, ascent_key, descent_key in (
            ("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
            ("hhea", "lineGap", "ascent", "descent"),
        ):
            table = font.get_sfnt_table(table_name)
            if table is None:
                continue
            scale = 1 / font.get_sfnt_table("head")["unitsPerEm"] * prop.get_size_in_points() * self.dpi / 72
            return table[ascent_key] * scale, -table[descent_key] * scale, table[gap_key] * scale
        return None, None, None

    def _layout(self, s: str, prop: Any, flags: Any, features: Any, language: Any) -> list[tuple]:
        """``s`` shaped in ``prop``'s font: (FreeType font, glyph index, x, y) per glyph, pixels."""
        key = (s, hash(prop), self.dpi, flags, features if features is None else tuple(features), language)
        items = self._cache.layouts.get(key)
        if items is None:
            font = self._prepare_font(prop)
            items = self._cache.layouts[key] = [
                (item.ft_object, item.glyph_index, item.x, item.y)
                for item in font._layout(s, flags=flags, features=features, language=language)
            ]
        return items

    def get_text_width_height_descent(self, s: str, prop: Any, ismath: Any) -> tuple[float, float, float]:
        """FreeType's measure of ``s`` (``FT2Font.set_text``'s), from the layout drawing uses and each glyph's
        metrics: across, from the first pen position to the furthest pen position plus advance; up and
        down, the union of the glyphs' control boxes (hinted, in 1/64 pixel) at their pen positions."""
        if ismath or not s:
            return super().get_text_width_height_descent(s, prop, ismath)
        flags = get_hinting_flag()
        size = prop.get_size_in_points()
        x0 = y0 = 1 << 62
        x1 = y1 = -(1 << 62)
        metrics, dpi = self._cache.metrics, self.dpi
        sized: set[Any] = set()
        for font, index, x, y in self._layout(s, prop, flags, None, None):
            key = (font, size, dpi, index, flags)
            glyph = metrics.get(key)
            if glyph is None:
                if font not in sized:  # sizing also clears a transform left by drawing
                    font.set_size(size, dpi)
                    sized.add(font)
                loaded = font.load_glyph(index, flags)
                glyph = metrics[key] = (loaded.bbox[1], loaded.bbox[3], loaded.horiAdvance)
            low, high, advance = glyph
            px, py = round(x * 64), round(y * 64)
            x0, x1 = min(x0, px), max(x1, px + advance)
            y0, y1 = min(y0, py + low), max(y1, py + high)
        return (x1 - x0) / 64, (y1 - y0) / 64, -y0 / 64

    def draw_text(
        self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False, mtext: Any = None
    ) -> None:
        if ismath:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        flags = get_hinting_flag()
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        items = self._layout(s, prop, flags, features, language)
        self._draw_glyphs(gc, x, y, angle, prop.get_size_in_points(), flags, items)
        return None

    def _draw_glyphs(
        self, gc: Any, x: float, y: float, angle: float, size: float, flags: Any, items: list[tuple]
    ) -> None:
        """Matplotlib's glyph loop (``RendererAgg._draw_text_glyphs_and_boxes`` for plain text: no slant,
        no stretch, no boxes), each glyph's bitmap taken from the cache when rendered before at the same
        sub-pixel phase. A font is sized once per string, not before each glyph: FreeType redoes a font's
        hinting set-up for the first glyph after each sizing (about 24 us of a glyph's 37)."""
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        matrix = (0x10000 * np.array([[cos, -sin], [sin, cos]]) @ [[1, 0], [0, 1]]).round().astype(int)
        matrix_key = tuple(matrix.ravel().tolist())
        antialiased = bool(gc.get_antialiased())
        mode = RenderMode.NORMAL if antialiased else RenderMode.MONO
        glyphs, height, dpi = self._cache.glyphs, self.height, self.dpi
        draw = self._renderer.draw_text_image
        sized: set[Any] = set()
        for font, index, dx, dy in items:  # dy is upwards
            px = round(0x40 * (x + dx * cos - dy * sin))
            py = round(0x40 * (height - y + dx * sin + dy * cos))  # FreeType's y is upwards
            key = (font, size, dpi, index, matrix_key, px & 63, py & 63, flags, antialiased)
            hit = glyphs.get(key)
            if hit is None:
                if font not in sized:
                    font.set_size(size, dpi)
                    sized.add(font)
                font._set_transform(matrix, [px, py])
                bitmap = font._render_glyph(index, flags, mode)
                buffer = bitmap.buffer
                if not antialiased:
                    buffer *= 0xFF
                hit = glyphs[key] = (buffer, bitmap.left - (px >> 6), bitmap.top - (py >> 6))
            buffer, left, top = hit
            # draw_text_image's y is downwards and the bitmap's bottom side.
            draw(buffer, left + (px >> 6), int(height) - (top + (py >> 6)) + buffer.shape[0], 0, gc)


class CachedTextCanvas(FigureCanvasAgg):
    """An Agg canvas whose renderer is a :class:`CachedTextRenderer` on the current :class:`TextCache`
    (:func:`shared_text`), else on one of its own."""

    def __init__(self, figure: Any) -> None:
        super().__init__(figure)
        self._text_cache = _CURRENT.get() or TextCache()

    def get_renderer(self) -> RendererAgg:
        w, h = self.get_width_height(physical=True)
        key: Any = (w, h, self.figure.dpi)
        if self._lastKey != key:
            self.renderer = CachedTextRenderer(w, h, self.figure.dpi, self._text_cache)
            self._lastKey = key
        return self.renderer
