"""Sweep definitions: grid axes, seeds, plots, and the runs they expand to.

A sweep is a base scenario plus *axes*. An axis is one or more scenario key
paths whose values vary together: a ``--grid key.path=v1,v2`` item is an axis
with one key, a grid-file ``zip:`` group is an axis with several keys. The
runs are the Cartesian product of the axes (first axis outermost, its values
in the order given) times the seeds (innermost). Every value is a YAML value
and reaches the scenario as an override string ``"key.path=<YAML text>"``.

Invariants:

* A key path appears in at most one axis; ``seed`` is never an axis (seeds
  are their own dimension, see :class:`SeedSpec`).
* Within an axis, values (tuples of values for a zip group) are distinct.
* Run ids are deterministic functions of the run's grid values and seed,
  unique within the sweep (also case-insensitively), and filesystem-safe.

The grid-file format (documented for users in ``docs/sweeps.md``) is a YAML
mapping whose keys are scenario key paths (each mapped to a list of values)
plus the reserved keys ``scenario``, ``seeds``, ``zip``, ``set`` and ``plots``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from sim.config.yamlio import ScenarioError, load_yaml_file, parse_scalar

_KEY_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")
_PLOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._=+-]")
_MAX_RUN_ID_LEN = 150
_OPENERS = {"[": "]", "{": "}"}


class SweepError(ValueError):
    """Bad sweep input (grid item, grid file, seeds, output directory): the message names the item."""


@dataclass(frozen=True)
class Axis:
    """Keys that vary together; ``points[i][j]`` is the value of ``keys[j]`` at the axis' i-th point."""

    keys: tuple[str, ...]
    points: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class SeedSpec:
    """Either ``count`` seeds ``base + k`` (k in range(count), base = the scenario's ``seed``) or explicit ``values``."""

    count: int | None = 1
    values: tuple[int, ...] | None = None

    def resolve(self, base_seed: int) -> tuple[int, ...]:
        if self.values is not None:
            return self.values
        assert self.count is not None
        return tuple(base_seed + k for k in range(self.count))


@dataclass(frozen=True)
class PlotSpec:
    """A figure drawn after the sweep into ``DIR/plots/<name>.png`` by :func:`sim.sweep.plots.plot_sweep`."""

    name: str
    x: str
    metrics: tuple[str, ...]
    hue: str | None = None
    missing: float | None = None
    title: str | None = None


@dataclass(frozen=True)
class SweepSpec:
    """Everything that defines a sweep; :func:`plan_runs` expands it into runs.

    ``fixed`` are overrides applied to every run (grid-file ``set:``); they are not grid columns and not part
    of run ids, but they are part of each run's identity for resuming.
    """

    scenario: Path
    axes: tuple[Axis, ...] = ()
    seeds: SeedSpec = SeedSpec()
    plots: tuple[PlotSpec, ...] = ()
    fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every grid key path, in axis order: the grid columns of ``sweep.parquet``."""
        return tuple(k for axis in self.axes for k in axis.keys)


@dataclass(frozen=True)
class RunSpec:
    """One run: a grid point and a seed. ``overrides`` are the fixed ones, then the grid's, then ``seed=<seed>``."""

    run_id: str
    values: tuple[tuple[str, Any], ...]
    seed: int
    overrides: tuple[str, ...]


