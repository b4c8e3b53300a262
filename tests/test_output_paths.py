"""Every command that writes, against a planted symbolic link and a planted user file at its output path.

For each command: a link at the path it writes (pointing at a victim file) is refused in one line (exit 2)
and the victim is untouched; a file hybridsim did not write at that path is refused in one line (exit 2) and
kept byte for byte; with ``--force`` the command runs and the user's file is kept aside as ``<name>.old``.
The one writer behind all of them is ``sim.trace.output`` (tests/test_output_writers.py holds every module to
it); ``verify --table`` needs vLLM and is covered by the writer's own tests (a CSV: any existing file is
foreign).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from support.cli import CRASHING, invoke

#: End to end: runs scenarios (the bundles fixture, the refused commands' setup).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "tests" / "bad_input" / "base.yaml"


@dataclass(frozen=True)
class Case:
    """A command (``argv(work)``) and the path it writes (``target(work)``), under a fresh folder ``work``."""

    name: str
    argv: Callable[[Path], list]
    target: Callable[[Path], Path]
    force_runs: bool = False  # cheap enough to run with --force in the unit tier


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    crash = root / "crash.yaml"
    crash.write_text(CRASHING)
    assert invoke("run", BASE, "-o", root / "base", "-q").exit_code == 0
    assert invoke("run", BASE, "-o", root / "other", "--no-plots", "-q", "--seed", "3").exit_code == 0
    assert invoke("run", crash, "-o", root / "crash", "--no-plots", "-q").exit_code == 3
    return {"base": root / "base", "other": root / "other", "crash": root / "crash"}


def _copy(bundles: dict[str, Path], name: str, work: Path) -> Path:
    dest = work / name
    if not dest.exists():
        shutil.copytree(bundles[name], dest, symlinks=True)
    return dest


def cases(bundles: dict[str, Path]) -> list[Case]:
    return [
        Case("run", lambda w: ["run", BASE, "-o", w / "out", "--no-plots", "-q"], lambda w: w / "out" / "summary.json"),
        Case(
            "export vllm-test",
            lambda w: ["export", "vllm-test", bundles["crash"] / "scenario.resolved.yaml", "-o", w / "test_x.py"],
            lambda w: w / "test_x.py",
            force_runs=True,
        ),
        Case(
            "shrink", lambda w: ["shrink", bundles["crash"], "-o", w / "small.yaml", "-q"], lambda w: w / "small.yaml"
        ),
        Case(
            "replay --shrink",
            lambda w: ["replay", _copy(bundles, "crash", w) / "replay", "--shrink"],
            lambda w: _copy(bundles, "crash", w) / "replay" / "shrunk.yaml",
        ),
        Case(
            "compare -o",
            lambda w: ["compare", bundles["base"], bundles["other"], "-o", w / "cmp"],
            lambda w: w / "cmp" / "outcomes.png",
            force_runs=True,
        ),
        Case(
            "explain --plot",
            lambda w: ["explain", bundles["base"], "r0", "--plot", w / "map.png"],
            lambda w: w / "map.png",
            force_runs=True,
        ),
        Case("plot", lambda w: ["plot", _copy(bundles, "base", w)], lambda w: _copy(bundles, "base", w) / "plots"),
        Case(
            "timing fit -o",
            lambda w: [
                "timing",
                "fit",
                ROOT / "tests/data/profiles/a100",
                "--hardware",
                "a100-80g",
                "-o",
                w / "hw.yaml",
            ],
            lambda w: w / "hw.yaml",
        ),
        Case(
            "golden regenerate",
            lambda w: (
                ["golden", "regenerate", "--scenario", "taint-propagation", "--golden-dir", w / "golden"]
                + ["--scenarios-dir", ROOT / "scenarios"]
            ),
            lambda w: w / "golden" / "taint-propagation" / "kv_events.csv",
        ),
        Case(
            "sweep -o",
            lambda w: ["sweep", BASE, "--grid", "cache.num_blocks=50", "--executor", "serial", "-o", w / "sw"],
            lambda w: w / "sw" / "sweep.json",
        ),
        Case(
            "fuzz -o",
            lambda w: ["fuzz", "--count", "1", "-o", w / "fz"],
            lambda w: w / "fz" / "fuzz-0-0.yaml",
            force_runs=True,
        ),
        Case(
            "fuzz --e2e -o",
            lambda w: ["fuzz", "--e2e", "--count", "1", "--seed", "2", "-o", w / "fz"],
            lambda w: w / "fz" / "summary.json",
            force_runs=True,
        ),
        Case(
            "divergence-table --write",
            lambda w: ["divergence-table", "--write", w / "divergence.md"],
            lambda w: w / "divergence.md",
        ),
    ]


NAMES = [
    "run",
    "export vllm-test",
    "shrink",
    "replay --shrink",
    "compare -o",
    "explain --plot",
    "plot",
    "timing fit -o",
    "golden regenerate",
    "sweep -o",
    "fuzz -o",
    "fuzz --e2e -o",
    "divergence-table --write",
]


def _case(bundles: dict[str, Path], name: str) -> Case:
    [case] = [c for c in cases(bundles) if c.name == name]
    return case


def test_every_writing_command_is_enumerated(bundles) -> None:
    assert [c.name for c in cases(bundles)] == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_planted_link_is_refused_and_its_target_untouched(bundles, tmp_path: Path, name: str) -> None:
    case = _case(bundles, name)
    work = tmp_path / "work"
    work.mkdir()
    target = case.target(work)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    victim = tmp_path / "victim"
    if name == "plot":  # the plots folder of a bundle
        victim.mkdir()
        (victim / "keep.png").write_bytes(b"keep")
        target.symlink_to(victim, target_is_directory=True)
    else:
        victim.write_text("keep\n")
        target.symlink_to(victim)
    res = invoke(*case.argv(work))
    assert res.exit_code == 2, res.output
    assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.output, res.stderr
    assert "symbolic link" in res.stderr or "did not write" in res.stderr, res.stderr
    assert target.is_symlink()
    if victim.is_dir():
        assert [p.name for p in victim.iterdir()] == ["keep.png"]
    else:
        assert victim.read_text() == "keep\n"


@pytest.mark.parametrize("name", NAMES)
def test_a_planted_user_file_is_kept(bundles, tmp_path: Path, name: str) -> None:
    case = _case(bundles, name)
    work = tmp_path / "work"
    work.mkdir()
    target = case.target(work)
    if name == "plot":
        target = target / "mine.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"the user's own file\n")
    res = invoke(*case.argv(work))
    assert res.exit_code == 2, res.output
    assert len(res.stderr.splitlines()) == 1 and "did not write" in res.stderr, res.stderr
    assert target.read_bytes() == b"the user's own file\n"
    if not case.force_runs:
        return
    res = invoke(*case.argv(work), "--force")
    assert res.exit_code == 0, res.output
    assert target.with_name(target.name + ".old").read_bytes() == b"the user's own file\n"
    assert "warning:" in res.stderr + res.stdout and ".old" in res.stderr + res.stdout


def test_sweep_into_a_link_is_refused_in_one_line(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    res = invoke("sweep", BASE, "--grid", "cache.num_blocks=50", "--executor", "serial", "-o", tmp_path / "link")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and "symbolic link" in res.stderr, res.output
    assert list(real.iterdir()) == []


def test_a_read_only_file_system_under_sweep_is_one_line(tmp_path: Path, monkeypatch) -> None:
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "mkdir", read_only)
    res = invoke("sweep", BASE, "--grid", "cache.num_blocks=50", "--executor", "serial", "-o", tmp_path / "ro" / "sw")
    assert res.exit_code == 1, res.output
    assert res.stderr.startswith("error: cannot write") and "Read-only file system" in res.stderr
    assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.output
