"""Ownership by proof when a bundle replaces a folder: only what hybridsim can prove it wrote (listed in the
manifest with the hash it wrote, or a marked stage of a dead writer) is ever deleted; everything else found
there is kept aside in ``<target>.old`` and named in a note. Paths are spelled the same on both sides of every
comparison, so a linked parent folder works."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import invoke

import sim.trace.atomic as atomic
from sim.trace.atomic import STAGE_MARKER, check_bundle
from sim.trace.bundle import write_result

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "bad_input" / "base.yaml"


def bundle(out: Path, name: str = "a", notes: list[str] | None = None, **kwargs) -> Path:
    return write_result(out, scenario_yaml=f"name: {name}\n", summary={"name": name}, tables={}, notes=notes, **kwargs)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_file_added_between_the_last_check_and_the_swap_is_kept(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    bundle(out, "old")
    real_pause = atomic.pause_point

    def user_adds_a_file(point: str) -> None:
        if point == "swap":
            (out / "late.txt").write_text("mine\n")
        real_pause(point)

    monkeypatch.setattr(atomic, "pause_point", user_adds_a_file)
    notes: list[str] = []
    bundle(out, "new", notes)
    assert json.loads((out / "summary.json").read_text())["name"] == "new" and check_bundle(out).ok
    assert (tmp_path / "out.old" / "late.txt").read_text() == "mine\n"
    assert len(notes) == 1 and "late.txt" in notes[0] and str(tmp_path / "out.old") in notes[0]


def test_a_user_folder_named_like_a_stage_is_never_touched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    mine = [tmp_path / ".out.tmp-999999-mydata", tmp_path / f".out.tmp-{dead_pid()}-0123abcd"]
    for folder in mine:
        folder.mkdir()
        (folder / "data.csv").write_text("1,2\n")
    bundle(out)
    bundle(out)
    assert all((folder / "data.csv").read_text() == "1,2\n" for folder in mine)


def test_dead_stage_debris_is_cleaned_at_the_next_write_into_the_same_folder(tmp_path: Path) -> None:
    """A writer killed while writing to B leaves a marked stage: the next write to A next to it cleans it."""
    pid = dead_pid()
    debris = tmp_path / f".B.tmp-{pid}-0123abcd"
    debris.mkdir()
    (debris / STAGE_MARKER).write_text(json.dumps({"format": "hybridsim-stage", "kind": "stage", "pid": pid}))
    (debris / "kv_events.parquet").write_bytes(b"half a table")
    bundle(tmp_path / "A")
    assert not debris.exists()


def test_a_bundle_copied_inside_an_old_bundle_is_kept(tmp_path: Path) -> None:
    out, other = tmp_path / "out", tmp_path / "other"
    bundle(out)
    bundle(other, "precious")
    shutil.copytree(other, out / "kept-run")
    notes: list[str] = []
    bundle(out, "again", notes)
    assert not (out / "kept-run").exists() and check_bundle(out).ok
    copy = tmp_path / "out.old" / "kept-run"
    assert check_bundle(copy).ok and json.loads((copy / "summary.json").read_text())["name"] == "precious"
    assert notes and "kept-run/" in notes[0]


def test_an_edited_bundle_file_is_kept_aside_with_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    bundle(out)
    (out / "scenario.resolved.yaml").write_text("name: a\n# my annotation\n")
    res = invoke("run", BASE, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 0, res.output
    kept = tmp_path / "out.old" / "scenario.resolved.yaml"
    assert kept.read_text() == "name: a\n# my annotation\n"
    assert "warning:" in res.stderr and "scenario.resolved.yaml" in res.stderr and str(kept.parent) in res.stderr
    assert check_bundle(out).ok and not (tmp_path / "out.old" / "summary.json").exists()


def test_an_unedited_old_bundle_is_replaced_without_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    bundle(out)
    notes: list[str] = []
    bundle(out, "b", notes)
    assert notes == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_run_under_a_linked_parent_folder_keeps_its_bundle(tmp_path: Path) -> None:
    real = tmp_path / "data" / "results"
    real.mkdir(parents=True)
    (tmp_path / "results").symlink_to(real, target_is_directory=True)
    res = invoke("run", BASE, "-o", tmp_path / "results" / "demo", "-q")
    assert res.exit_code == 0, res.output
    assert check_bundle(real / "demo").ok and (real / "demo" / "plots").is_dir()
    assert sorted(p.name for p in real.iterdir()) == ["demo"]


@pytest.mark.parametrize("nested", [False, True])
def test_bundle_writes_through_a_linked_parent(tmp_path: Path, nested: bool) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    target = tmp_path / "link" / ("a/b" if nested else "b")
    bundle(target)
    bundle(target)
    assert check_bundle(real / ("a/b" if nested else "b")).ok
