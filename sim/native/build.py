"""``hybridsim native build``: compile :data:`sim.native.COMPILED_MODULES` with mypyc.

Steps, each one leaving the tree either usable or interpreted:

1. the manifest is removed first, so from here until step 4 every process runs
   interpreted (a half-finished build is never picked up);
2. the sources are hashed;
3. mypyc (through setuptools' ``build_ext --inplace``, in a subprocess, with a
   temporary build directory) writes one extension per module beside its source,
   plus the group's shared library ``sim/native/hot__mypyc``;
4. if every extension is there and no source changed meanwhile, the manifest is
   written (atomically: a temporary file, then a rename).

Only files at the exact paths of this build's outputs are replaced or removed.
Needs mypy (which ships mypyc), setuptools and a C compiler with the Python
headers: ``pip install -e '.[native]'``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from sim.native import (
    C_EXTENSIONS,
    COMPILED_MODULES,
    GROUP,
    PACKAGE_ROOT,
    c_source_path,
    extension_path,
    manifest_path,
    shared_library,
    source_digest,
    source_path,
)


@dataclass(frozen=True)
class NativeBuild:
    """What a finished build wrote: how many modules, how long it took, which mypyc."""

    modules: int
    seconds: float
    mypyc: str


class NativeBuildError(RuntimeError):
    """The compiled build could not be made; the tree stays on the interpreted build."""


def _require_toolchain() -> str:
    missing = [name for name in ("mypyc", "setuptools") if importlib.util.find_spec(name) is None]
    if missing:
        raise NativeBuildError(
            f"the compiled build needs {', '.join(missing)}: install the native extra (pip install -e '.[native]')"
        )
    from importlib.metadata import version

    return version("mypy")


def _outputs(root: Path) -> list[Path]:
    return [*(extension_path(m, root) for m in (*COMPILED_MODULES, *C_EXTENSIONS)), shared_library(root)]


def _setup_script(paths: list[str], c_extensions: dict[str, str], build_dir: str, opt_level: str) -> str:
    """The setup script: mypyc's extensions for ``paths``, plus each C extension (name -> its ``.c`` file)."""
    return textwrap.dedent(
        f"""
        from setuptools import Extension, setup
        from mypyc.build import mypycify

        c_extensions = [
            Extension(name, [source], extra_compile_args=["-O{opt_level}"])
            for name, source in {c_extensions!r}.items()
        ]
        setup(
            name="hybridsim-native",
            script_args=["build_ext", "--inplace", "--build-temp", {build_dir + "/temp"!r}],
            ext_modules=mypycify(
                {paths!r}, opt_level={opt_level!r}, debug_level="0", group_name={GROUP!r},
                target_dir={build_dir + "/c"!r},
            ) + c_extensions,
        )
        """
    )


def build(opt_level: str = "3", root: Path = PACKAGE_ROOT, echo: bool = False) -> NativeBuild:
    """Compile the modules under ``root`` and write the manifest. Raises :class:`NativeBuildError`."""
    mypy_version = _require_toolchain()
    manifest_file = manifest_path(root)
    manifest_file.unlink(missing_ok=True)
    for output in _outputs(root):
        output.unlink(missing_ok=True)
    sources = [source_path(m, root) for m in COMPILED_MODULES]
    digests = {m: source_digest(p) for m, p in zip(COMPILED_MODULES, sources)}
    c_sources = {e: c_source_path(e, root) for e in C_EXTENSIONS}
    c_digests = {e: source_digest(p) for e, p in c_sources.items()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hybridsim-native-") as tmp:
        script = Path(tmp) / "setup.py"
        c_paths = {e: str(p.relative_to(root)) for e, p in c_sources.items()}
        script.write_text(
            _setup_script([str(p.relative_to(root)) for p in sources], c_paths, tmp, opt_level), encoding="utf-8"
        )
        log = Path(tmp) / "build.log"
        with log.open("w", encoding="utf-8") as out:
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=root,
                stdout=None if echo else out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HYBRIDSIM_NATIVE": "0"},
            )
        if done.returncode != 0:
            tail = "" if echo else "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
            raise NativeBuildError(f"mypyc build failed (exit {done.returncode}); the tree stays interpreted\n{tail}")
    missing = [str(p.relative_to(root)) for p in _outputs(root) if not p.is_file()]
    if missing:
        raise NativeBuildError(f"mypyc finished but did not write {', '.join(missing)}")
    changed = [m for m, p in zip(COMPILED_MODULES, sources) if source_digest(p) != digests[m]]
    changed += [e for e, p in c_sources.items() if source_digest(p) != c_digests[e]]
    if changed:
        raise NativeBuildError(f"sources changed during the build ({', '.join(changed)}); build again")
    seconds = round(time.monotonic() - started, 1)
    manifest: dict[str, object] = {
        "cache_tag": sys.implementation.cache_tag,
        "mypyc": mypy_version,
        "opt_level": opt_level,
        "build_seconds": seconds,
        "modules": digests,
        "c_extensions": c_digests,
    }
    partial = manifest_file.with_name(manifest_file.name + ".partial")
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, manifest_file)
    return NativeBuild(len(digests), seconds, mypy_version)


def clean(root: Path = PACKAGE_ROOT) -> list[Path]:
    """Remove the manifest and this build's extension files; returns what was removed."""
    removed = []
    for path in (manifest_path(root), *_outputs(root)):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed
