"""The compiled-build choice (sim.native): all or nothing, never stale, switchable off."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import pytest

from sim import native
from sim.native import (
    SourceFirstFinder,
    c_source_path,
    decide,
    extension_path,
    shared_library,
    source_digest,
    source_path,
)

MODULES = ("pkg.alpha", "pkg.sub.beta")
C_EXTENSIONS = ("pkg._gamma",)


def _tree(tmp_path: Path, compiled: bool = True) -> dict[str, object]:
    """A package tree with sources (and fake extensions), and the manifest a build of it would write."""
    for module in MODULES:
        source = source_path(module, tmp_path)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"NAME = {module!r}\n", encoding="utf-8")
        if compiled:
            extension_path(module, tmp_path).write_bytes(b"not really an extension")
    for extension in C_EXTENSIONS:
        c_source_path(extension, tmp_path).write_text("/* C */\n", encoding="utf-8")
        if compiled:
            extension_path(extension, tmp_path).write_bytes(b"not really an extension")
    lib = shared_library(tmp_path)
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"")
    return {
        "cache_tag": sys.implementation.cache_tag,
        "mypyc": "test",
        "modules": {m: source_digest(source_path(m, tmp_path)) for m in MODULES},
        "c_extensions": {e: source_digest(c_source_path(e, tmp_path)) for e in C_EXTENSIONS},
    }


def _decide(manifest, root, env=None):
    return decide(manifest, root, env={} if env is None else env, modules=MODULES, c_extensions=C_EXTENSIONS)


def test_a_fresh_build_is_used(tmp_path: Path) -> None:
    status = _decide(_tree(tmp_path), tmp_path)
    assert status.compiled and not status.unusable_build
    assert "2 modules" in status.reason


def test_no_build_is_interpreted_without_complaint(tmp_path: Path) -> None:
    _tree(tmp_path, compiled=False)
    status = _decide(None, tmp_path)
    assert not status.compiled and not status.unusable_build


def test_the_switch_turns_a_fresh_build_off(tmp_path: Path) -> None:
    status = _decide(_tree(tmp_path), tmp_path, {"HYBRIDSIM_NATIVE": "0"})
    assert not status.compiled and "HYBRIDSIM_NATIVE=0" in status.reason
    assert _decide(_tree(tmp_path), tmp_path, {"HYBRIDSIM_NATIVE": "1"}).compiled


def test_an_edited_source_makes_the_whole_build_unusable(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    beta = source_path("pkg.sub.beta", tmp_path)
    beta.write_text(beta.read_text() + "# edited\n", encoding="utf-8")
    status = _decide(manifest, tmp_path)
    assert not status.compiled and status.unusable_build
    assert "beta.py changed" in status.reason


def test_an_edited_c_extension_source_makes_the_whole_build_unusable(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    gamma = c_source_path("pkg._gamma", tmp_path)
    gamma.write_text(gamma.read_text() + "/* edited */\n", encoding="utf-8")
    status = _decide(manifest, tmp_path)
    assert not status.compiled and status.unusable_build
    assert "_gamma.c changed" in status.reason


@pytest.mark.parametrize("damage", ["extension", "shared", "modules", "cache_tag", "c_extension", "c_extensions"])
def test_an_incomplete_or_foreign_build_is_not_used(tmp_path: Path, damage: str) -> None:
    manifest = _tree(tmp_path)
    if damage == "extension":
        extension_path("pkg.alpha", tmp_path).unlink()
    elif damage == "shared":
        shared_library(tmp_path).unlink()
    elif damage == "modules":
        manifest["modules"] = {"pkg.alpha": manifest["modules"]["pkg.alpha"]}  # type: ignore[index]
    elif damage == "c_extension":
        extension_path("pkg._gamma", tmp_path).unlink()
    elif damage == "c_extensions":
        del manifest["c_extensions"]  # a build from before the C extensions
    else:
        manifest["cache_tag"] = "cpython-299"
    status = _decide(manifest, tmp_path)
    assert not status.compiled and status.unusable_build


def test_the_source_first_finder_skips_an_extension_beside_the_source(tmp_path: Path) -> None:
    _tree(tmp_path)
    finder = SourceFirstFinder(MODULES)
    spec = finder.find_spec("pkg.sub.beta", [str(tmp_path / "pkg" / "sub")])
    assert spec is not None and spec.origin == str(source_path("pkg.sub.beta", tmp_path))
    assert finder.find_spec("pkg.other", [str(tmp_path / "pkg")]) is None
    # Without it, the path finder would pick the (fake) extension.
    default = importlib.machinery.PathFinder.find_spec("beta", [str(tmp_path / "pkg" / "sub")])
    assert default is not None and default.origin.endswith(importlib.machinery.EXTENSION_SUFFIXES[0])


def test_the_suite_runs_the_interpreted_core() -> None:
    import sim.core.scheduler

    assert not native.status().compiled
    assert native.compiled_modules_loaded() == []
    assert sim.core.scheduler.__file__.endswith(".py")


def test_every_compiled_module_exists_and_is_no_package() -> None:
    for module in native.COMPILED_MODULES:
        path = source_path(module)
        assert path.is_file() and path.name != "__init__.py", module
