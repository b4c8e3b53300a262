"""What every hostile-input case must satisfy, and the pieces the cases are built from.

A command given hostile input either refuses it (exit 2, one ``error:`` line naming the file or key, no
traceback) or runs correctly (exit 0); it never touches a file outside its output (every case runs in a
folder holding a planted user file, checked afterwards).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Sequence

from typer.testing import CliRunner

from sim.cli import app

TESTS = Path(__file__).resolve().parents[1]
BASE_YAML = TESTS / "bad_input" / "base.yaml"
BASE = BASE_YAML.read_text()
PROFILE = TESTS / "data" / "profiles" / "h100" / "meta-llama" / "Llama-2-7b-hf"
USER_FILE = "users-own-notes.txt"


def invoke(args: Sequence[str]):
    return CliRunner().invoke(app, [str(a) for a in args])


def output_of(res) -> str:
    return (res.stdout or "") + (res.stderr or "")


def assert_refused(res, *fragments: str) -> str:
    """Exit 2 with one ``error:`` line holding every fragment, and no traceback."""
    out = output_of(res)
    assert res.exit_code == 2, f"exit {res.exit_code}: {out[-2000:]}"
    assert "Traceback" not in out, out
    errors = [line for line in (res.stderr or "").splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and len((res.stderr or "").splitlines()) <= 2, res.stderr
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    return errors[0]


def assert_clean(res) -> None:
    """Exit 0 or a clean refusal (exit 2, one line), and no traceback either way."""
    out = output_of(res)
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    if res.exit_code != 0:
        assert_refused(res)


def plant_user_file(folder: Path) -> str:
    """A user's file in ``folder``; returns its digest (see :func:`assert_user_file_kept`)."""
    (folder / USER_FILE).write_text("mine, not hybridsim's\n")
    return hashlib.sha256((folder / USER_FILE).read_bytes()).hexdigest()


def assert_user_file_kept(folder: Path, digest: str) -> None:
    assert hashlib.sha256((folder / USER_FILE).read_bytes()).hexdigest() == digest


def copy_profile(dest: Path) -> Path:
    shutil.copytree(PROFILE, dest)
    return dest