def yaml_text(value: Any) -> str:
    """One-line YAML text that ``yaml.safe_load`` reads back as ``value`` (strings are quoted when needed)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31, sort_keys=False)
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    return text.strip()


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not _KEY_PATH.match(key):
        raise SweepError(f"{where}: {key!r} is not a scenario key path (expected dotted names like cache.num_blocks)")
    if key == "seed":
        raise SweepError(f"{where}: 'seed' cannot be a grid key; give seeds with --seeds or a 'seeds:' entry")
    return key


def _split_values(text: str) -> list[str]:
    """Split on commas that are outside brackets, braces and quoted scalars.

    As in YAML, a quote opens a quoted scalar only where a scalar starts (at the start of a value or after
    ``[ { , :``), so an apostrophe inside a plain word (``it's``) is just a character.
    """
    parts: list[str] = []
    stack: list[str] = []
    quote: str | None = None
    start = 0
    prev: str | None = None  # last non-space character of the current value, None at its start
    escaped = False  # next character is escaped: a backslash escape in "...", a doubled quote in '...'
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif quote == '"' and ch == "\\":
                escaped = True
            elif ch == quote and quote == "'" and text[i + 1 : i + 2] == "'":
                escaped = True
            elif ch == quote:
                quote = None
                prev = ch
            continue
        if ch in ("'", '"') and (prev is None or prev in "[{,:"):
            quote = ch
        elif ch in _OPENERS:
            stack.append(_OPENERS[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
        elif ch == "," and not stack:
            parts.append(text[start:i])
            start = i + 1
            prev = None
            continue
        if not ch.isspace():
            prev = ch
    if quote or stack:
        raise SweepError(f"unbalanced {'quote' if quote else 'bracket'} in {text!r}")
    parts.append(text[start:])
    return parts


def _distinct(points: Sequence[tuple[Any, ...]], where: str) -> None:
    seen: set[str] = set()
    for point in points:
        text = yaml_text(list(point))
        if text in seen:
            shown = yaml_text(point[0]) if len(point) == 1 else text
            raise SweepError(f"{where}: value {shown} is given twice")
        seen.add(text)


def parse_grid_arg(text: str) -> Axis:
    """Parse one ``--grid key.path=v1,v2,...`` item (values are YAML; commas inside ``[]``/``{}``/quotes are kept)."""
    where = f"--grid {text!r}"
    key, sep, rest = text.partition("=")
    if not sep:
        raise SweepError(f"{where}: expected key.path=v1,v2,...")
    key = _check_key(key.strip(), where)
    try:
        raw_values = _split_values(rest)
    except SweepError as exc:
        raise SweepError(f"{where}: {exc}") from None
    values = []
    for i, raw in enumerate(raw_values):
        if not raw.strip():
            raise SweepError(f"{where}: value {i + 1} is empty")
        values.append(_yaml_value(raw, where))
    points = tuple((v,) for v in values)
    _distinct(points, where)
    return Axis(keys=(key,), points=points)


def parse_set_arg(text: str) -> tuple[str, Any]:
    """Parse one ``--set key.path=value`` item: one YAML value (commas included), applied to every run."""
    where = f"--set {text!r}"
    key, sep, raw = text.partition("=")
    if not sep:
        raise SweepError(f"{where}: expected key.path=value")
    key = _check_key(key.strip(), where)
    return key, _yaml_value(raw, where) if raw.strip() else None


def _yaml_value(raw: str, where: str) -> Any:
    """One override value, parsed as ``hybridsim run --set`` parses it (safe YAML, no tags)."""
    try:
        return parse_scalar(raw)
    except ScenarioError as exc:
        raise SweepError(f"{where}: value {raw.strip()!r} is not valid YAML ({exc})") from None


def _check_seed_count(count: int) -> None:
    from sim.limits import limit, over

    if count > limit("seeds"):
        shown = str(count) if count < 10**12 else f"about 10^{len(str(count)) - 1}"
        raise SweepError("seeds: " + over("seeds", count, f"{shown} seeds"))


def parse_seeds(spec: str | int | Sequence[int] | None) -> SeedSpec:
    """``3`` (int or "3") means three seeds from the scenario's seed; ``"1,2,3"`` / ``[1, 2, 3]`` are explicit.

    A single explicit seed is written with a trailing comma: ``"42,"``. ``None`` means one run per point at the
    scenario's own seed.
    """
    if spec is None:
        return SeedSpec()
    if isinstance(spec, bool):
        raise SweepError(f"seeds: expected a count or a list of seeds, got {spec!r}")
    if isinstance(spec, int):
        if spec < 1:
            raise SweepError(f"seeds: a count must be >= 1, got {spec}")
        _check_seed_count(spec)
        return SeedSpec(count=spec)
    if isinstance(spec, str):
        text = spec.strip()
        if "," not in text:
            if not re.fullmatch(r"\d+", text):
                raise SweepError(f"seeds: expected a count like 3 or a list like 1,2,3, got {spec!r}")
            return parse_seeds(int(text))
        items = [t.strip() for t in text.split(",")]
        if items[-1] == "":
            items.pop()
        if not items or not all(re.fullmatch(r"\d+", t) for t in items):
            raise SweepError(f"seeds: expected non-negative integers separated by commas, got {spec!r}")
        _check_seed_count(len(items))
        return parse_seeds([int(t) for t in items])
    values = list(spec)
    _check_seed_count(len(values))
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise SweepError(f"seeds: expected a non-empty list of non-negative integers, got {values!r}")
    if len(set(values)) != len(values):
        raise SweepError(f"seeds: seed values must be distinct, got {values!r}")
    return SeedSpec(count=None, values=tuple(values))


@dataclass(frozen=True)
class GridFile:
    """A parsed grid file; ``scenario`` is resolved relative to the file."""

    path: Path
    scenario: Path | None
    axes: tuple[Axis, ...]
    seeds: SeedSpec | None
    plots: tuple[PlotSpec, ...]
    fixed: tuple[tuple[str, Any], ...] = ()


def _value_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise SweepError(f"{where}: expected a non-empty list of values, got {yaml_text(value)}")
    return value


def _parse_zip(groups: Any, where: str) -> list[Axis]:
    if not isinstance(groups, list) or not groups:
        raise SweepError(f"{where}: 'zip' must be a list of mappings (key.path -> list of values)")
    axes = []
    for g, group in enumerate(groups):
        gwhere = f"{where}: zip[{g}]"
        if not isinstance(group, dict) or not group:
            raise SweepError(f"{gwhere}: expected a mapping key.path -> list of values")
        keys = tuple(_check_key(k, gwhere) for k in group)
        columns = [_value_list(group[k], f"{gwhere}.{k}") for k in keys]
        lengths = {k: len(c) for k, c in zip(keys, columns)}
        if len(set(lengths.values())) != 1:
            raise SweepError(f"{gwhere}: lists vary together and must have equal lengths, got {lengths}")
        points = tuple(zip(*columns))
        _distinct(points, gwhere)
        axes.append(Axis(keys=keys, points=points))
    return axes


def _parse_set(items: Any, where: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(items, dict) or not items:
        raise SweepError(f"{where}: 'set' must be a mapping key.path -> value, applied to every run")
    return tuple((_check_key(k, f"{where}: set"), v) for k, v in items.items())


def _parse_plots(items: Any, where: str) -> tuple[PlotSpec, ...]:
    if not isinstance(items, list):
        raise SweepError(f"{where}: 'plots' must be a list of {{name, x, metrics, hue}} mappings")
    plots = []
    for i, item in enumerate(items):
        pwhere = f"{where}: plots[{i}]"
        if not isinstance(item, dict):
            raise SweepError(f"{pwhere}: expected a mapping with name, x, metrics and optional hue")
        unknown = sorted(set(item) - {"name", "x", "metrics", "hue", "missing", "title"})
        if unknown:
            raise SweepError(f"{pwhere}: unknown key {unknown[0]!r} (valid: name, x, metrics, hue, missing, title)")
        title = item.get("title")
        if title is not None and not isinstance(title, str):
            raise SweepError(f"{pwhere}: 'title' must be a string, got {title!r}")
        name, x, metrics, hue = item.get("name"), item.get("x"), item.get("metrics"), item.get("hue")
        missing = item.get("missing")
        if missing is not None and (isinstance(missing, bool) or not isinstance(missing, (int, float))):
            raise SweepError(f"{pwhere}: 'missing' must be a number (the value of a metric a run's summary lacks)")
        if not isinstance(name, str) or not _PLOT_NAME.match(name):
            raise SweepError(f"{pwhere}: 'name' must be a file-name-safe string (letters, digits, . _ -), got {name!r}")
        if not isinstance(x, str):
            raise SweepError(f"{pwhere}: 'x' must be a grid key path, got {x!r}")
        if hue is not None and not isinstance(hue, str):
            raise SweepError(f"{pwhere}: 'hue' must be a grid key path, got {hue!r}")
        if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
            raise SweepError(f"{pwhere}: 'metrics' must be a non-empty list of summary metric names")
        plots.append(PlotSpec(name=name, x=x, metrics=tuple(metrics), hue=hue, missing=missing, title=title))
    names = [p.name for p in plots]
    if len(set(names)) != len(names):
        raise SweepError(f"{where}: plot names must be distinct, got {names}")
    return tuple(plots)


def is_grid_file(path: Path) -> bool:
    """A YAML mapping with a top-level ``scenario:`` key is a sweep (grid) file, not a scenario.

    Only a regular file is read, through the bounded loader (a FIFO, a device, a huge or malformed file is no
    grid file, and the scenario loader then gives its own error naming it)."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        data = load_yaml_file(path, "sweep file").data
    except (OSError, ScenarioError):
        return False
    return isinstance(data, dict) and "scenario" in data


def load_grid_file(path: Path | str) -> GridFile:
    """Read a grid file; axes keep the file's order (``zip`` groups sit where the ``zip`` key is)."""
    path = Path(path)
    where = str(path)
    try:
        data = load_yaml_file(path, "sweep file").data
    except ScenarioError as exc:
        raise SweepError(str(exc)) from None
    if not isinstance(data, dict):
        raise SweepError(
            f"{where}: a grid file is a mapping of key.path -> list of values (plus scenario, seeds, zip, plots)"
        )
    scenario = seeds = None
    plots: tuple[PlotSpec, ...] = ()
    fixed: tuple[tuple[str, Any], ...] = ()
    axes: list[Axis] = []
    for key, value in data.items():
        if key == "scenario":
            if not isinstance(value, str) or not value:
                raise SweepError(f"{where}: 'scenario' must be a path (relative to the grid file), got {value!r}")
            scenario = path.parent / value
        elif key == "seeds":
            try:
                seeds = parse_seeds(value)
            except SweepError as exc:
                raise SweepError(f"{where}: {exc}") from None
        elif key == "zip":
            axes.extend(_parse_zip(value, where))
        elif key == "plots":
            plots = _parse_plots(value, where)
        elif key == "set":
            fixed = _parse_set(value, where)
        else:
            _check_key(key, where)
            points = tuple((v,) for v in _value_list(value, f"{where}: {key}"))
            _distinct(points, f"{where}: {key}")
            axes.append(Axis(keys=(key,), points=points))
    return GridFile(path=path, scenario=scenario, axes=tuple(axes), seeds=seeds, plots=plots, fixed=fixed)


def _check_unique_keys(axes: Iterable[Axis], fixed: Iterable[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for axis in axes:
        for key in axis.keys:
            if key in seen:
                raise SweepError(f"grid key {key!r} is given more than once (each key path may vary in one place)")
            seen.add(key)
    for key, _ in fixed:
        if key in seen:
            raise SweepError(f"key {key!r} is both set for every run and a grid key; keep one")


def _check_plots(plots: Sequence[PlotSpec], keys: Sequence[str]) -> None:
    for plot in plots:
        for role, key in (("x", plot.x), ("hue", plot.hue)):
            if key is not None and key not in keys:
                raise SweepError(
                    f"plot {plot.name!r}: {role} {key!r} is not a grid key (grid keys: {', '.join(keys) or 'none'})"
                )
        if plot.hue is not None and plot.hue == plot.x:
            raise SweepError(f"plot {plot.name!r}: x and hue are both {plot.x!r}")


def build_sweep(
    scenario: Path | str,
    grids: Sequence[str] = (),
    grid_file: Path | str | None = None,
    seeds: str | int | Sequence[int] | None = None,
    overrides: Sequence[str] = (),
) -> SweepSpec:
    """The CLI's entry point: ``hybridsim sweep SCENARIO --grid ... [--grid-file F] [--seeds S] [--set k=v]``.

    ``scenario`` is a scenario file, or a grid file naming its base with ``scenario:`` (then ``grid_file``
    must not be given too). A grid file's ``scenario:`` is replaced by an explicit scenario argument.
    Axes: the grid file's first, then ``--grid`` items in order. ``seeds`` replaces the file's ``seeds:``.
    ``overrides`` (``--set key.path=value``) apply to every run, after the file's ``set:`` (same key: replaced).
    """
    scenario = Path(scenario)
    file: GridFile | None = None
    if is_grid_file(scenario):
        if grid_file is not None:
            raise SweepError(f"{scenario} is a grid file; pass either it or --grid-file, not both")
        file = load_grid_file(scenario)
        assert file.scenario is not None
        base = file.scenario
    else:
        base = scenario
        if grid_file is not None:
            file = load_grid_file(grid_file)
    if not base.is_file():
        raise SweepError(f"scenario file {base} does not exist")
    axes = list(file.axes if file else ()) + [parse_grid_arg(g) for g in grids]
    fixed_map = dict(file.fixed if file else ())
    fixed_map.update(parse_set_arg(item) for item in overrides)
    fixed = tuple(fixed_map.items())
    _check_unique_keys(axes, fixed)
    seed_spec = parse_seeds(seeds) if seeds is not None else (file.seeds if file and file.seeds else SeedSpec())
    plots = file.plots if file else ()
    _check_plots(plots, [k for a in axes for k in a.keys])
    return SweepSpec(scenario=base, axes=tuple(axes), seeds=seed_spec, plots=plots, fixed=fixed)


def _id_value(value: Any) -> str:
    return value if isinstance(value, str) else yaml_text(value)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def run_id_for(values: Sequence[tuple[str, Any]], seed: int) -> str:
    """``key=value__key=value__seed=N``; unsafe characters become ``-`` and then a hash of the exact text is appended."""
    raw = "__".join([f"{k}={_id_value(v)}" for k, v in values] + [f"seed={seed}"])
    safe = _UNSAFE_ID_CHARS.sub("-", raw)
    if safe != raw or len(safe) > _MAX_RUN_ID_LEN:
        safe = f"{safe[:_MAX_RUN_ID_LEN]}__{_digest(raw)}"
    return safe


def plan_runs(spec: SweepSpec, base_seed: int) -> list[RunSpec]:
    """Expand the sweep into runs: product of axes (first outermost) x seeds (innermost)."""
    from sim.limits import limit, over

    total = spec.seeds.count if spec.seeds.values is None else len(spec.seeds.values)
    for axis in spec.axes:
        total = (total or 0) * len(axis.points)
    if (total or 0) > limit("sweep_runs"):
        raise SweepError("grid: " + over("sweep_runs", total or 0, f"{total} runs (grid points x seeds)"))
    seeds = spec.seeds.resolve(base_seed)
    fixed = tuple(f"{k}={yaml_text(v)}" for k, v in spec.fixed)
    runs = []
    for combo in itertools.product(*(axis.points for axis in spec.axes)):
        values = tuple((k, v) for axis, point in zip(spec.axes, combo) for k, v in zip(axis.keys, point))
        grid_overrides = fixed + tuple(f"{k}={yaml_text(v)}" for k, v in values)
        for seed in seeds:
            runs.append(RunSpec(run_id_for(values, seed), values, seed, grid_overrides + (f"seed={seed}",)))
    folded: dict[str, str] = {}
    for run in runs:
        other = folded.setdefault(run.run_id.casefold(), run.run_id)
        if other != run.run_id:
            raise SweepError(f"run ids {other!r} and {run.run_id!r} differ only in case; rename a grid value")
    return runs
