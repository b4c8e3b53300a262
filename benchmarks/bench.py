"""Simulator speed benchmark (``make bench``).

First, the whole commands as a user meets them (:func:`whole_commands`): ``hybridsim`` as a subprocess of
the install that runs this script (``make bench`` uses the default ``make venv`` install), with
``PYTHONDONTWRITEBYTECODE=1`` and no ``PYTHONPATH``, CPU seconds (user + system of the process, from
``wait4``) and wall seconds, best of ``--repeat``, peak RSS: ``--help``, ``validate``, ``run`` of the two
1000-request step workloads (next to vLLM 0.33's bare scheduler loop on the same workloads, measured in
this same run), and ``run`` of the Mooncake conversation trace, full and at half rate (its first 1,200 s,
arrivals stretched 2x), in x real time. Every figure is checked against its target (docs/speed.md).

Then, labelled as such, the in-process figures:

* the two 1000-request step-clock workloads of ``benchmarks/scenarios/``
  (full attention only; full attention + Mamba + scripted connector): hybridsim
  (``load_scenario`` + ``run_scenario``, no plots, no bundle) next to the real
  vLLM 0.33 ``Scheduler`` loop on the same lowered workload
  (``sim.verify.vllm_side.run_script(record=False)``, model output fabricated
  as vLLM's scheduler tests do), the ratio, and whether both made identical
  decisions (``sim.verify`` decision traces, first difference);
* ``demo-pressure`` (synthetic chat on Nemotron-H 8B under block pressure);
* the Mooncake conversation replay (12,031 requests on Nemotron-H 8B / H100,
  time clock) in simulated seconds per wall second ("x real time"), its
  first 1,500 requests prefilled remotely (the ``remote`` connector,
  P/D disaggregation: docs/connectors.md, "Connector calls per step"), and the
  whole trace on an 8-instance cluster at 8x its arrival rate (:data:`CLUSTER8`,
  docs/cluster.md);
* peak resident memory of each workload.

Each measurement runs in its own subprocess, so peak RSS is per workload and
imports are not timed (vLLM's import takes about 10 s). Times are CPU seconds
of the process (``time.process_time``: on a shared machine wall time mostly
measures the neighbours), the best of ``--repeat`` runs; the wall time of that
run is printed too. Without vLLM the vLLM columns say so and only the
hybridsim figures are printed. ``--plain`` times hybridsim without its speed
layer (sim.accel, ``RunOptions(fast_paths=False)``), for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "benchmarks" / "scenarios"
STEP_WORKLOADS = ("step-fa-1000", "step-hybrid-connector-1000")
DEMO = ROOT / "scenarios" / "demo-pressure.yaml"
MOONCAKE = ROOT / "scenarios" / "mooncake-conversation-nemotron-overload.yaml"  # recorded rate: bench's history
MOONCAKE_REMOTE = ROOT / "scenarios" / "mooncake-conversation-nemotron-remote.yaml"
TRACE_FILE = "mooncake_conversation_trace.jsonl"


#: The Mooncake half-rate window: the trace's first 1,200 s, arrivals stretched 2x (2,400 simulated s).
HALF_RATE = ["workload.time_window=[0,1200]", "workload.time_scale=2"]

#: The cluster workload (issue 32): the whole trace on 8 instances behind prefix_aware (group_aware) routing,
#: arrivals at 8x the recorded rate (one instance's share is the recorded rate: the server is saturated).
CLUSTER8 = [
    "workload.time_scale=0.125",
    "cluster.instances=8",
    "cluster.router.policy=prefix_aware",
    "cluster.router.group_aware=true",
]

#: Whole-command targets (docs/speed.md, issue 35): CPU seconds, or x real time for the replays.
TARGETS = {
    "--help": ("cpu", 0.3),
    "validate": ("cpu", 0.3),
    "step-fa-1000": ("cpu", 0.5),
    "step-hybrid-connector-1000": ("cpu", 0.6),
    "mooncake full": ("x", 1500.0),
    "mooncake half rate": ("x", 1000.0),
}
#: Peak RSS target of the full Mooncake replay, MiB.
MOONCAKE_RSS_MB = 400.0


def _trace_dir() -> Path | None:
    """The shared traces folder: ``$HYBRIDSIM_TRACES``, else ``shared/traces`` next to the checkout or its parent."""
    candidates = [Path(os.environ["HYBRIDSIM_TRACES"])] if os.environ.get("HYBRIDSIM_TRACES") else []
    candidates += [ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces"]
    return next((c for c in candidates if (c / TRACE_FILE).is_file()), None)


def _peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --------------------------------------------------------------------------- workers (one per subprocess)


def work_hybridsim(path: str, overrides: list[str], repeat: int, plain: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario

    best: tuple[float, float] | None = None
    result = None
    for _ in range(repeat):
        result = None  # the last run's tables are dropped first, so the peak RSS is one run's
        start, cpu = time.perf_counter(), time.process_time()
        scenario = load_scenario(path, [*overrides, "outputs.plots=false"])
        result = run_scenario(scenario, None, options=RunOptions(write_plots=False, fast_paths=not plain))
        took = (time.process_time() - cpu, time.perf_counter() - start)
        best = took if best is None else min(best, took)
    assert best is not None and result is not None
    summary = result.summary
    return {
        "cpu_s": best[0],
        "wall_s": best[1],
        "clock": scenario.clock,
        "status": summary["status"],
        "requests": len(result.requests),
        "steps": int(summary["steps"]),
        # A cluster's engine steps over all instances (``steps`` is the busiest instance's).
        "engine_steps": int(summary.get("num_steps", summary["steps"])),
        "simulated_s": float(summary["simulated_s"]),
        "peak_rss_mb": _peak_rss_mb(),
    }


def work_vllm(path: str, repeat: int, check: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from sim.verify import vllm_side

    if not vllm_side.vllm_available():
        return {"missing": "vLLM is not importable (install it with `make vllm-env`)"}
    from sim.config import load_scenario
    from sim.verify.lower import lower

    # The scenario as one for the installed release (its decisions do not depend on it at default knobs).
    scenario = load_scenario(path, [f"vllm_version={vllm_side.installed_release()}"])
    script = lower(scenario)
    best: tuple[float, float] | None = None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        trace = vllm_side.run_script(script, record=False)
        took = (time.process_time() - cpu, time.perf_counter() - start)
        best = took if best is None else min(best, took)
    assert best is not None
    out = {"cpu_s": best[0], "wall_s": best[1], "steps": int(trace["num_steps"]), "peak_rss_mb": _peak_rss_mb()}
    if check:
        from sim.verify.run import verify_scenario

        verdict = verify_scenario(scenario)
        out["decisions"] = verdict.label
        if verdict.difference is not None:
            out["first_difference"] = str(verdict.difference)
    return out


# --------------------------------------------------------------------------- driver


#: The interpreter of the vLLM loop's workers (``--vllm-python``: vLLM may live in another environment).
VLLM_PYTHON = [sys.executable]


def _spawn(args: list[str]) -> dict:
    """Run one worker in a fresh interpreter; its last stdout line is the JSON result."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
    python = VLLM_PYTHON[0] if args[0] == "vllm" else sys.executable
    proc = subprocess.run([python, __file__, "--worker", *args], capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"worker failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


def _timed(argv: list[str]) -> dict:
    """One subprocess: CPU (user + system) and wall seconds, peak RSS in MiB, exit code, stderr's last line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    assert proc.stderr is not None
    err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
    proc.stderr.close()
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024.0,
        "exit": os.waitstatus_to_exitcode(status),
        "error": err[-1] if err else "",
    }


def _best(argv: list[str], repeat: int) -> dict:
    """The best CPU and the best wall of ``repeat`` runs (the highest peak RSS), or the first failure."""
    runs = [_timed(argv) for _ in range(repeat)]
    failed = [r for r in runs if r["exit"] != 0]
    if failed:
        return {"error": f"exit {failed[0]['exit']}: {failed[0]['error']}"}
    return {
        "cpu_s": min(r["cpu_s"] for r in runs),
        "wall_s": min(r["wall_s"] for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
    }


def _verdict(name: str, value: float) -> str:
    kind, target = TARGETS[name]
    if kind == "cpu":
        return f"{'met' if value <= target else 'MISSED'} (<= {target:g} s)"
    return f"{'met' if value >= target else 'MISSED'} (>= {target:,.0f}x)"


def whole_commands(repeat: int, with_vllm: bool, limit: int | None) -> None:
    """The whole-command table (module docstring)."""
    exe = Path(sys.executable).parent / "hybridsim"
    if not exe.is_file():
        print(f"whole commands: skipped ({exe} is missing: install hybridsim into this environment, `make venv`)")
        return
    print(
        f"Whole commands (`hybridsim` as a subprocess of {exe.parent.parent}, PYTHONDONTWRITEBYTECODE=1, "
        f"best of {repeat}; CPU = user + system s, wall s in parentheses)"
    )
    print(
        f"{'command':<30} {'CPU (wall)':>18} {'peak MiB':>9}  {'vLLM 0.33 loop CPU (wall)':>25} {'ratio':>7}  "
        f"{'x real time':>11}  target"
    )
    out = Path(tempfile.mkdtemp(prefix="hybridsim-bench-"))
    fa = str(SCENARIOS / "step-fa-1000.yaml")
    rows: list[tuple[str, list[str], str | None]] = [
        ("--help", [str(exe), "--help"], None),
        ("validate", [str(exe), "validate", fa], None),
    ]
    for name in STEP_WORKLOADS:
        path = str(SCENARIOS / f"{name}.yaml")
        rows.append((name, [str(exe), "run", path, "-o", str(out / name), "-q", "--force"], path))
    traces = _trace_dir()
    if traces is not None:
        base = [str(exe), "run", str(MOONCAKE), "-q", "--force", "--set", f"workload.trace.path={traces / TRACE_FILE}"]
        if limit is not None:
            base += ["--set", f"workload.limit={limit}"]
        rows.append(("mooncake full", [*base, "-o", str(out / "mc-full")], None))
        half = [arg for item in HALF_RATE for arg in ("--set", item)]
        rows.append(("mooncake half rate", [*base, *half, "-o", str(out / "mc-half")], None))
    for name, argv, vllm_path in rows:
        ours = _best(argv, repeat)
        if "error" in ours:
            print(f"{name:<30} failed: {ours['error']}", flush=True)
            continue
        theirs_text, ratio_text, x_text = f"{'':>25}", f"{'':>7}", f"{'-':>11}"
        verdict = _verdict(name, ours["cpu_s"])
        if vllm_path is not None and with_vllm:
            theirs = _spawn(["vllm", vllm_path, str(repeat), "no-check"])
            if "cpu_s" in theirs:
                theirs_text = f"{_fmt_s(theirs):>25}"
                ratio_text = f"{theirs['cpu_s'] / ours['cpu_s']:>6.1f}x"
            else:
                theirs_text = f"{(theirs.get('missing') or theirs.get('error') or '')[:25]:>25}"
        if name.startswith("mooncake"):
            bundle = out / ("mc-full" if name == "mooncake full" else "mc-half")
            simulated = float(json.loads((bundle / "summary.json").read_text())["simulated_s"])
            x_real = simulated / ours["cpu_s"]
            x_text = f"{x_real:>10,.0f}x"
            verdict = _verdict(name, x_real)
            if name == "mooncake full":
                rss_ok = "met" if ours["peak_rss_mb"] <= MOONCAKE_RSS_MB else "MISSED"
                verdict += f"; peak RSS {rss_ok} (<= {MOONCAKE_RSS_MB:.0f} MiB)"
        label = f"{name} (limit {limit})" if limit is not None and name.startswith("mooncake") else name
        print(
            f"{label:<30} {_fmt_s(ours):>18} {ours['peak_rss_mb']:>9.0f}  {theirs_text} {ratio_text}  {x_text}  {verdict}",
            flush=True,
        )
    if traces is None:
        print(f"mooncake: skipped (no {TRACE_FILE} in shared/traces; set HYBRIDSIM_TRACES)")
    print()


def _fmt_s(r: dict) -> str:
    """``CPU s (wall s)``."""
    return f"{r['cpu_s']:7.3f} s ({r['wall_s']:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="Replay only the first N Mooncake requests.")
    parser.add_argument("--only", choices=("step", "demo", "mooncake"), default=None, help="Run one part only.")
    parser.add_argument("--repeat", type=int, default=3, help="Runs per workload and replay (the best is kept).")
    parser.add_argument("--no-vllm", action="store_true", help="Skip the vLLM side.")
    parser.add_argument("--no-check", action="store_true", help="Skip the identical-decisions check.")
    parser.add_argument("--plain", action="store_true", help="Time hybridsim without its speed layer (sim.accel).")
    parser.add_argument(
        "--no-whole", action="store_true", help="Skip the whole-command figures (only the in-process ones)."
    )
    parser.add_argument("--whole-only", action="store_true", help="Print only the whole-command figures.")
    parser.add_argument(
        "--vllm-python", default=None, help="The Python whose environment has vLLM 0.33 (default: this one)."
    )
    parser.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, rest = args.worker[0], args.worker[1:]
        if kind == "hybridsim":
            path, repeat, plain, *overrides = rest
            result = work_hybridsim(path, overrides, int(repeat), plain == "plain")
        else:
            path, repeat, check = rest
            result = work_vllm(path, int(repeat), check == "check")
        print(json.dumps(result))
        return 0
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit: expected an integer >= 1, got {args.limit}")
    if args.repeat < 1:
        parser.error(f"--repeat: expected an integer >= 1, got {args.repeat}")
    plain = "plain" if args.plain else "fast"
    label = "hybridsim" + (" (plain)" if args.plain else "")
    if args.vllm_python:
        VLLM_PYTHON[0] = args.vllm_python
    if not args.no_whole:
        whole_commands(args.repeat, not args.no_vllm, args.limit)
        if args.whole_only:
            return 0
    print("In-process figures (one process per workload; imports, loading the scenario file's libraries and")
    print("writing the bundle not counted):")

    if args.only in (None, "step"):
        print(
            f"{'step-clock workload':<28} {'requests':>8} {'steps':>6}  {label + ' CPU (wall)':>24}  {'vLLM 0.33 loop CPU (wall)':>25}  "
            f"{'speed-up':>8}  {'decisions':<10} {'peak MiB (ours / vLLM)':>22}",
            flush=True,
        )
        for name in STEP_WORKLOADS:
            path = str(SCENARIOS / f"{name}.yaml")
            ours = _spawn(["hybridsim", path, str(args.repeat), plain])
            theirs = (
                {"missing": "skipped (--no-vllm)"}
                if args.no_vllm
                else _spawn(["vllm", path, str(args.repeat), "no-check" if args.no_check else "check"])
            )
            if "error" in ours:
                print(f"{name:<28} hybridsim {ours['error']}")
                continue
            head = f"{name:<28} {ours['requests']:>8} {ours['steps']:>6}  {_fmt_s(ours):>24}"
            if "cpu_s" not in theirs:
                print(
                    f"{head}  vLLM: {theirs.get('missing') or theirs.get('error')}  peak {ours['peak_rss_mb']:.0f} MiB"
                )
                continue
            ratio = theirs["cpu_s"] / ours["cpu_s"]
            decisions = theirs.get("decisions", "unchecked")
            print(
                f"{head}  {_fmt_s(theirs):>25}  {ratio:>7.1f}x  {decisions:<10} "
                f"{ours['peak_rss_mb']:>10.0f} / {theirs['peak_rss_mb']:<9.0f}",
                flush=True,
            )
            if theirs.get("first_difference"):
                print(f"  first difference: {theirs['first_difference']}")

    if args.only in (None, "demo", "mooncake"):
        print(
            f"\n{'replay':<34} {'status':<9} {'requests':>8} {'steps':>7} {'CPU (wall)':>20} {'simulated':>11} "
            f"{'x real time':>11} {'peak MiB':>9}",
            flush=True,
        )
    runs: list[tuple[str, Path, list[str]]] = []
    if args.only in (None, "demo"):
        runs.append(("demo-pressure", DEMO, []))
    if args.only in (None, "mooncake"):
        traces = _trace_dir()
        if traces is None:
            print(f"mooncake-conversation-nemotron: skipped (no {TRACE_FILE} in shared/traces; set HYBRIDSIM_TRACES)")
        else:
            overrides = [f"workload.trace.path={traces / TRACE_FILE}"]
            if args.limit is not None:
                overrides.append(f"workload.limit={args.limit}")
            runs.append(
                (
                    "mooncake-conversation-nemotron" + (f" (limit {args.limit})" if args.limit else ""),
                    MOONCAKE,
                    overrides,
                )
            )
            runs.append(("mooncake-...-remote (1,500 requests)", MOONCAKE_REMOTE, overrides[:1]))
            runs.append(("mooncake 8 instances, 8x rate", MOONCAKE, [*overrides, *CLUSTER8]))
    for name, path, overrides in runs:
        r = _spawn(["hybridsim", str(path), str(args.repeat), plain, *overrides])
        if "error" in r:
            print(f"{name:<34} {r['error']}")
            continue
        unit = "s" if r["clock"] == "time" else "steps"
        x_real = f"{r['simulated_s'] / r['cpu_s']:>10.0f}x" if unit == "s" else f"{'-':>11}"
        print(
            f"{name:<34} {r['status']:<9} {r['requests']:>8} {r['engine_steps']:>7} {_fmt_s(r):>20} "
            f"{r['simulated_s']:>9.0f} {unit:<1} {x_real} {r['peak_rss_mb']:>9.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
