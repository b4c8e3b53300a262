"""The figures the docs quote are what ``make docs-figures`` prints (sim/docs_figures.py).

The small figures are rerun here (the full suite, as in CI); the large ones (the Mooncake replays, minutes of
CPU and a trace outside the repository) only when ``HYBRIDSIM_DOCS_FIGURES=large`` is set.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from sim.docs_figures import FIGURES, generate, marked_regions, quoted, with_region

ROOT = Path(__file__).resolve().parents[1]


def test_every_marked_region_has_a_figure_and_every_figure_a_region():
    assert marked_regions(ROOT) == {f.name: f.page for f in FIGURES}


def test_a_region_is_rewritten_in_place_and_read_back():
    page = "intro\n<!-- figures:x -->\nold\n<!-- /figures:x -->\nafter <!-- figures:y -->\n<!-- /figures:y -->\n"
    new = with_region(page, "x", "| a |\n|---|\n| 1 |\n")
    assert (
        new
        == "intro\n<!-- figures:x -->\n| a |\n|---|\n| 1 |\n<!-- /figures:x -->\nafter <!-- figures:y -->\n<!-- /figures:y -->\n"
    )
    assert quoted(new, "x") == "| a |\n|---|\n| 1 |"
    assert quoted(with_region(new, "x", "two"), "x") == "two"
    assert quoted(new, "z") is None
    with pytest.raises(ValueError, match="no <!-- figures:z --> region"):
        with_region(new, "z", "")


def _copy(tmp_path: Path) -> Path:
    for page in {f.page for f in FIGURES}:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / page, tmp_path / page)
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    return tmp_path


@pytest.mark.slow  # runs the demo scenario twice, end to end
def test_the_small_figures_are_what_the_generator_prints_and_a_drifted_one_is_caught(tmp_path):
    outcome = generate(ROOT, check=True, large=False, log=lambda _: None)
    assert not outcome.stale, f"stale docs figures (run make docs-figures): {outcome.stale}"
    assert any(f.name == "demo" for f in FIGURES) and "demo" not in str(outcome.skipped)

    root = _copy(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    body = quoted(text, "demo")
    assert body is not None
    drift = re.sub(r"\d+\.\d\d %", "99.99 %", body, count=1)
    assert drift != body
    readme.write_text(with_region(text, "demo", drift), encoding="utf-8")
    drifted = generate(root, check=True, large=False, only=["demo"], log=lambda _: None)
    assert drifted.stale == ["README.md: figures:demo"]


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("HYBRIDSIM_DOCS_FIGURES") != "large", reason="large figures: set HYBRIDSIM_DOCS_FIGURES=large"
)
def test_the_large_figures_are_what_the_generator_prints():
    traces = os.environ.get("HYBRIDSIM_TRACES")
    outcome = generate(ROOT, check=True, large=True, traces=Path(traces) if traces else None, log=lambda _: None)
    assert not outcome.skipped, f"large figures skipped: {outcome.skipped}"
    assert not outcome.stale, f"stale docs figures (run make docs-figures DOCS_FIGURES=--large): {outcome.stale}"
