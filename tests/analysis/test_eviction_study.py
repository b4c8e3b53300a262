"""The eviction study's table and figure (sim.analysis.eviction_study) from a tiny real sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.analysis import eviction_study as study
from sim.cli import app

pytestmark = pytest.mark.slow  # end-to-end: its fixture runs a real sweep (make test-fast skips it)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """golden-pressure at two pool sizes, lru vs group_coherent (step clock: a few seconds)."""
    out = tmp_path_factory.mktemp("sweeps") / "sweep-eviction-pressure"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            str(ROOT / "scenarios" / "golden-pressure.yaml"),
            "-j",
            "1",
            "-o",
            str(out),
            "--grid",
            "cache.num_blocks=300,400",
            "--grid",
            "cache.eviction_policy=lru,group_coherent",
            "--set",
            "outputs.ideal_hit_rate=true",
            "--set",
            "outputs.plots=false",
        ],
    )
    assert res.exit_code == 0, res.output
    return out


def test_table_has_every_run_with_ratios_against_lru(sweep_dir: Path) -> None:
    df = study.with_lru_ratios(study.load_sweep(sweep_dir))
    assert sorted(zip(df["pool"], df["policy"])) == [
        (300, "group_coherent"),
        (300, "lru"),
        (400, "group_coherent"),
        (400, "lru"),
    ]
    assert set(df["trace"]) == {"pressure"}
    lru = df[df["policy"] == "lru"]
    assert (lru["usable_vs_lru"] == 1.0).all() and (lru["ttft_p95_vs_lru"] == 1.0).all()
    assert ((df["usable"] <= df["fa_only"]) & (df["fa_only"] <= df["ideal"])).all()
    table = study.markdown_table(df)
    assert table.count("\n") == 1 + len(df) and "| pressure | 400 | group_coherent |" in table


def test_main_writes_the_figure_and_rejects_a_missing_sweep(sweep_dir: Path, tmp_path: Path, capsys) -> None:
    fig = tmp_path / "gap.png"
    assert study.main([str(sweep_dir), "--figure", str(fig)]) == 0
    assert fig.stat().st_size > 0 and "| trace |" in capsys.readouterr().out
    assert study.main([str(tmp_path / "nothing")]) == 2
    assert "no sweep.parquet" in capsys.readouterr().err
