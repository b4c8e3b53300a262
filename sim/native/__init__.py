"""The compiled build of hybridsim's hot modules, and the all-or-nothing choice at import.

``hybridsim native build`` (:mod:`sim.native.build`) compiles the modules of
:data:`COMPILED_MODULES` with mypyc into C extensions placed beside their
sources, then writes its manifest (``sim/native/manifest.json``): the SHA-256 of each compiled module's
source, the interpreter's cache tag and the mypyc that built them.

Invariants:

* **One source, two builds.** The extensions are compiled from the very files
  the interpreter runs, so both make the same decisions; the differential test
  (``tests/native/test_native_differential.py``) holds them to byte-identical
  tables on every golden scenario and on random fuzz scenarios, and to identical
  decisions against the real vLLM scheduler.
* **All or nothing.** A process runs either every module of the list compiled or
  every one from source: compiled modules call one another directly in C, so a
  half-compiled core would run code that matches neither source.
* **Never stale.** The compiled build is used only if the manifest lists exactly
  these modules for this interpreter, every extension file is present and every
  source still hashes to its recorded digest. Edit a compiled module and the next
  process imports all of them from source, with a :class:`NativeBuildWarning`,
  until ``hybridsim native build`` runs again.
* ``HYBRIDSIM_NATIVE=0`` imports from source even when the build is fresh (the
  test suite does, since some tests wrap core methods, which compiled classes
  refuse).

:func:`install` is called once, by ``sim/__init__.py``, before any listed module
is imported: when the build is not used it puts :class:`SourceFirstFinder` ahead
of the path finder, which would otherwise prefer an extension file to a source.
Only the standard library is imported here.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Mapping, Sequence

#: The modules compiled, dotted: the core's hot path, then the engine's per-step modules (loop,
#: recorder, step-time model, transfers) and the trace reader's block expansion. Not ``__init__``
#: modules, the Protocols (``interfaces``), the registry, or the policy bases that plugins subclass
#: (``policy/``): an interpreted class cannot subclass a compiled one.
COMPILED_MODULES: tuple[str, ...] = (
    "sim.core.tokens",
    "sim.core.request",
    "sim.core.admission",
    "sim.core.admission_truth",
    "sim.core.scheduler",
    "sim.core.kv.specs",
    "sim.core.kv.shapes",
    "sim.core.kv.hashing",
    "sim.core.kv.hash_view",
    "sim.core.kv.pool",
    "sim.core.kv.eviction",
    "sim.core.kv.managers",
    "sim.core.kv.coordinator",
    "sim.core.kv.manager",
    "sim.core.policy.prefix",
    "sim.trace.recorder",
    "sim.engine.loop",
    "sim.engine.timing",
    "sim.engine.transfer",
    "sim.workload.traces.common",
)
#: The build's hand-written C extensions, dotted; the source of each is the ``.c`` file of that name
#: (:func:`c_source_path`). ``sim.native._chainhash``: chained block hashes (``sim.core.kv.hashing``).
#: They belong to the compiled build: used with it, never without it, and checked like its modules.
C_EXTENSIONS: tuple[str, ...] = ("sim.native._chainhash",)
#: mypyc's group name: the shared library holding all compiled code is ``<GROUP>__mypyc``.
GROUP = "sim.native.hot"
#: Where the package tree starts (the directory holding ``sim/``).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: ``HYBRIDSIM_NATIVE=0`` forces the interpreted build.
ENV_SWITCH = "HYBRIDSIM_NATIVE"


class NativeBuildWarning(UserWarning):
    """A compiled build exists but cannot be used (stale, incomplete, or for another interpreter)."""


@dataclass(frozen=True)
class NativeStatus:
    """Which build this process runs, and why (``reason`` is one line for people)."""

    compiled: bool
    reason: str
    #: Whether a build exists that could not be used (the reason then says why).
    unusable_build: bool = False


def source_path(module: str, root: Path = PACKAGE_ROOT) -> Path:
    """The ``.py`` file of a dotted module name under ``root``."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def c_source_path(module: str, root: Path = PACKAGE_ROOT) -> Path:
    """The ``.c`` file of a dotted C extension name under ``root``."""
    return root.joinpath(*module.split(".")).with_suffix(".c")


def extension_path(module: str, root: Path = PACKAGE_ROOT) -> Path:
    """Where the compiled extension of ``module`` lives (beside its source)."""
    return root.joinpath(*module.split(".")).with_name(
        module.rsplit(".", 1)[-1] + importlib.machinery.EXTENSION_SUFFIXES[0]
    )


