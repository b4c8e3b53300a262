"""No command opens an output path by itself: every file hybridsim writes goes through sim.trace.output (or the
bundle writer sim.trace.atomic built on it). An AST scan of sim/ finds every call that creates, replaces or
removes a file or folder; each one outside the writer modules must be on the allow-list below with the reason
it is not an output path (the list must stay exact: an entry that no longer matches fails too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The writer modules: the only places that open output paths.
WRITERS = {"sim/trace/output.py", "sim/trace/atomic.py"}

#: (module, call) -> why it is not a command writing an output path by itself.
ALLOWED: dict[tuple[str, str], str] = {
    ("sim/trace/bundle.py", "_parquet.ParquetWriter"): "writes into the file object sim.trace.output.write_file opened",
    ("sim/trace/bundle.py", "to_csv"): "writes into the file object sim.trace.output.write_file opened",
    ("sim/sweep/table.py", "pq.write_table"): "writes into the file object sim.trace.output.write_file opened",
    ("sim/analysis/figures.py", "savefig"): "renders into an in-memory buffer that write_file then writes",
    ("sim/sweep/runner.py", "unlink"): "a failed run's error.txt, proven hybridsim's (stamped) by _check_ours first",
    ("sim/verify/vllm_side.py", "shutil.rmtree"): "removes its own tempfile.mkdtemp folder",
    ("sim/verify/vllm_side.py", "open"): "vLLM's config.json in its own tempfile.mkdtemp folder",
}

_PATH_METHODS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "symlink_to", "savefig"}
_FRAME_METHODS = {"to_csv", "to_parquet", "to_json", "to_feather", "to_excel", "to_pickle"}
_MODULE_CALLS = {
    "os": {"replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "makedirs", "mkdir", "symlink"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "rmtree"},
    "pq": {"write_table", "write_to_dataset", "ParquetWriter"},
    "_parquet": {"ParquetWriter"},  # pyarrow._parquet, the file writer under pyarrow.parquet's
}


def _writes_mode(call: ast.Call) -> bool:
    modes = [a for a in call.args[1:2]] + [k.value for k in call.keywords if k.arg == "mode"]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+") for m in modes)


def _write_flags(call: ast.Call) -> bool:
    names = {n.attr for a in call.args[1:2] for n in ast.walk(a) if isinstance(n, ast.Attribute)}
    return bool(names & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"})


def writes_in(source: str) -> set[str]:
    """The file-writing calls in ``source`` (named as in :data:`ALLOWED`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "open" and _writes_mode(node):
            found.add("open")
        elif isinstance(fn, ast.Attribute):
            owner = fn.value.id if isinstance(fn.value, ast.Name) else None
            if owner in _MODULE_CALLS and fn.attr in _MODULE_CALLS[owner]:
                found.add(f"{owner}.{fn.attr}")
            elif owner == "os" and fn.attr == "open" and _write_flags(node):
                found.add("os.open")
            elif owner not in _MODULE_CALLS and (fn.attr in _PATH_METHODS or fn.attr in _FRAME_METHODS):
                found.add(fn.attr)
            elif fn.attr == "open" and owner != "os" and _writes_mode(ast.Call(fn, [fn, *node.args], node.keywords)):
                found.add("open")
    return found


def test_no_module_outside_the_writers_opens_an_output_path() -> None:
    found = {
        (path.relative_to(ROOT).as_posix(), call)
        for path in sorted((ROOT / "sim").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in WRITERS
        for call in writes_in(path.read_text(encoding="utf-8"))
    }
    unexplained = sorted(found - set(ALLOWED))
    assert not unexplained, f"write an output through sim.trace.output.write_file instead: {unexplained}"
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allow-list entries that no longer match anything (remove them): {stale}"


def test_the_scan_finds_what_it_must() -> None:
    """The scan itself catches each kind of write (so an empty finding means something)."""
    source = """
import os, shutil
import pyarrow.parquet as pq
open(p, "w"); open(p, mode="ab"); p.open("w"); p.write_text("x"); p.write_bytes(b""); p.mkdir()
os.replace(a, b); shutil.rmtree(d); pq.write_table(t, p); pq.ParquetWriter(p, s); _parquet.ParquetWriter(p, s); df.to_csv(p); fig.savefig(p)
os.open(p, os.O_WRONLY | os.O_CREAT)
open(p); p.open(); p.read_text(); os.open(p, os.O_RDONLY); text.replace("a", "b")
"""
    assert writes_in(source) == {
        "open",
        "write_text",
        "write_bytes",
        "mkdir",
        "os.replace",
        "shutil.rmtree",
        "pq.write_table",
        "pq.ParquetWriter",
        "_parquet.ParquetWriter",
        "to_csv",
        "savefig",
        "os.open",
    }
