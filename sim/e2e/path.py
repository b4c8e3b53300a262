"""One scenario through the whole user path, command by command (``hybridsim fuzz --e2e``).

:func:`walk` runs the ``hybridsim`` commands in-process (typer's runner: the real argument parsing, error
handling and exit codes, without a new interpreter per command) and checks, in order:

1. ``run SCENARIO`` writes a bundle whose manifest checks out, and exits with the code its status implies
   (:data:`sim.cli.exit_codes.RUN_STATUS_EXIT`); exit 2 (bad input) means the generator made a scenario
   hybridsim refuses: counted as *refused*, not a failure, when the message is one line;
2. ``show BUNDLE`` exits 0;
3. ``run BUNDLE/scenario.resolved.yaml`` and ``trace diff`` of the two bundles exits 0 (byte-identical
   tables);
4. ``explain BUNDLE REQUEST --attempt K`` on a random admission attempt exits 0; ``compare BUNDLE RERUN``,
   ``export kv-events BUNDLE`` (a cluster's: a random instance's) and, on a fifth of the walks, ``plot
   BUNDLE`` exit 0;
5. after a crash: ``crash.json`` has no ``replay_note``, ``replay BUNDLE/replay`` reproduces it (exit 0),
   ``shrink BUNDLE`` exits 0 and the shrunk scenario still crashes with the same reason; ``export vllm-test``
   of it exits 0 (or 7, not verifiable) and, with vLLM installed, the exported tests pass. A crashed cluster
   shrinks as its crashing instance alone: refused in one line (exit 2) with a shared tier or P/D roles,
   and allowed to be refused when the instance is not instance 0 (:mod:`sim.shrink.isolate`);
6. with vLLM installed and the scenario verifiable: ``verify SCENARIO`` says identical (exit 0); a cluster
   instance by instance, or not verifiable (exit 7) when it crashed.

A check that fails is a :class:`Failure`: the command line, its exit code and the tail of its output.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from typer.testing import CliRunner, Result

from sim.cli.app import app
from sim.cli.exit_codes import RUN_STATUS_EXIT, ExitCode
from sim.interrupts import reraise_since, signals_taken

#: Share of the walks that redraw the bundle's plots (``plot``; the runs themselves draw none).
PLOT_SHARE = 0.2


@dataclass
class Failure:
    """A command of the user path that did not do what it should."""

    command: list[str]
    exit_code: int | None
    what: str
    output: str = ""

    def describe(self) -> str:
        line = " ".join(["hybridsim", *self.command])
        return f"{self.what}\n  $ {line}\n  exit code: {self.exit_code}\n" + "".join(
            f"  | {text}\n" for text in self.output.splitlines()[-40:]
        )


@dataclass
class Walk:
    """What one scenario's walk did: its status, whether it was refused, the checks run and the failures."""

    status: str = ""
    refused: str = ""
    crashed: bool = False
    checks: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


class _Cli:
    """The ``hybridsim`` command, invoked in-process."""

    def __init__(self) -> None:
        import sim.cli  # noqa: F401  (registers every command on the app)

        self.runner = CliRunner(env={"COLUMNS": "200"})

    def __call__(self, *args: str | Path) -> tuple[list[str], Result]:
        """Run one command; a SIGINT/SIGTERM that it took (and turned into exit 130) stops the walk too."""
        argv = [str(a) for a in args]
        before = signals_taken()
        result = self.runner.invoke(app, argv, prog_name="hybridsim")
        reraise_since(before)
        return argv, result


def _output(result: Result) -> str:
    text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        text += "".join(traceback.format_exception(result.exception))
    return text


