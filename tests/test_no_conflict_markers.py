"""No merge-conflict markers in the repository's text (one sat in sim/verify/fuzz.py's docstring, where no
other test could see it: a string is valid Python whatever it holds)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Folders and files of the repository's own text (not the venvs, results or caches).
TEXT_ROOTS = ("sim", "tests", "docs", "benchmarks", "scenarios", "examples", "notebooks", ".ci")
TEXT_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".ipynb", ".cfg", ""}
MARKER = re.compile(r"^(<<<<<<< |>>>>>>> |\|\|\|\|\|\|\| )", re.MULTILINE)


def _text_files() -> list[Path]:
    out = [ROOT / name for name in TEXT_FILES if (ROOT / name).is_file()]
    for top in TEXT_ROOTS:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                out.append(path)
    return out


def test_no_file_holds_a_merge_conflict_marker() -> None:
    files = _text_files()
    assert len(files) > 100, "the walk found too few files: this test would check nothing"
    marked = [
        str(path.relative_to(ROOT))
        for path in files
        if MARKER.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert marked == []
