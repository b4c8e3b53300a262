"""Whole bundles or none: stage a result bundle in a temporary sibling folder, then swap it into place.

:func:`staged_bundle` is the only way a bundle reaches its final path:

1. **Ownership check first.** The target must not be a symbolic link. If it exists, every entry in it must be
   ours: a file listed by its ``manifest.json``, a sidecar (:data:`SIDECARS`), or a folder that is itself a
   bundle with a manifest (e.g. ``replay/replayed/``). Anything else is a *foreign* entry and the write is
   refused with :class:`OutputFolderError` naming it, unless ``force=True``; then the old folder is not
   deleted but moved aside to ``<target>.old`` (``.old-1``, ... if taken) and a note says so.
2. **Stage.** The caller writes every file into a fresh folder ``.<name>.tmp-<pid>-<random>`` next to the
   target (same file system, so the final rename is atomic). The folder is new and empty, so no link
   planted in an old bundle (``plots/``, ``replay/``, ``crash.json``) can be written through.
3. **Manifest last.** :meth:`Stage.finish` hashes every staged file, writes ``manifest.json`` (tables with
   file, row count and SHA-256; every file's SHA-256; ``partial`` and its ``reason``), fsyncs files and
   folders, and only then swaps the stage in: ``renameat2(RENAME_EXCHANGE)`` where the kernel has it
   (one atomic step), else rename-old-aside / rename-new-in. The old folder is removed only when it was
   ours (empty, or a bundle with a manifest and nothing foreign).
4. **Failure** (an exception, ``OSError`` such as ENOSPC, a second interrupt): the stage is removed and
   the previous bundle is untouched; an ``OSError`` becomes :class:`BundleWriteError`.

Signals are deferred while the stage is finished (:func:`sim.interrupts.deferred`): a first SIGINT/SIGTERM
waits until the swap is done, a second one aborts the write (old bundle untouched). A SIGKILL at any point
leaves either the old bundle or the new one at the target, plus at worst a ``.tmp`` stage folder.

:func:`check_bundle` validates a bundle against its manifest; see :class:`BundleCheck`.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from sim.interrupts import deferred, pause_point

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "hybridsim-bundle"
MANIFEST_VERSION = 1
#: Files a tool other than the bundle writer puts in a bundle folder: the sweep's identity file (kept across
#: a rewrite) and a failed sweep run's traceback (dropped by a rewrite).
SIDECARS = ("sweep-run.json", "error.txt")
KEPT_SIDECARS = ("sweep-run.json",)


class OutputFolderError(ValueError):
    """The output folder cannot be used as it is (a link, a file, or it holds files we did not write)."""


class BundleWriteError(OSError):
    """Writing the bundle failed at the OS level (disk full, I/O error); the previous bundle is untouched."""


class BundleError(ValueError):
    """A bundle whose manifest does not match its files (or that has none where one is required)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- ownership


def read_manifest(directory: Path) -> dict | None:
    """``directory``'s manifest if it is a regular file holding a manifest of ours, else None."""
    path = directory / MANIFEST_FILE
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), dict):
        return None
    return data


def foreign_entries(directory: Path) -> list[str]:
    """Entries of ``directory`` (relative paths, sorted) that the bundle writer did not put there.

    Ours: ``manifest.json``, the files it lists, :data:`SIDECARS`, and folders that are bundles themselves.
    A folder without a manifest holds only foreign entries (except sidecars). Links are never ours.
    """
    manifest = read_manifest(directory)
    listed = set(manifest["files"]) if manifest is not None else set()
    foreign: list[str] = []

    def walk(folder: Path, prefix: str) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            rel = prefix + entry.name
            if entry.is_symlink():
                foreign.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                if read_manifest(Path(entry.path)) is not None and not foreign_entries(Path(entry.path)):
                    continue
                if any(name.startswith(rel + "/") for name in listed):
                    walk(Path(entry.path), rel + "/")
                else:
                    foreign.append(rel + "/")
            elif rel in listed or (
                not prefix and (entry.name in SIDECARS or (entry.name == MANIFEST_FILE and manifest is not None))
            ):
                continue
            else:
                foreign.append(rel)

    walk(directory, "")
    return foreign


