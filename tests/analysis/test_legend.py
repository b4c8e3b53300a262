"""sim.analysis.legend.RunLegend: the run figures' light legend frames its title, texts and samples, beside
the axes it is anchored to."""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sim.analysis.legend import RunLegend


def test_every_entry_has_its_text_and_sample_inside_the_frame_beside_the_axes():
    fig = Figure(figsize=(7, 3), dpi=100)
    ax = fig.add_axes((0.1, 0.1, 0.45, 0.8))
    ax.plot([0, 1], [0, 1], color="#1f77b4", label="a line")
    ax.plot([0.5], [0.0], linestyle="none", marker="|", markersize=12, color="#d62728", label="ticks\n(one each)")
    ax.scatter([0, 1], [1, 0], s=[10, 40], marker="s", color="#2ca02c", label="dots")
    ax.fill_between([0, 1], [0, 0], [1, 1], color="#9467bd", alpha=0.35, label="a band")
    ax.stairs([1, 2], [0, 1, 2], fill=True, color="#ff7f0e", alpha=0.3, label="bars")
    entries = list(zip(*ax.get_legend_handles_labels()))
    legend = RunLegend(entries, (1.01, 1.0), ax.transAxes, title="things", markerscale=2.0)
    ax.add_artist(legend)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    frame = legend.get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    assert frame.x0 > axes_box.x1 and frame.y1 <= axes_box.y1 and frame.x1 <= fig.bbox.x1
    texts = [t.get_window_extent(renderer) for t in legend.get_texts()]
    assert [t.get_text() for t in legend.get_texts()] == [label for _, label in entries]
    tops = [box.y1 for box in texts]
    assert tops == sorted(tops, reverse=True) and len(set(tops)) == len(tops)  # one row each, in order
    height = pixels.shape[0]
    for (_handle, label), box in zip(entries, texts):
        assert frame.x0 < box.x0 and box.x1 < frame.x1 and frame.y0 < box.y0 and box.y1 < frame.y1, label
        # The sample: coloured pixels between the frame's left edge and the text, level with the text's top line.
        rows = slice(int(height - box.y1), int(height - box.y1 + 12))
        slot = pixels[rows, int(frame.x0) + 3 : int(box.x0) - 2]
        assert (np.abs(slot - 255).sum(axis=2) > 60).sum() >= 4, label