def walk(scenario: Path, work: Path, rng: np.random.Generator, vllm: bool) -> Walk:
    """Take ``scenario`` through the user path in ``work`` (see the module docstring)."""
    cli = _Cli()
    out = Walk()

    def check(name: str, argv: list[str], result: Result, expected: set[int] | int = 0, what: str = "") -> bool:
        out.checks.append(name)
        codes = {expected} if isinstance(expected, int) else expected
        unhandled = result.exception is not None and not isinstance(result.exception, SystemExit)
        if result.exit_code in codes and not unhandled:
            return True
        reason = what or f"{name}: exit {result.exit_code}, expected {' or '.join(map(str, sorted(codes)))}"
        out.failures.append(Failure(argv, result.exit_code, reason, _output(result)))
        return False

    bundle = work / "run"
    argv, res = cli("run", scenario, "-o", bundle, "--no-plots", "-q")
    if res.exit_code == ExitCode.BAD_INPUT and not (bundle / "summary.json").exists():
        lines = res.output.strip().splitlines()
        if len(lines) == 1 and res.exception is None or isinstance(res.exception, SystemExit):
            out.refused = lines[0] if lines else "(no message)"
            return out
    summary_path = bundle / "summary.json"
    if not summary_path.is_file():
        out.failures.append(Failure(argv, res.exit_code, "run: no summary.json written", _output(res)))
        return out
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    out.status = str(summary.get("status"))
    expected = RUN_STATUS_EXIT.get(out.status)
    check("run", argv, res, int(expected) if expected is not None else -1)
    from sim.trace.atomic import check_bundle

    bundle_check = check_bundle(bundle)
    out.checks.append("manifest")
    if not bundle_check.ok:
        out.failures.append(Failure(argv, res.exit_code, f"manifest: {bundle_check.describe()}"))
        return out

    check("show", *cli("show", bundle))

    rerun = work / "rerun"
    argv, res = cli("run", bundle / "scenario.resolved.yaml", "-o", rerun, "--no-plots", "-q")
    rerun_ok = check("rerun", argv, res, int(expected) if expected is not None else -1)
    if rerun_ok:
        check("trace diff", *cli("trace", "diff", bundle, rerun, "--allow-partial"))

    _explain(cli, bundle, rng, check)
    if rerun_ok:
        check("compare", *cli("compare", bundle, rerun))
    _export_kv_events(cli, bundle, work, rng, check)
    if rng.random() < PLOT_SHARE:
        check("plot", *cli("plot", bundle))

    crash_file = bundle / "crash.json"
    if crash_file.is_file():
        out.crashed = True
        _after_crash(cli, bundle, work, crash_file, vllm, check, out)

    if vllm:
        _verify(cli, scenario, out, check)
    return out


def _verify(cli: _Cli, scenario: Path, out: Walk, check: Any) -> None:
    """``verify`` says identical when the scenario is verifiable; a cluster that crashed says it is not (exit 7:
    a crash stops every instance at once, which no single vLLM engine does)."""
    from sim.config import load_scenario
    from sim.verify.lower import not_verifiable_reason

    loaded = load_scenario(scenario)
    if loaded.cluster is None:
        if not_verifiable_reason(loaded) is None:
            check("verify", *cli("verify", scenario), what="verify: hybridsim and vLLM differ")
        return
    from sim.verify.cluster import cluster_not_verifiable_reason

    if cluster_not_verifiable_reason(loaded) is not None:
        return
    expected = int(ExitCode.NOT_VERIFIABLE) if out.crashed else 0
    check("verify", *cli("verify", scenario), expected, what=f"verify: expected exit {expected} on this cluster")


def _export_kv_events(cli: _Cli, bundle: Path, work: Path, rng: np.random.Generator, check: Any) -> None:
    """``export kv-events`` of the bundle (a cluster's: one random instance's)."""
    from sim.trace.bundle import load_result

    cluster = load_result(bundle).summary.get("cluster")
    args: list[str | Path] = ["export", "kv-events", bundle, "-o", work / "kv_events.msgpack"]
    if cluster is not None:
        args += ["--instance", str(int(rng.integers(int(cluster["instances"]))))]
    check("export kv-events", *cli(*args))