def check_output_folder(target: Path, *, force: bool = False) -> str:
    """Why ``target`` may be written: ``"new"``, ``"empty"``, ``"ours"`` or ``"foreign"`` (``force`` only).

    Raises :class:`OutputFolderError` for a link, a non-folder, or foreign entries without ``force``.
    """
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise OutputFolderError(f"{target}: cannot use it ({exc.strerror}); give a writable directory path") from None
    if stat.S_ISLNK(mode):
        raise OutputFolderError(
            f"output folder {target} is a symbolic link; links are never followed, give the real folder"
        )
    if not stat.S_ISDIR(mode):
        raise OutputFolderError(f"output folder {target} exists and is not a folder")
    entries = os.listdir(target)
    if not entries:
        return "empty"
    foreign = foreign_entries(target)
    if not foreign:
        return "ours"
    if force:
        return "foreign"
    more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
    raise OutputFolderError(
        f"output folder {target} holds {target / foreign[0]}{more}, which hybridsim did not write; "
        "give an empty or new folder, or --force (the old folder is then kept as <folder>.old)"
    )


# ---------------------------------------------------------------- the swap


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _free_aside(target: Path) -> Path:
    candidate = target.with_name(target.name + ".old")
    n = 0
    while os.path.lexists(candidate):
        n += 1
        candidate = target.with_name(f"{target.name}.old-{n}")
    return candidate


