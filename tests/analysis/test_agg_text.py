"""sim.analysis.agg_text measures text as matplotlib's Agg renderer does (the run figures' PNGs place
every label from these measures: tests/analysis/test_plots.py compares their pixels with savefig's)."""

import random

import pytest
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.font_manager import FontProperties

from sim.analysis.agg_text import CachedTextRenderer, TextCache


def _strings() -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;()–-%/∝≤−×'_[]"
    made = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(60)]
    # kerning pairs, ligatures, descenders, a leading and trailing space, the figures' own strings
    return ["AV", "To", "ffi", "lp", "j", " a ", "−0.5", "0.0075", "outcome (area ∝ count)", "g0–g5 mamba", *made]


@pytest.mark.parametrize("dpi", [72, 100])
@pytest.mark.parametrize(
    "prop", [FontProperties(size=10), FontProperties(size=8, weight="bold"), FontProperties(family="serif", size=12.5)]
)
def test_measure_is_matplotlib_s(dpi, prop):
    ours, theirs = CachedTextRenderer(50, 50, dpi, TextCache()), RendererAgg(50, 50, dpi)
    for s in _strings():
        assert ours.get_text_width_height_descent(s, prop, False) == theirs.get_text_width_height_descent(
            s, prop, False
        ), s
    assert ours.get_text_width_height_descent("", prop, False) == theirs.get_text_width_height_descent("", prop, False)


def test_one_cache_serves_several_renderers_and_sizes():
    """A layout and a glyph's metrics are kept per font size and dpi: the second renderer (another dpi)
    and the second size measure what matplotlib measures, not the first one's numbers."""
    cache = TextCache()
    for dpi, size in ((100, 10), (72, 10), (100, 14)):
        prop = FontProperties(size=size)
        got = CachedTextRenderer(50, 50, dpi, cache).get_text_width_height_descent("Evictions 233", prop, False)
        assert got == RendererAgg(50, 50, dpi).get_text_width_height_descent("Evictions 233", prop, False)
    assert len(cache.layouts) == 3


@pytest.mark.parametrize("size", [8, 10, 12.5])
def test_text_layout_is_matplotlib_s(size):
    """A text laid out on the cached renderer (line heights from agg_text, measures from its layouts) has
    the boxes and line positions it has on matplotlib's: one line, several lines, rotated."""
    from matplotlib.figure import Figure

    fig = Figure(dpi=100)
    texts = [
        fig.text(0.1, 0.5, "blocks in use", fontsize=size),
        fig.text(0.5, 0.5, "evictions: cache entries removed\n(bars: per 0.996 s, peak at 40% height)", fontsize=size),
        fig.text(0.2, 0.2, "blocks", fontsize=size, rotation=90, ha="center", va="center"),
    ]
    cache = TextCache()
    for text in texts:
        ours = text._get_layout(CachedTextRenderer(640, 480, 100, cache))
        theirs = text._get_layout(RendererAgg(640, 480, 100))
        assert ours[0].bounds == theirs[0].bounds and ours[1] == theirs[1] and ours[2] == theirs[2], text.get_text()
