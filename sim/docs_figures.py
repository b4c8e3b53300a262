"""Every figure the docs quote comes from a run: ``make docs-figures`` reruns the scenarios and rewrites the
marked regions; ``--check`` rewrites nothing and exits 1 naming each region that differs.

A region is the text between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` on a docs page (or the
README); :data:`FIGURES` says which runs make it and how its text is rendered from their ``summary.json``.
Small figures run in seconds and the test suite checks them (``tests/test_docs_figures.py``). Large ones (the
Mooncake replays, minutes of CPU each, and a trace that lives outside the repository) run only with
``--large``; the test checks them when ``HYBRIDSIM_DOCS_FIGURES=large`` is set. A figure may also redraw an
image of the docs; ``--check`` compares the text only (image bytes depend on the matplotlib build).

    python -m sim.docs_figures [--check] [--large] [--only NAME]... [--root DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sim.trace.output import write_file

#: ``HYBRIDSIM_TRACES``: the folder holding the public traces, for the large figures (default: the scenarios'
#: own relative paths, ``../shared/traces`` from the checkout).
TRACES_ENV = "HYBRIDSIM_TRACES"


@dataclass(frozen=True)
class RunSpec:
    """One run: a scenario file (relative to the repository root) and ``--set`` overrides."""

    scenario: str
    overrides: tuple[str, ...] = ()
    #: The trace file a large run reads (``workload.trace.path`` is pointed at ``$HYBRIDSIM_TRACES/<trace>``).
    trace: str | None = None


class Runs:
    """Runs each :class:`RunSpec` once (in this process, no bundle unless an image is wanted) and keeps its
    summary; figures that share a run share its result."""

    def __init__(self, root: Path, traces: Path | None, log: Callable[[str], None]):
        self.root, self.traces, self.log = root, traces, log
        self._summaries: dict[RunSpec, dict[str, Any]] = {}

    def _overrides(self, spec: RunSpec) -> list[str]:
        extra = []
        if spec.trace is not None and self.traces is not None:
            extra.append(f"workload.trace.path={self.traces / spec.trace}")
        return [*spec.overrides, *extra]

    def summary(self, spec: RunSpec) -> dict[str, Any]:
        if spec not in self._summaries:
            from sim.api import RunOptions, run_scenario
            from sim.config import load_scenario

            scenario = load_scenario(self.root / spec.scenario, self._overrides(spec))
            self.log(f"running {spec.scenario} {' '.join(spec.overrides)}".rstrip())
            result = run_scenario(scenario, None, options=RunOptions(write_plots=False))
            self._summaries[spec] = result.summary
        return self._summaries[spec]

    def plots(self, spec: RunSpec, out: Path) -> Path:
        """Run ``spec`` with its bundle and plots written under ``out``; the plots folder."""
        from sim.api import RunOptions, run_scenario
        from sim.config import load_scenario

        scenario = load_scenario(self.root / spec.scenario, self._overrides(spec))
        result = run_scenario(scenario, out / "bundle", options=RunOptions(write_plots=True))
        self._summaries.setdefault(spec, result.summary)
        return out / "bundle" / "plots"

    def missing_trace(self, specs: Sequence[RunSpec]) -> str | None:
        """The first trace a run needs that is not on this machine (a large figure is then skipped)."""
        for spec in specs:
            if spec.trace is None:
                continue
            path = (self.traces / spec.trace) if self.traces is not None else None
            if path is None:
                from sim.config import load_scenario

                trace = load_scenario(self.root / spec.scenario, list(spec.overrides)).workload.trace
                path = Path(trace.path) if trace is not None else None
            if path is None or not path.is_file():
                return str(path or spec.trace)
        return None


# ------------------------------------------------------------------ formatting


def lookup(summary: dict[str, Any], key: str) -> Any:
    """``summary['a']['b']`` for ``a.b``; ``None`` where a level is missing."""
    node: Any = summary
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def seconds(value: Any) -> str:
    if value is None:
        return "–"
    v = float(value)
    return f"{v:,.0f} s" if abs(v) >= 100 else f"{v:.2f} s"


def percent(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.2f} %"


def count(value: Any) -> str:
    return "–" if value is None else f"{int(value):,}"


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    fmt: Callable[[Any], str]


def table(runs: Runs, rows: Sequence[tuple[str, RunSpec]], columns: Sequence[Column]) -> str:
    """A markdown table: one row per run, one column per summary key."""
    lines = ["| run | " + " | ".join(c.header for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, spec in rows:
        summary = runs.summary(spec)
        lines.append(f"| {label} | " + " | ".join(c.fmt(lookup(summary, c.key)) for c in columns) + " |")
    return "\n".join(lines)


def change(before: Any, after: Any) -> str:
    """``after`` relative to ``before`` in words: ``12.9 % lower`` / ``3.1 % higher`` / ``unchanged``."""
    if before is None or after is None or float(before) == 0:
        return "–"
    ratio = float(after) / float(before) - 1
    if abs(ratio) < 0.0005:
        return "unchanged"
    return f"{100 * abs(ratio):.1f} % {'lower' if ratio < 0 else 'higher'}"


# ------------------------------------------------------------------ the figures


@dataclass(frozen=True)
class Figure:
    """One marked region: where it is, whether it is large, which runs it needs and how it is rendered."""

    name: str
    page: str
    large: bool
    runs: tuple[RunSpec, ...]
    render: Callable[[Runs], str]
    #: ``(run, plot file in its plots/ folder, image path in the repository)`` redrawn on a write.
    images: tuple[tuple[RunSpec, str, str], ...] = field(default=())


DEMO = RunSpec("scenarios/demo-pressure.yaml")
DEMO_RECONCILED = RunSpec(
    "scenarios/demo-pressure.yaml", ("cache.num_blocks=120", "scheduler.prefix_policy=reconciled")
)

_TRACE = "mooncake_conversation_trace.jsonl"
MOONCAKE_HALF = RunSpec("scenarios/mooncake-conversation-nemotron.yaml", trace=_TRACE)
MOONCAKE_HALF_OFFLOAD = RunSpec(
    "scenarios/mooncake-conversation-nemotron.yaml", ("connector.type=offload", "connector.capacity_gb=200"), _TRACE
)
MOONCAKE_FULL = RunSpec("scenarios/mooncake-conversation-nemotron-overload.yaml", trace=_TRACE)
# Open replay is the plain trace replay (sessions in open mode schedule the same, they only add session metrics).
CLOSED = "scenarios/mooncake-conversation-nemotron-closed.yaml"
MOONCAKE_HALF_CLOSED = RunSpec(CLOSED, (), _TRACE)
MOONCAKE_FULL_CLOSED = RunSpec(CLOSED, ("workload.time_scale=1.0",), _TRACE)

_LATENCY = (
    Column("TTFT p50", "latency_s.ttft.p50", seconds),
    Column("TTFT p95", "latency_s.ttft.p95", seconds),
)


def _demo(runs: Runs) -> str:
    return table(
        runs,
        [
            ("`run scenarios/demo-pressure.yaml` (pr48425)", DEMO),
            ("`--set cache.num_blocks=120 --set scheduler.prefix_policy=reconciled`", DEMO_RECONCILED),
        ],
        [
            *_LATENCY,
            Column("local hit rate", "cache.local_rate", percent),
            Column("external rate", "cache.external_rate", percent),
            Column("evictions", "evictions.total", count),
            Column("tokens recomputed", "admissions.tokens_recomputed", count),
            Column("preemptions", "requests.preemptions", count),
        ],
    )


def _mooncake_offload(runs: Runs) -> str:
    rows = [
        ("no connector (as written)", MOONCAKE_HALF),
        ("`--set connector.type=offload --set connector.capacity_gb=200`", MOONCAKE_HALF_OFFLOAD),
    ]
    text = table(
        runs,
        rows,
        [
            *_LATENCY,
            Column("local hit rate", "cache.local_rate", percent),
            Column("external rate", "cache.external_rate", percent),
            Column("preemptions", "requests.preemptions", count),
            Column("simulated", "simulated_s", seconds),
        ],
    )
    before = lookup(runs.summary(MOONCAKE_HALF), "latency_s.ttft.p50")
    after = lookup(runs.summary(MOONCAKE_HALF_OFFLOAD), "latency_s.ttft.p50")
    return text + f"\n\nWith the offload tier, TTFT p50 is {change(before, after)}."


def _mooncake_load(runs: Runs) -> str:
    return table(
        runs,
        [
            ("half rate (`time_scale: 2`), open", MOONCAKE_HALF),
            ("half rate, closed", MOONCAKE_HALF_CLOSED),
            ("recorded rate (`time_scale: 1`), open", MOONCAKE_FULL),
            ("recorded rate, closed", MOONCAKE_FULL_CLOSED),
        ],
        [
            *_LATENCY,
            Column("local hit rate", "cache.local_rate", percent),
            Column("preemptions", "requests.preemptions", count),
            Column("simulated", "simulated_s", seconds),
        ],
    )


def _mooncake_overload(runs: Runs) -> str:
    return table(
        runs,
        [("`mooncake-conversation-nemotron-overload.yaml`", MOONCAKE_FULL)],
        [
            *_LATENCY,
            Column("local hit rate", "cache.local_rate", percent),
            Column("Mamba hit rate (g0)", "cache.hit_rate.g0", percent),
            Column("preemptions", "requests.preemptions", count),
            Column("simulated", "simulated_s", seconds),
        ],
    )


_MOONCAKE_HALF_FILE = "scenarios/mooncake-conversation-nemotron.yaml"
#: The routing study (docs/cluster.md): the half-rate Mooncake replay on 4 and 8 instances, per router.
ROUTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("round_robin", ("cluster.router.policy=round_robin",)),
    ("least_loaded", ("cluster.router.policy=least_loaded",)),
    ("prefix_aware (FA only)", ("cluster.router.policy=prefix_aware",)),
    ("prefix_aware, group_aware", ("cluster.router.policy=prefix_aware", "cluster.router.group_aware=true")),
)
CLUSTER_SIZES = (4, 8)


def cluster_run(instances: int, router: tuple[str, ...]) -> RunSpec:
    return RunSpec(_MOONCAKE_HALF_FILE, (f"cluster.instances={instances}", *router), _TRACE)


CLUSTER_RUNS = tuple(cluster_run(n, overrides) for n in CLUSTER_SIZES for _, overrides in ROUTERS)
#: The run whose router panel the page shows.
CLUSTER_FIGURE_RUN = cluster_run(8, ROUTERS[-1][1])


def per_instance(key: str) -> Callable[[Any], str]:
    """A column of one value per instance (``instances[i].<key>``), joined with ``/``."""

    def fmt(instances: Any) -> str:
        if not isinstance(instances, list):
            return "–"
        return " / ".join(count(lookup(i, key)) for i in instances)

    return fmt


def _cluster_routing(runs: Runs) -> str:
    rows = [(f"{n} × {label}", cluster_run(n, overrides)) for n in CLUSTER_SIZES for label, overrides in ROUTERS]
    text = table(
        runs,
        rows,
        [
            Column("usable (local) hit rate", "cache.local_rate", percent),
            Column("FA-only hit rate", "cache.full_attention_hit_rate", percent),
            *_LATENCY,
            Column("FA-deeper divergences", "admissions.divergences.fa_deeper", count),
            Column("per instance", "instances", per_instance("admissions.divergences.fa_deeper")),
            Column("#48425 fallbacks per instance", "instances", per_instance("admissions.fallbacks")),
            Column("routed per instance", "cluster.routed", lambda v: " / ".join(map(count, v)) if v else "–"),
        ],
    )
    lines = [text, ""]
    for n in CLUSTER_SIZES:
        base = lookup(runs.summary(cluster_run(n, ROUTERS[0][1])), "cache.local_rate")
        aware = lookup(runs.summary(cluster_run(n, ROUTERS[-1][1])), "cache.local_rate")
        fa_only = runs.summary(cluster_run(n, ROUTERS[2][1]))
        ratio = "–" if not base or aware is None else f"{float(aware) / float(base):.2f}x"
        lines.append(
            f"- {n} instances: `prefix_aware` with `group_aware` reaches {ratio} `round_robin`'s usable local hit "
            f"rate; FA-only `prefix_aware` finds FA prefixes on {percent(lookup(fa_only, 'cache.full_attention_hit_rate'))}"
            f" of prompt tokens and {percent(lookup(fa_only, 'cache.local_rate'))} usable."
        )
    return "\n".join(lines)


FIGURES: tuple[Figure, ...] = (
    Figure(
        "demo",
        "README.md",
        False,
        (DEMO, DEMO_RECONCILED),
        _demo,
        images=((DEMO, "divergence.png", "docs/images/demo-divergence.png"),),
    ),
    Figure("mooncake-offload", "docs/workloads.md", True, (MOONCAKE_HALF, MOONCAKE_HALF_OFFLOAD), _mooncake_offload),
    Figure("mooncake-overload", "docs/workloads.md", True, (MOONCAKE_FULL,), _mooncake_overload),
    Figure(
        "mooncake-load",
        "docs/workloads.md",
        True,
        (MOONCAKE_HALF, MOONCAKE_HALF_CLOSED, MOONCAKE_FULL, MOONCAKE_FULL_CLOSED),
        _mooncake_load,
    ),
    Figure(
        "cluster-routing",
        "docs/cluster.md",
        True,
        CLUSTER_RUNS,
        _cluster_routing,
        images=((CLUSTER_FIGURE_RUN, "router.png", "docs/images/cluster-router.png"),),
    ),
)


# ------------------------------------------------------------------ regions


def region_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{re.escape(name)} -->\n)(.*?)(<!-- /figures:{re.escape(name)} -->)", re.S)


def quoted(text: str, name: str) -> str | None:
    """The text of region ``name`` on a page (without its markers), ``None`` if the page has no such region."""
    match = region_pattern(name).search(text)
    return match.group(2).strip("\n") if match else None


def with_region(text: str, name: str, body: str) -> str:
    pattern = region_pattern(name)
    if not pattern.search(text):
        raise ValueError(f"no <!-- figures:{name} --> region")
    return pattern.sub(lambda m: m.group(1) + body.strip("\n") + "\n" + m.group(3), text, count=1)


def marked_regions(root: Path) -> dict[str, str]:
    """Every region name on the README and the docs pages -> its page (relative)."""
    out: dict[str, str] = {}
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for name in re.findall(r"<!-- figures:([\w.-]+) -->", page.read_text(encoding="utf-8")):
            out[name] = str(page.relative_to(root))
    return out


@dataclass
class Outcome:
    written: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def generate(
    root: Path,
    *,
    check: bool,
    large: bool,
    only: Sequence[str] = (),
    traces: Path | None = None,
    log: Callable[[str], None] = print,
) -> Outcome:
    """Render the figures (small ones, and the large ones with ``large``) and write or check their regions."""
    runs = Runs(root, traces, log)
    outcome = Outcome()
    for figure in FIGURES:
        if only and figure.name not in only:
            continue
        if figure.large and not large:
            outcome.skipped.append(f"{figure.name} (large: --large)")
            continue
        if figure.large and (missing := runs.missing_trace(figure.runs)):
            outcome.skipped.append(f"{figure.name} (no trace {missing}; set {TRACES_ENV})")
            continue
        page = root / figure.page
        raw = page.read_bytes()
        text = raw.decode("utf-8")
        body = figure.render(runs)
        if check:
            if quoted(text, figure.name) != body.strip("\n"):
                outcome.stale.append(f"{figure.page}: figures:{figure.name}")
            continue
        # The page is hand-written: only its marked region changes, and only if it is still what was read.
        known = hashlib.sha256(raw).hexdigest()
        write_file(page, with_region(text, figure.name, body), known_sha256=known, stamped=False)
        outcome.written.append(f"{figure.page}: figures:{figure.name}")
        for spec, plot, image in figure.images:
            with tempfile.TemporaryDirectory() as tmp:
                drawn = (runs.plots(spec, Path(tmp)) / plot).read_bytes()  # stamped by the plot writer
            write_file(root / image, drawn, stamped=False)
            outcome.written.append(image)
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    import os

    parser = argparse.ArgumentParser(prog="python -m sim.docs_figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Rewrite nothing; exit 1 if a quoted figure differs.")
    parser.add_argument("--large", action="store_true", help="Also the large figures (Mooncake replays: minutes).")
    parser.add_argument("--only", action="append", default=[], help="Only this figure (repeatable).")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="Repository root (default: the current dir).")
    args = parser.parse_args(argv)
    env = os.environ.get(TRACES_ENV)
    unknown = sorted(set(args.only) - {f.name for f in FIGURES})
    if unknown:
        print(f"error: unknown figure(s) {unknown} (valid: {', '.join(f.name for f in FIGURES)})", file=sys.stderr)
        return 2
    outcome = generate(args.root, check=args.check, large=args.large, only=args.only, traces=Path(env) if env else None)
    for line in outcome.written:
        print(f"wrote {line}")
    for line in outcome.skipped:
        print(f"skipped {line}")
    for line in outcome.stale:
        print(f"stale: {line} (run make docs-figures)", file=sys.stderr)
    return 1 if outcome.stale else 0


if __name__ == "__main__":
    sys.exit(main())