@dataclass
class Stage:
    """A bundle being written: write files under ``path``; record tables; :meth:`finish` swaps it in."""

    path: Path
    target: Path
    state: str
    partial: bool = False
    reason: str | None = None
    tables: dict[str, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    finished: bool = False

    def record_table(self, name: str, file: Path, rows: int) -> None:
        self.tables[name] = {"file": file.relative_to(self.path).as_posix(), "rows": int(rows)}

    def _manifest(self) -> dict:
        files: dict[str, str] = {}
        for root, dirs, names in os.walk(self.path):
            dirs.sort()
            for name in sorted(names):
                full = Path(root) / name
                rel = full.relative_to(self.path).as_posix()
                if rel == MANIFEST_FILE:
                    continue
                _fsync_path(full)
                files[rel] = sha256_file(full)
            _fsync_path(Path(root), directory=True)
        tables = {n: {**t, "sha256": files[t["file"]]} for n, t in sorted(self.tables.items())}
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "partial": self.partial,
            "reason": self.reason,
            "tables": tables,
            "files": files,
        }

    def finish(self) -> None:
        """Write the manifest, fsync, swap the stage into place, remove the old folder if it was ours."""
        with deferred():
            text = json.dumps(self._manifest(), indent=2, sort_keys=True) + "\n"
            pause_point("manifest")
            with open(self.path / MANIFEST_FILE, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_path(self.path, directory=True)
            # Re-check: the folder may have changed while the run was going.
            state = check_output_folder(self.target, force=self.state == "foreign")
            pause_point("swap")
            if state == "new":
                os.rename(self.path, self.target)
                old = None
            elif _exchange(self.path, self.target):
                old = self.path
            else:
                old = self.target.with_name(self.path.name + ".prev")
                os.rename(self.target, old)
                os.rename(self.path, self.target)
            _fsync_path(self.target.parent, directory=True)
            if old is not None:
                if state == "foreign":
                    aside = _free_aside(self.target)
                    os.rename(old, aside)
                    self.notes.append(f"the previous contents of {self.target} are kept in {aside}")
                else:
                    shutil.rmtree(old)
            self.finished = True


def _remove_dead_stages(target: Path) -> None:
    """Remove stage folders ``.<name>.tmp-<pid>-...`` next to ``target`` left by a process that no longer
    exists (a SIGKILL or an out-of-memory kill mid-write); a live writer's stage is left alone."""
    prefix = f".{target.name}.tmp-"
    for entry in os.scandir(target.parent):
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            continue
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by someone else


@contextmanager
def staged_bundle(target: str | os.PathLike[str], *, force: bool = False) -> Iterator[Stage]:
    """Stage a bundle for ``target``; the caller writes into ``stage.path`` and calls :meth:`Stage.finish`.

    A stage left unfinished is discarded. On any exception the stage is removed and ``target`` is as it was; an ``OSError`` is re-raised as
    :class:`BundleWriteError` with one readable line.
    """
    target = Path(os.path.abspath(target))
    state = check_output_folder(target, force=force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_stages(target)
        path = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        path.mkdir()
    except OSError as exc:
        raise BundleWriteError(exc.errno, f"cannot create a folder next to {target}: {exc.strerror}") from None
    stage = Stage(path=path, target=target, state=state)
    if state == "ours":
        for name in KEPT_SIDECARS:
            if (target / name).is_file() and not (target / name).is_symlink():
                shutil.copyfile(target / name, path / name)
    try:
        yield stage
        if not stage.finished:
            shutil.rmtree(path, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        if isinstance(exc, BundleWriteError):
            raise
        what = exc.strerror or str(exc)
        raise BundleWriteError(
            exc.errno, f"cannot write the result bundle {target}: {what}; the previous contents are untouched"
        ) from None
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def rewrite_bundle(
    directory: str | os.PathLike[str],
    update: Callable[[Path], None],
    *,
    drop: str = "plots/",
    keep: Callable[[str], bool] = lambda rel: False,
) -> list[str]:
    """Replace the bundle at ``directory`` whole with a copy whose files under ``drop`` are redrawn by
    ``update(stage_dir)`` (e.g. ``hybridsim plot``); files under ``drop`` for which ``keep(rel)`` holds are
    carried over (``plot --svg`` keeps the PNGs). The rest must match the manifest. Returns the notes."""
    d = Path(os.path.abspath(directory))
    check = check_bundle(d)
    problems = [p for p in check.problems if not p.startswith(drop)]
    if problems:
        raise BundleError(f"{d}: inconsistent bundle: {problems[0]}")
    manifest = read_manifest(d)
    assert manifest is not None
    with staged_bundle(d) as stage:
        stage.partial, stage.reason = check.partial, check.reason
        for rel in manifest["files"]:
            if not rel.startswith(drop) or keep(rel):
                (stage.path / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(d / rel, stage.path / rel)
        for name, entry in manifest.get("tables", {}).items():
            stage.record_table(name, stage.path / entry["file"], entry["rows"])
        update(stage.path)
        stage.finish()
    return stage.notes


# ---------------------------------------------------------------- checking


@dataclass
class BundleCheck:
    """What :func:`check_bundle` found: ``problems`` (empty = consistent), ``partial`` and its ``reason``."""

    path: Path
    problems: list[str]
    partial: bool = False
    reason: str | None = None
    has_manifest: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.problems:
            return f"{self.path}: inconsistent bundle: {self.problems[0]}" + (
                f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
            )
        if self.partial:
            return f"{self.path}: partial bundle ({self.reason or 'no reason given'})"
        return f"{self.path}: complete bundle"


def _table_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    import pandas as pd

    return len(pd.read_csv(path, dtype=str, keep_default_na=False))


def check_bundle(directory: str | os.PathLike[str]) -> BundleCheck:
    """Validate ``directory`` against its manifest: every listed file present (not a link) with its hash,
    every table's row count, no table file the manifest does not list, ``summary.json`` a mapping whose
    ``partial`` agrees with the manifest."""
    from sim.trace.tables import TABLE_NAMES

    d = Path(directory)
    manifest = read_manifest(d)
    if manifest is None:
        problem = f"{MANIFEST_FILE} is missing or unreadable (the bundle was not written whole, or by an older version)"
        return BundleCheck(d, [problem], has_manifest=False)
    problems: list[str] = []
    for rel, digest in sorted(manifest["files"].items()):
        path = d / rel
        if path.is_symlink() or not path.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel} does not match its hash in {MANIFEST_FILE}")
    given_tables = manifest.get("tables")
    tables = given_tables if isinstance(given_tables, dict) else {}
    for name, entry in sorted(tables.items()):
        file = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(file, str) or file not in manifest["files"]:
            problems.append(f"table {name!r} has no file in {MANIFEST_FILE}")
            continue
        if (d / file).is_file() and not any(file in p for p in problems):
            try:
                rows = _table_rows(d / file)
            except Exception as exc:  # unreadable table: a problem to report, not a crash
                problems.append(f"{file} cannot be read ({type(exc).__name__})")
                continue
            if rows != entry.get("rows"):
                problems.append(f"{file} has {rows} rows, {MANIFEST_FILE} says {entry.get('rows')}")
    for name in TABLE_NAMES:
        for ext in ("parquet", "csv"):
            rel = f"{name}.{ext}"
            if os.path.lexists(d / rel) and rel not in manifest["files"]:
                problems.append(f"{rel} is not listed in {MANIFEST_FILE}")
    partial = manifest.get("partial") is True
    summary_file = d / "summary.json"
    if "summary.json" in manifest["files"] and summary_file.is_file():
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        except ValueError:
            summary = None
        if not isinstance(summary, dict) or not summary:
            problems.append("summary.json is not a non-empty JSON object")
        elif summary.get("partial", False) is not partial:
            problems.append(f"summary.json says partial={summary.get('partial')!r}, {MANIFEST_FILE} {partial!r}")
    elif "summary.json" not in manifest["files"]:
        problems.append(f"summary.json is not listed in {MANIFEST_FILE}")
    reason = manifest.get("reason")
    return BundleCheck(d, problems, partial=partial, reason=reason if isinstance(reason, str) else None)