def manifest_path(root: Path = PACKAGE_ROOT) -> Path:
    """The manifest of the compiled build under ``root`` (beside this package's sources)."""
    return root / "sim" / "native" / "manifest.json"


def shared_library(root: Path = PACKAGE_ROOT) -> Path:
    """The group's shared library, which every compiled module's extension loads."""
    return extension_path(f"{GROUP}__mypyc", root)


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def decide(
    manifest: Mapping[str, object] | None,
    root: Path = PACKAGE_ROOT,
    env: Mapping[str, str] = os.environ,
    modules: Sequence[str] = COMPILED_MODULES,
    c_extensions: Sequence[str] = C_EXTENSIONS,
) -> NativeStatus:
    """The choice :func:`install` makes, as a pure function of the manifest, the tree and the environment."""
    if manifest is None:
        return NativeStatus(False, "interpreted: no compiled build (`hybridsim native build` makes one)")
    if env.get(ENV_SWITCH, "") == "0":
        return NativeStatus(False, f"interpreted: {ENV_SWITCH}=0")
    digests = manifest.get("modules")
    if not isinstance(digests, dict) or sorted(digests) != sorted(modules):
        return NativeStatus(False, "interpreted: the compiled build lists other modules; rebuild it", True)
    if manifest.get("cache_tag") != sys.implementation.cache_tag:
        return NativeStatus(
            False,
            f"interpreted: the compiled build is for {manifest.get('cache_tag')}, not {sys.implementation.cache_tag}",
            True,
        )
    if not shared_library(root).is_file():
        return NativeStatus(False, "interpreted: the compiled build lacks its shared library; rebuild it", True)
    unusable = _first_unusable({m: source_path(m, root) for m in modules}, digests, root)
    if unusable is not None:
        return unusable
    c_digests = manifest.get("c_extensions", {})
    if not isinstance(c_digests, dict) or sorted(c_digests) != sorted(c_extensions):
        return NativeStatus(False, "interpreted: the compiled build lists other C extensions; rebuild it", True)
    unusable = _first_unusable({e: c_source_path(e, root) for e in c_extensions}, c_digests, root)
    if unusable is not None:
        return unusable
    return NativeStatus(True, f"compiled: {len(modules)} modules (mypyc {manifest.get('mypyc', '?')})")


def _first_unusable(sources: Mapping[str, Path], digests: Mapping[str, object], root: Path) -> NativeStatus | None:
    """Why the build cannot be used for the first of these extensions (name -> its source) whose file is
    missing or whose source no longer hashes to its recorded digest, or None when every one is fresh."""
    for name, source in sources.items():
        if not extension_path(name, root).is_file():
            return NativeStatus(False, f"interpreted: the compiled build lacks {name}; rebuild it", True)
        if not source.is_file() or source_digest(source) != digests[name]:
            return NativeStatus(
                False, f"interpreted: {source.relative_to(root)} changed since the compiled build; rebuild it", True
            )
    return None


def read_manifest(path: Path | None = None) -> dict[str, object] | None:
    """The manifest (default: this tree's), or None when there is none; an unreadable one counts as none."""
    path = manifest_path() if path is None else path
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


class SourceFirstFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules' ``.py`` sources, ahead of the path finder (which prefers extensions)."""

    def __init__(self, modules: Sequence[str]) -> None:
        self._modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._modules:
            return None
        leaf = fullname.rsplit(".", 1)[-1] + ".py"
        for entry in path or ():
            candidate = Path(entry) / leaf
            if candidate.is_file():
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


_status: NativeStatus | None = None


def install() -> NativeStatus:
    """Choose the build for this process, once; later calls return the first choice."""
    global _status
    if _status is None:
        _status = decide(read_manifest())
        if not _status.compiled:
            sys.meta_path.insert(0, SourceFirstFinder(COMPILED_MODULES))
            if _status.unusable_build:
                warnings.warn(_status.reason, NativeBuildWarning, stacklevel=2)
    return _status


def status() -> NativeStatus:
    """The build this process runs (:func:`install` has run when ``sim`` was imported)."""
    return install()


def compiled_modules_loaded() -> list[str]:
    """Which listed modules this process has imported from their extensions (for tests and reports)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [
        name
        for name in COMPILED_MODULES
        if name in sys.modules and str(getattr(sys.modules[name], "__file__", "")).endswith(suffixes)
    ]