def _explain(cli: _Cli, bundle: Path, rng: np.random.Generator, check: Any) -> None:
    from sim.trace.bundle import load_result

    admissions = load_result(bundle).admissions
    if admissions is None or not len(admissions):
        return
    row = int(rng.integers(len(admissions)))
    rid = str(admissions["request_id"].iloc[row])
    attempt = int((admissions["request_id"].iloc[: row + 1] == rid).sum())
    check("explain", *cli("explain", bundle, rid, "--attempt", str(attempt)))


def _after_crash(cli: _Cli, bundle: Path, work: Path, crash_file: Path, vllm: bool, check: Any, out: Walk) -> None:
    crash = json.loads(crash_file.read_text(encoding="utf-8"))
    if "replay_note" in crash:
        out.failures.append(Failure([], None, f"crash.json: {crash['replay_note']}"))
    else:
        check("replay", *cli("replay", bundle / "replay", "-o", work / "replayed"))
    small = work / "small.yaml"
    argv, res = cli("shrink", bundle, "-o", small, "-q")
    refusal = _cluster_shrink_refusal(bundle, crash)
    if refusal is not None:  # documented: exit 2, one line naming why (sim.shrink.isolate)
        check("shrink", argv, res, {int(ExitCode.BAD_INPUT)} | refusal)
        said = res.output.strip().splitlines()
        if res.exit_code == ExitCode.BAD_INPUT and not (said and said[-1].startswith("error: cluster:")):
            out.failures.append(Failure(argv, res.exit_code, "shrink: a refusal is one error line", _output(res)))
        if res.exit_code != 0:
            return
    elif not check("shrink", argv, res):
        return
    shrunk_run = work / "shrunk-run"
    argv, res = cli("run", small, "-o", shrunk_run, "--no-plots", "-q")
    shrunk_crash = shrunk_run / "crash.json"
    out.checks.append("shrunk crash")
    if not shrunk_crash.is_file():
        out.failures.append(Failure(argv, res.exit_code, "shrink: the shrunk scenario does not crash", _output(res)))
        return
    reason = json.loads(shrunk_crash.read_text(encoding="utf-8")).get("reason")
    if reason != crash.get("reason"):
        out.failures.append(
            Failure(
                argv, res.exit_code, f"shrink: the shrunk scenario crashes with {reason!r}, not {crash['reason']!r}"
            )
        )
    from sim.config import load_scenario
    from sim.verify.lower import not_verifiable_reason

    exported = work / "test_exported.py"
    argv, res = cli("export", "vllm-test", small, "-o", exported)
    if not_verifiable_reason(load_scenario(small)) is not None:
        # Documented: exit 2 naming why vLLM cannot run it (a what-if policy, a connector without a counterpart).
        check("export", argv, res, int(ExitCode.BAD_INPUT))
        return
    if not check("export", argv, res) or not vllm:
        return
    problem = _run_exported(exported)
    out.checks.append("exported test")
    if problem:
        out.failures.append(Failure(["export", "vllm-test", str(small)], 0, f"exported test: {problem}"))


def _cluster_shrink_refusal(bundle: Path, crash: dict[str, Any]) -> set[int] | None:
    """For a crashed cluster, the other exit codes ``shrink`` may give besides 2 (a refusal): ``None`` for one
    instance (shrink must work), ``set()`` with a shared tier or P/D roles (refused), ``{0}`` when the crashing
    instance is not instance 0 (alone it may not crash: its connector's random draws differ)."""
    from sim.config import load_scenario

    cluster = load_scenario(bundle / "scenario.resolved.yaml").cluster
    if cluster is None:
        return None
    if cluster.tier is not None or cluster.disaggregated:
        return set()
    return {0} if crash.get("instance", 0) != 0 else None


def _run_exported(path: Path) -> str:
    """Run the exported module's tests in this process (vLLM is imported once); '' when they pass."""
    name = f"_hybridsim_exported_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return "cannot import the exported file"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        for attr in sorted(dir(module)):
            if attr.startswith("test_") and callable(getattr(module, attr)):
                getattr(module, attr)()
    except Exception as exc:  # any failure of the exported test is the finding
        return f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        sys.modules.pop(name, None)
    return ""
